#pragma once
// Softmax cross-entropy over the vocabulary, per position:
//   loss_i = lse_i - logits_i[target_i],  lse_i = max_i + log(sum_j exp(logits_ij - max_i))
// Written as row statistics so that the vocabulary can be split over tensor-parallel
// ranks (Megatron's vocabulary-parallel cross-entropy): each rank computes them on its
// shard of the logits, and the group combines them (max, then sums) before the loss.
#include <cstring>
#include <stdexcept>

#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/fast_math.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

// One team per row.
template <class Exec>
struct CrossEntropyRowMax {
  Vec<Exec> rowmax;
  ConstMat<Exec> logits;
  std::int64_t V;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    const float mx = team_max(team, V, [&](std::int64_t j) { return logits(i, j); });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { rowmax(i) = mx; });
  }
};

// rowmax: (N) = max_j logits(i, j); logits: (N, V)
template <class Exec>
void cross_entropy_row_max(const Exec& exec, const Vec<Exec>& rowmax, const ConstMat<Exec>& logits) {
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  Kokkos::parallel_for("lamina::cross_entropy_row_max", Teams<Exec>(exec, N, Kokkos::AUTO),
                       CrossEntropyRowMax<Exec>{rowmax, logits, V});
}

// One team per row.
template <class Exec>
struct CrossEntropyRowSumexp {
  Vec<Exec> sumexp;
  ConstMat<Exec> logits;
  ConstVec<Exec> rowmax;
  std::int64_t V;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    const float mx = rowmax(i);
    const float s = team_sum(team, V, [&](std::int64_t j) { return fast_exp(logits(i, j) - mx); });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { sumexp(i) = s; });
  }
};

// sumexp: (N) = sum_j exp(logits(i, j) - rowmax(i)), with the group's row maximum
template <class Exec>
void cross_entropy_row_sumexp(const Exec& exec, const Vec<Exec>& sumexp, const ConstMat<Exec>& logits,
                              const ConstVec<Exec>& rowmax) {
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  Kokkos::parallel_for("lamina::cross_entropy_row_sumexp", Teams<Exec>(exec, N, Kokkos::AUTO),
                       CrossEntropyRowSumexp<Exec>{sumexp, logits, rowmax, V});
}

// One team per row: its maximum, then its sum of exponentials while the row is still in
// cache (the two kernels above read the logits from memory twice).
template <class Exec>
struct CrossEntropyRowStats {
  Vec<Exec> rowmax, sumexp;
  ConstMat<Exec> logits;
  std::int64_t V;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    const float mx = team_max(team, V, [&](std::int64_t j) { return logits(i, j); });
    const float s = team_sum(team, V, [&](std::int64_t j) { return fast_exp(logits(i, j) - mx); });
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      rowmax(i) = mx;
      sumexp(i) = s;
    });
  }
};

// rowmax and sumexp of whole rows in one pass over the logits, the same values as
// cross_entropy_row_max and cross_entropy_row_sumexp: for logits no other rank shares (a
// vocabulary split over ranks needs the group's maximum before the sums).
template <class Exec>
void cross_entropy_row_stats(const Exec& exec, const Vec<Exec>& rowmax, const Vec<Exec>& sumexp,
                             const ConstMat<Exec>& logits) {
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  Kokkos::parallel_for("lamina::cross_entropy_row_stats", Teams<Exec>(exec, N, Kokkos::AUTO),
                       CrossEntropyRowStats<Exec>{rowmax, sumexp, logits, V});
}

template <class Exec>
struct CrossEntropyTargetLogit {
  Vec<Exec> target;
  ConstMat<Exec> logits;
  Tokens<Exec> targets;
  std::int64_t vocab_begin, V;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t j = targets(i) - vocab_begin;
    target(i) = (j >= 0 && j < V) ? logits(i, j) : 0.0f;
  }
};

// target: (N) = logits(i, targets(i) - vocab_begin), or 0 when the target id is not in
// this rank's columns [vocab_begin, vocab_begin + V)
template <class Exec>
void cross_entropy_target_logit(const Exec& exec, const Vec<Exec>& target, const ConstMat<Exec>& logits,
                                const Tokens<Exec>& targets, std::int64_t vocab_begin) {
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  Kokkos::parallel_for("lamina::cross_entropy_target_logit", Range<Exec>(exec, 0, N),
                       CrossEntropyTargetLogit<Exec>{target, logits, targets, vocab_begin, V});
}

template <class Exec>
struct CrossEntropyForward {
  Vec<Exec> losses, lse;
  ConstVec<Exec> rowmax, sumexp, target;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const float l = rowmax(i) + math::log(sumexp(i));
    lse(i) = l;
    losses(i) = l - target(i);
  }
};

// losses, lse: (N) from the combined statistics
template <class Exec>
void cross_entropy_forward(const Exec& exec, const Vec<Exec>& losses, const Vec<Exec>& lse,
                           const ConstVec<Exec>& rowmax, const ConstVec<Exec>& sumexp, const ConstVec<Exec>& target) {
  Kokkos::parallel_for("lamina::cross_entropy_forward",
                       Range<Exec>(exec, 0, static_cast<std::int64_t>(losses.extent(0))),
                       CrossEntropyForward<Exec>{losses, lse, rowmax, sumexp, target});
}

// One team per row.
template <class Exec>
struct CrossEntropyBackward {
  Mat<Exec> dlogits;
  ConstMat<Exec> logits;
  ConstVec<Exec> lse;
  Tokens<Exec> targets;
  std::int64_t vocab_begin, V;
  float scale;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    row(team, team.league_rank(), lse(team.league_rank()));
  }
  // Row i's gradient from its log-sum-exp l.
  KOKKOS_INLINE_FUNCTION void row(const typename Teams<Exec>::member_type& team, std::int64_t i, float l) const {
    const std::int64_t y = targets(i) - vocab_begin;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V), [&](std::int64_t j) {
      dlogits(i, j) = scale * (fast_exp(logits(i, j) - l) - (j == y ? 1.0f : 0.0f));
    });
  }
};

// dlogits: (N, V) overwritten with scale * (softmax(logits) - onehot(target)); it may
// alias logits (the usual case: the logits are not needed afterwards). `scale` is
// d(total loss)/d(loss_i), 1 / (number of positions) for a mean.
template <class Exec>
void cross_entropy_backward(const Exec& exec, const Mat<Exec>& dlogits, const ConstMat<Exec>& logits,
                            const ConstVec<Exec>& lse, const Tokens<Exec>& targets, std::int64_t vocab_begin,
                            float scale) {
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  Kokkos::parallel_for("lamina::cross_entropy_backward", Teams<Exec>(exec, N, Kokkos::AUTO),
                       CrossEntropyBackward<Exec>{dlogits, logits, lse, targets, vocab_begin, V, scale});
}

// One team per row, writing its bf16 gradients over the row's own fp32 logits: element j
// of row i goes to bf16 slot j of the row's memory (its first half), which lies in fp32
// elements j / 2 <= j. A device's team reads a block of kBlock elements per thread
// (consecutive threads, consecutive elements) before any of it is written, so every write
// lands where the team has already read, and no later read meets a written element; the
// logits are read as bytes (memcpy), so that no compiler may move a bf16 store above a read
// of the float it overwrites. A host's team (one thread) takes the row kChunk elements at a
// time into a local array, then copies that over the chunk's first half: written straight
// into the row, 16 at a time, the pass ran three times slower (GPT-2 124M's 4 x 1024 rows of
// 50257 alone on a Xeon: 490 ms against 165).
template <class Exec>
struct CrossEntropyBackwardBf16 {
  static constexpr int kBlock = 16;
  static constexpr std::int64_t kChunk = 1024;
  Mat<Exec> logits;
  ConstVec<Exec> lse;
  Tokens<Exec> targets;
  std::int64_t vocab_begin, V;
  float scale;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    row(team, team.league_rank(), lse(team.league_rank()));
  }
  // Row i's gradient from its log-sum-exp l.
  KOKKOS_INLINE_FUNCTION void row(const typename Teams<Exec>::member_type& team, std::int64_t i, float l) const {
    const std::int64_t S = team.team_size(), t = team.team_rank();
    const std::int64_t y = targets(i) - vocab_begin;
    const float* in = &logits(i, 0);
    std::uint16_t* d = reinterpret_cast<std::uint16_t*>(&logits(i, 0));
    if constexpr (detail::kOnHost<Exec>) {
      if (S == 1) {
        // The target's gradient is written last, from its logit read first, so that the
        // loop compares no 64-bit index (which halved its vectors' width). The gradients
        // are written as bytes (memcpy), so that no compiler may move one above a read of
        // the float it overwrites.
        const bool has_target = y >= 0 && y < V;
        const float target_logit = has_target ? in[y] : 0.0f;
        std::uint16_t g[kChunk];
        for (std::int64_t j0 = 0; j0 < V; j0 += kChunk) {
          const std::int64_t n = V - j0 < kChunk ? V - j0 : kChunk;
          for (std::int64_t k = 0; k < n; ++k) g[k] = to_bf16(scale * fast_exp(in[j0 + k] - l));
          memcpy(d + j0, g, static_cast<std::size_t>(n) * sizeof(std::uint16_t));
        }
        if (has_target) {
          const std::uint16_t gy = to_bf16(scale * (fast_exp(target_logit - l) - 1.0f));
          memcpy(d + y, &gy, sizeof gy);
        }
        return;
      }
    }
    for (std::int64_t j0 = 0; j0 < V; j0 += S * kBlock) {
      float g[kBlock];
      for (int k = 0; k < kBlock; ++k) {
        const std::int64_t j = j0 + k * S + t;
        float x = 0.0f;
        if (j < V) memcpy(&x, in + j, sizeof x);
        g[k] = scale * (fast_exp(x - l) - (j == y ? 1.0f : 0.0f));
      }
      team.team_barrier();
      for (int k = 0; k < kBlock; ++k) {
        const std::int64_t j = j0 + k * S + t;
        if (j < V) d[j] = to_bf16(g[k]);
      }
    }
  }
};

// cross_entropy_backward's gradients rounded to bf16 in place (bf16 runs whose products take
// them as they are): row i's V values in the first half of its own memory, so the bf16
// matrix has a row stride of 2 V; the logits are gone afterwards.
template <class Exec>
void cross_entropy_backward_bf16(const Exec& exec, const Mat<Exec>& logits, const ConstVec<Exec>& lse,
                                 const Tokens<Exec>& targets, std::int64_t vocab_begin, float scale) {
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  if (static_cast<std::int64_t>(logits.stride_0()) != V) {
    throw std::logic_error("lamina::cross_entropy_backward_bf16: the logits' rows are not contiguous");
  }
  Kokkos::parallel_for("lamina::cross_entropy_backward_bf16", Teams<Exec>(exec, N, Kokkos::AUTO),
                       CrossEntropyBackwardBf16<Exec>{logits, lse, targets, vocab_begin, V, scale});
}

// One team per row: the statistics and target logit head_forward takes of it, then its
// gradient as Gradient (CrossEntropyBackward in place, or CrossEntropyBackwardBf16) writes it
// over the row, while the row is still in cache (llm.c's fused classifier): the logits are read
// from memory once, not again by the backward pass. The log-sum-exp is cross_entropy_forward's
// expression, so the gradient has the bits the two passes give.
template <class Exec, class Gradient>
struct CrossEntropyStatsAndGradient {
  Vec<Exec> rowmax, sumexp, target;
  Gradient gradient;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank(), V = gradient.V;
    const auto& logits = gradient.logits;
    const std::int64_t y = gradient.targets(i) - gradient.vocab_begin;
    const float t = (y >= 0 && y < V) ? logits(i, y) : 0.0f;
    const float mx = team_max(team, V, [&](std::int64_t j) { return logits(i, j); });
    const float s = team_sum(team, V, [&](std::int64_t j) { return fast_exp(logits(i, j) - mx); });
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      rowmax(i) = mx;
      sumexp(i) = s;
      target(i) = t;
    });
    team.team_barrier();  // no thread writes the row before every thread has read it
    gradient.row(team, i, mx + math::log(s));
  }
};

// cross_entropy_row_stats and cross_entropy_target_logit of whole rows (a vocabulary no other
// rank shares), and in the same pass d objective / d logits over the logits: scale * (softmax
// - onehot) in fp32, or (bf16) rounded into the first half of each row's memory as
// cross_entropy_backward_bf16 writes it. The logits are gone afterwards.
template <class Exec>
void cross_entropy_stats_and_gradient(const Exec& exec, const Vec<Exec>& rowmax, const Vec<Exec>& sumexp,
                                      const Vec<Exec>& target, const Mat<Exec>& logits, const Tokens<Exec>& targets,
                                      std::int64_t vocab_begin, float scale, bool bf16) {
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  const char* label = "lamina::cross_entropy_stats_and_gradient";
  if (bf16) {
    if (static_cast<std::int64_t>(logits.stride_0()) != V) {
      throw std::logic_error("lamina::cross_entropy_stats_and_gradient: the logits' rows are not contiguous");
    }
    using G = CrossEntropyBackwardBf16<Exec>;
    Kokkos::parallel_for(label, Teams<Exec>(exec, N, Kokkos::AUTO),
                         CrossEntropyStatsAndGradient<Exec, G>{rowmax, sumexp, target,
                                                               G{logits, ConstVec<Exec>(), targets, vocab_begin, V,
                                                                 scale}});
  } else {
    using G = CrossEntropyBackward<Exec>;
    Kokkos::parallel_for(label, Teams<Exec>(exec, N, Kokkos::AUTO),
                         CrossEntropyStatsAndGradient<Exec, G>{rowmax, sumexp, target,
                                                               G{logits, logits, ConstVec<Exec>(), targets,
                                                                 vocab_begin, V, scale}});
  }
}

}  // namespace lamina
