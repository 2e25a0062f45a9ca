#pragma once
// Fused causal attention (flash attention, Dao et al. 2022), the device's way: one team per
// block of query rows of one (sequence, head) streams the key blocks through team scratch
// memory with an online softmax, so no T x T matrix reaches global memory. The forward
// pass saves each row's log-sum-exp as a bf16-exact high part and the rest: bf16 storage
// of the saved activations then keeps it to 2^-17 of its value, where rounding it whole
// would move it by up to 2^-9, which exp() turns into errors of percents in the
// probabilities. The backward pass recomputes the probabilities from it in two kernels,
// dk and dv per key block and dq per query block, so that every output element is summed
// by one thread in a fixed order (deterministic, no atomics); a key/value head's dk and dv
// sum its query heads' in one team (grouped-query attention). q, k, v are read and y, dq,
// dk, dv written in place in the [q | k | v] rows (kernels/qkv_layout.hpp) and (B*T, A)
// rows. Portable Kokkos: the same teams run, one thread each, on the host backends, where
// the tests check them.
#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/common.hpp"
#include "lamina/kernels/fast_math.hpp"
#include "lamina/kernels/qkv_layout.hpp"

namespace lamina {

namespace detail {

// Positions per query or key block. With 64-wide heads the forward pass's scratch (29 KiB)
// fits the 40 KiB of a CUDA block's shared memory that Kokkos leaves to level 0; the
// backward passes' (45 and 57 KiB) take level 1. Not yet tuned on a device.
constexpr std::int64_t kFlashBlock = 32;
// Below every score the online softmax meets, and far from float's overflow.
constexpr float kNoScoresYet = -3.0e38f;

// A row's log-sum-exp as saved: a bf16-exact high part and the rest (see above).
KOKKOS_INLINE_FUNCTION void save_log_sum_exp(float* saved, float lse) {
  saved[0] = from_bf16(to_bf16(lse));
  saved[1] = lse - saved[0];
}
KOKKOS_INLINE_FUNCTION float load_log_sum_exp(const float* saved) { return saved[0] + saved[1]; }
// ... saved in bf16 (bf16 runs): both parts rounded, as the fp32 pair stored in bf16 would be.
KOKKOS_INLINE_FUNCTION void save_log_sum_exp(std::uint16_t* saved, float lse) {
  saved[0] = to_bf16(lse);
  saved[1] = to_bf16(lse - from_bf16(saved[0]));
}
KOKKOS_INLINE_FUNCTION float load_log_sum_exp(const std::uint16_t* saved) {
  return from_bf16(saved[0]) + from_bf16(saved[1]);
}

template <class Exec>
using ScratchMat = Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::scratch_memory_space,
                                Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

// A block of kFlashBlock rows of `cols` in team scratch, its rows one float longer (the last
// column unused): threads that read down a column (keys j of scores, each thread its own
// row in the softmax) then hit distinct shared-memory banks on a GPU instead of one.
template <class Exec, class Scratch>
KOKKOS_INLINE_FUNCTION ScratchMat<Exec> scratch_block(const Scratch& scratch, std::int64_t cols) {
  return ScratchMat<Exec>(scratch, kFlashBlock, cols + 1);
}

// Block r0 / kFlashBlock of positions of (sequence, query head) bh: its first row in the
// (B*T, .) rows, the query head's first column (in q, y, dq) and its key/value head's within
// k and v, and its n positions.
struct FlashTile {
  std::int64_t bh, row0, col0, kv0, r0, n;
};

struct FlashBlocks {
  QkvLayout L;
  std::int64_t T, hd, blocks;
  FlashBlocks(const QkvLayout& l, std::int64_t t)
      : L(l), T(t), hd(l.hd), blocks((t + kFlashBlock - 1) / kFlashBlock) {}
  // Items: every block of every (sequence, query head).
  KOKKOS_INLINE_FUNCTION FlashTile operator[](std::int64_t item) const {
    return tile(item / blocks, item % blocks * kFlashBlock);
  }
  KOKKOS_INLINE_FUNCTION FlashTile tile(std::int64_t bh, std::int64_t r0) const {
    const std::int64_t h = bh % L.NH;
    return {bh, bh / L.NH * T, h * hd, h / L.group() * hd, r0, math::min(kFlashBlock, T - r0)};
  }
  KOKKOS_INLINE_FUNCTION std::int64_t size(std::int64_t r0) const { return math::min(kFlashBlock, T - r0); }
  // Scratch for `rows` blocks of hd columns, `scores` of kFlashBlock (scratch_block) and
  // per-row statistics.
  template <class Exec>
  std::size_t scratch_bytes(int rows, int scores) const {
    return rows * ScratchMat<Exec>::shmem_size(kFlashBlock, hd + 1) +
           scores * ScratchMat<Exec>::shmem_size(kFlashBlock, kFlashBlock + 1) +
           ScratchMat<Exec>::shmem_size(kFlashBlock, 3);
  }
};

// dst(i, d) = scale * src(row0 + i, col0 + d) for the n rows of a block.
template <class Member, class Dst, class Src>
KOKKOS_INLINE_FUNCTION void flash_load(const Member& team, const Dst& dst, const Src& src, std::int64_t row0,
                                       std::int64_t col0, std::int64_t n, std::int64_t hd, float scale) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * hd), [&](std::int64_t e) {
    const std::int64_t i = e / hd, d = e % hd;
    dst(i, d) = scale * widen(src(row0 + i, col0 + d));
  });
}

template <class Member, class Dst>
KOKKOS_INLINE_FUNCTION void flash_zero(const Member& team, const Dst& dst, std::int64_t n, std::int64_t hd) {
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * hd),
                       [&](std::int64_t e) { dst(e / hd, e % hd) = 0.0f; });
}

// The start of the online softmax of n query rows: q (scaled) from rows row.. of src at column
// col, their output o zero, no scores seen yet (st: running maximum, sum).
template <class Member, class Scratch, class Src>
KOKKOS_INLINE_FUNCTION void flash_start_rows(const Member& team, const Scratch& q, const Scratch& o, const Scratch& st,
                                             const Src& src, std::int64_t row, std::int64_t col, std::int64_t n,
                                             std::int64_t hd, float scale) {
  flash_load(team, q, src, row, col, n, hd, scale);
  flash_zero(team, o, n, hd);
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](std::int64_t i) {
    st(i, 0) = kNoScoresYet;
    st(i, 1) = 0.0f;
  });
  team.team_barrier();
}

// One block of m keys of the online softmax of n query rows (q: scaled, in scratch): their
// scores against the keys load_keys() puts in kv, query row i seeing the block's keys j <=
// diagonal + i (the causal mask, on positions), folded into each row's running maximum and
// sum of exponentials (st columns 0 and 1; column 2: this block's rescaling) and its output
// o, with the values load_values() then puts in kv.
template <class Member, class Scratch, class LoadKeys, class LoadValues>
KOKKOS_INLINE_FUNCTION void flash_key_block(const Member& team, const Scratch& q, const Scratch& kv, const Scratch& s,
                                            const Scratch& st, const Scratch& o, std::int64_t n, std::int64_t m,
                                            std::int64_t hd, std::int64_t diagonal, const LoadKeys& load_keys,
                                            const LoadValues& load_values) {
  load_keys();
  team.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * m), [&](std::int64_t e) {
    const std::int64_t i = e / m, j = e % m;
    float dot = 0.0f;
    for (std::int64_t d = 0; d < hd; ++d) dot += q(i, d) * kv(j, d);
    s(i, j) = dot;
  });
  team.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), [&](std::int64_t i) {
    const std::int64_t seen = math::max<std::int64_t>(0, math::min(m, diagonal + i + 1));
    float mx = st(i, 0);
    for (std::int64_t j = 0; j < seen; ++j) mx = math::max(mx, s(i, j));
    float sum = 0.0f;
    for (std::int64_t j = 0; j < m; ++j) {
      const float p = j < seen ? fast_exp(s(i, j) - mx) : 0.0f;
      s(i, j) = p;
      sum += p;
    }
    const float rescale = fast_exp(st(i, 0) - mx);
    st(i, 0) = mx;
    st(i, 1) = st(i, 1) * rescale + sum;
    st(i, 2) = rescale;
  });
  team.team_barrier();
  load_values();
  team.team_barrier();
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * hd), [&](std::int64_t e) {
    const std::int64_t i = e / hd, d = e % hd;
    float acc = o(i, d) * st(i, 2);
    for (std::int64_t j = 0; j < m; ++j) acc += s(i, j) * kv(j, d);
    o(i, d) = acc;
  });
  team.team_barrier();
}

// T: how qkv, out and lse are stored (float, or bf16 as std::uint16_t).
template <class Exec, class T>
struct FlashAttentionForward {
  using Member = typename Teams<Exec>::member_type;
  FlashBlocks blocks;
  float scale;
  int level;
  MatOf<Exec, T> qkv, out;
  MatsOf<Exec, T> lse;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const FlashTile t = blocks[team.league_rank()];
    const std::int64_t hd = blocks.hd, B = kFlashBlock;
    const std::int64_t kcol = blocks.L.column(1) + t.kv0, vcol = blocks.L.column(2) + t.kv0;
    const auto sc = team.team_scratch(level);
    const ScratchMat<Exec> q = scratch_block<Exec>(sc, hd), kv = scratch_block<Exec>(sc, hd),
                           o = scratch_block<Exec>(sc, hd), s = scratch_block<Exec>(sc, B), st(sc, B, 3);
    // st: running maximum, running sum of exponentials, this block's rescaling of both
    flash_start_rows(team, q, o, st, qkv, t.row0 + t.r0, t.col0, t.n, hd, scale);
    for (std::int64_t c0 = 0; c0 < t.r0 + t.n; c0 += B) {
      const std::int64_t m = blocks.size(c0);
      flash_key_block(
          team, q, kv, s, st, o, t.n, m, hd, t.r0 - c0,
          [&] { flash_load(team, kv, qkv, t.row0 + c0, kcol, m, hd, 1.0f); },
          [&] { flash_load(team, kv, qkv, t.row0 + c0, vcol, m, hd, 1.0f); });
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n * hd), [&](std::int64_t e) {
      const std::int64_t i = e / hd, d = e % hd;
      put(out(t.row0 + t.r0 + i, t.col0 + d), o(i, d) / st(i, 1));
    });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n), [&](std::int64_t i) {
      save_log_sum_exp(&lse(t.bh, t.r0 + i, 0), st(i, 0) + math::log(st(i, 1)));
    });
  }
};

// The backward pass's view of one query block against one key block (p: only where dv is
// wanted).
template <class Exec>
struct FlashBackwardBlock {
  ScratchMat<Exec> q, dy, k, v, ds, st, p;

  // Its blocks in team scratch.
  template <class Scratch>
  KOKKOS_INLINE_FUNCTION static FlashBackwardBlock in_scratch(const Scratch& sc, std::int64_t hd, bool keep_p) {
    return {scratch_block<Exec>(sc, hd), scratch_block<Exec>(sc, hd),          scratch_block<Exec>(sc, hd),
            scratch_block<Exec>(sc, hd), scratch_block<Exec>(sc, kFlashBlock), ScratchMat<Exec>(sc, kFlashBlock, 3),
            keep_p ? scratch_block<Exec>(sc, kFlashBlock) : ScratchMat<Exec>()};
  }

  // Query block t: q (scaled), dy, and in st(i, 0) each row's log-sum-exp, in st(i, 1)
  // dy_i . y_i, the softmax backward's row sum.
  template <class Member, class T>
  KOKKOS_INLINE_FUNCTION void load_queries(const Member& team, const FlashTile& t, float scale,
                                           const MatOf<Exec, T>& qkv, const Mat<Exec>& dout, const MatOf<Exec, T>& out,
                                           const MatsOf<Exec, T>& lse, std::int64_t hd) const {
    flash_load(team, q, qkv, t.row0 + t.r0, t.col0, t.n, hd, scale);
    flash_load(team, dy, dout, t.row0 + t.r0, t.col0, t.n, hd, 1.0f);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n), [&](std::int64_t i) {
      float dot = 0.0f;
      for (std::int64_t d = 0; d < hd; ++d) {
        dot += dout(t.row0 + t.r0 + i, t.col0 + d) * widen(out(t.row0 + t.r0 + i, t.col0 + d));
      }
      st(i, 0) = load_log_sum_exp(&lse(t.bh, t.r0 + i, 0));
      st(i, 1) = dot;
    });
  }

  // With q scaled: P = exp(q k^T - lse), dS = P (dy v^T - D); zero where the mask hides
  // key c0 + j from query r0 + i.
  template <bool kKeepP, class Member>
  KOKKOS_INLINE_FUNCTION void probabilities(const Member& team, std::int64_t r0, std::int64_t n, std::int64_t c0,
                                            std::int64_t m, std::int64_t hd) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * m), [&](std::int64_t e) {
      const std::int64_t i = e / m, j = e % m;
      float pij = 0.0f, dsij = 0.0f;
      if (c0 + j <= r0 + i) {
        float score = 0.0f, dp = 0.0f;
        for (std::int64_t d = 0; d < hd; ++d) {
          score += q(i, d) * k(j, d);
          dp += dy(i, d) * v(j, d);
        }
        pij = fast_exp(score - st(i, 0));
        dsij = pij * (dp - st(i, 1));
      }
      if (kKeepP) p(i, j) = pij;
      ds(i, j) = dsij;
    });
  }

  // dv += P^T dy and dk += dS^T (scale q) for the block's m keys and n queries.
  template <class Member>
  KOKKOS_INLINE_FUNCTION void add_key_gradients(const Member& team, const ScratchMat<Exec>& dk,
                                                const ScratchMat<Exec>& dv, std::int64_t n, std::int64_t m,
                                                std::int64_t hd) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m * hd), [&](std::int64_t e) {
      const std::int64_t j = e / hd, d = e % hd;
      float gv = dv(j, d), gk = dk(j, d);
      for (std::int64_t i = 0; i < n; ++i) {
        gv += p(i, j) * dy(i, d);
        gk += ds(i, j) * q(i, d);
      }
      dv(j, d) = gv;
      dk(j, d) = gk;
    });
  }

  // dq += dS k for the block's n queries and m keys (scaled by the caller once at the end).
  template <class Member>
  KOKKOS_INLINE_FUNCTION void add_query_gradient(const Member& team, const ScratchMat<Exec>& dq, std::int64_t n,
                                                 std::int64_t m, std::int64_t hd) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n * hd), [&](std::int64_t e) {
      const std::int64_t i = e / hd, d = e % hd;
      float g = dq(i, d);
      for (std::int64_t j = 0; j < m; ++j) g += ds(i, j) * k(j, d);
      dq(i, d) = g;
    });
  }
};

// dk, dv of one key block of one key/value head, over the query blocks at or after it of
// each query head that reads it.
template <class Exec, class T>
struct FlashAttentionBackwardKeys {
  using Member = typename Teams<Exec>::member_type;
  FlashBlocks blocks;
  float scale;
  int level;
  Mat<Exec> dqkv, dout;
  MatOf<Exec, T> qkv, out;
  MatsOf<Exec, T> lse;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    // Items: every block of every (sequence, key/value head); its first query head's tile.
    const std::int64_t G = blocks.L.group(), NKV = blocks.L.NKV;
    const std::int64_t kvh = team.league_rank() / blocks.blocks, s = kvh / NKV, g = kvh % NKV;
    const FlashTile kt = blocks.tile(s * blocks.L.NH + g * G, team.league_rank() % blocks.blocks * kFlashBlock);
    const std::int64_t hd = blocks.hd, B = kFlashBlock;
    const std::int64_t kcol = blocks.L.column(1) + kt.kv0, vcol = blocks.L.column(2) + kt.kv0;
    const auto sc = team.team_scratch(level);
    const auto b = FlashBackwardBlock<Exec>::in_scratch(sc, hd, true);
    const ScratchMat<Exec> dk = scratch_block<Exec>(sc, hd), dv = scratch_block<Exec>(sc, hd);
    flash_load(team, b.k, qkv, kt.row0 + kt.r0, kcol, kt.n, hd, 1.0f);
    flash_load(team, b.v, qkv, kt.row0 + kt.r0, vcol, kt.n, hd, 1.0f);
    flash_zero(team, dk, kt.n, hd);
    flash_zero(team, dv, kt.n, hd);
    for (std::int64_t step = 0, steps = G * ((blocks.T - kt.r0 + B - 1) / B); step < steps; ++step) {
      const std::int64_t j = step % G, r0 = kt.r0 + step / G * B;  // query head g G + j, block r0
      const FlashTile qt = blocks.tile(kt.bh + j, r0);
      b.load_queries(team, qt, scale, qkv, dout, out, lse, hd);
      team.team_barrier();
      b.template probabilities<true>(team, r0, qt.n, kt.r0, kt.n, hd);
      team.team_barrier();
      b.add_key_gradients(team, dk, dv, qt.n, kt.n, hd);
      team.team_barrier();
    }
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, kt.n * hd), [&](std::int64_t e) {
      const std::int64_t j = e / hd, d = e % hd;
      dqkv(kt.row0 + kt.r0 + j, kcol + d) = dk(j, d);
      dqkv(kt.row0 + kt.r0 + j, vcol + d) = dv(j, d);
    });
  }
};

// dq of one query block, over the key blocks at or before it.
template <class Exec, class T>
struct FlashAttentionBackwardQueries {
  using Member = typename Teams<Exec>::member_type;
  FlashBlocks blocks;
  float scale;
  int level;
  Mat<Exec> dqkv, dout;
  MatOf<Exec, T> qkv, out;
  MatsOf<Exec, T> lse;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const FlashTile qt = blocks[team.league_rank()];
    const std::int64_t hd = blocks.hd, B = kFlashBlock;
    const std::int64_t kcol = blocks.L.column(1) + qt.kv0, vcol = blocks.L.column(2) + qt.kv0;
    const auto sc = team.team_scratch(level);
    const auto b = FlashBackwardBlock<Exec>::in_scratch(sc, hd, false);
    const ScratchMat<Exec> dq = scratch_block<Exec>(sc, hd);
    b.load_queries(team, qt, scale, qkv, dout, out, lse, hd);
    flash_zero(team, dq, qt.n, hd);
    for (std::int64_t c0 = 0; c0 < qt.r0 + qt.n; c0 += B) {
      const std::int64_t m = blocks.size(c0);
      team.team_barrier();
      flash_load(team, b.k, qkv, qt.row0 + c0, kcol, m, hd, 1.0f);
      flash_load(team, b.v, qkv, qt.row0 + c0, vcol, m, hd, 1.0f);
      team.team_barrier();
      b.template probabilities<false>(team, qt.r0, qt.n, c0, m, hd);
      team.team_barrier();
      b.add_query_gradient(team, dq, qt.n, m, hd);
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, qt.n * hd), [&](std::int64_t e) {
      const std::int64_t i = e / hd, d = e % hd;
      dqkv(qt.row0 + qt.r0 + i, qt.col0 + d) = scale * dq(i, d);
    });
  }
};

// One team per block of `heads` (sequence, head) pairs, its scratch in level 0 (a GPU's shared
// memory) where it fits, else level 1.
template <class Exec, class Kernel>
void for_each_flash_block(const Exec& exec, const char* label, std::int64_t heads, std::size_t bytes, Kernel kernel) {
  kernel.level = bytes <= static_cast<std::size_t>(Teams<Exec>::scratch_size_max(0)) ? 0 : 1;
  const int items = static_cast<int>(heads * kernel.blocks.blocks);
  Kokkos::parallel_for(label, Teams<Exec>(exec, items, Kokkos::AUTO).set_scratch_size(kernel.level, Kokkos::PerTeam(bytes)),
                       kernel);
}

}  // namespace detail

// out: (B*T, NH hd) attention output; lse: (B*NH, T, 2) each score row's log-sum-exp,
// saved; qkv: [q | k | v] rows (kernels/qkv_layout.hpp); all three stored as float, or as
// bf16 (bf16 runs: read and written as they are)
template <class Exec, class OutV, class LseV, class QkvV>
void flash_attention_forward(const Exec& exec, const OutV& out, const LseV& lse, const QkvV& qkv, std::int64_t NH) {
  using T = StoredType<OutV>;
  const std::int64_t BNH = static_cast<std::int64_t>(lse.extent(0)), Tn = static_cast<std::int64_t>(lse.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(out.extent(1)) / NH;
  const detail::FlashBlocks blocks(QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, hd), Tn);
  detail::for_each_flash_block(exec, "lamina::flash_attention_forward", BNH, blocks.scratch_bytes<Exec>(3, 1),
                               detail::FlashAttentionForward<Exec, T>{
                                   blocks, 1.0f / math::sqrt(static_cast<float>(hd)), 0, qkv, out, lse});
}

// dqkv: [q | k | v] rows, overwritten; dout: (B*T, NH hd); qkv, out, lse: as
// flash_attention_forward left them.
template <class Exec, class QkvV, class OutV, class LseV>
void flash_attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const Mat<Exec>& dout, const QkvV& qkv,
                              const OutV& out, const LseV& lse, std::int64_t NH) {
  using T = StoredType<OutV>;
  const std::int64_t BNH = static_cast<std::int64_t>(lse.extent(0)), Tn = static_cast<std::int64_t>(lse.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(out.extent(1)) / NH;
  const detail::FlashBlocks blocks(QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, hd), Tn);
  const float scale = 1.0f / math::sqrt(static_cast<float>(hd));
  detail::for_each_flash_block(
      exec, "lamina::flash_attention_backward_keys", BNH / blocks.L.group(), blocks.scratch_bytes<Exec>(6, 2),
      detail::FlashAttentionBackwardKeys<Exec, T>{blocks, scale, 0, dqkv, dout, qkv, out, lse});
  detail::for_each_flash_block(
      exec, "lamina::flash_attention_backward_queries", BNH, blocks.scratch_bytes<Exec>(5, 1),
      detail::FlashAttentionBackwardQueries<Exec, T>{blocks, scale, 0, dqkv, dout, qkv, out, lse});
}

}  // namespace lamina
