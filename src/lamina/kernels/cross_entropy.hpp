#pragma once
// Softmax cross-entropy over the vocabulary, per position:
//   loss_i = lse_i - logits_i[target_i],  lse_i = max_i + log(sum_j exp(logits_ij - max_i))
// Written as row statistics so that the vocabulary can be split over tensor-parallel
// ranks (Megatron's vocabulary-parallel cross-entropy): each rank computes them on its
// shard of the logits, and the group combines them (max, then sums) before the loss.
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
    const std::int64_t i = team.league_rank();
    const float l = lse(i);
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

}  // namespace lamina
