#pragma once
// Context parallelism's attention (ring attention, Liu et al. 2023, with Megatron-Core's
// load-balanced chunks): a sequence of T positions is cut into 2 cp chunks and rank r of the
// context-parallel group holds chunks r and 2 cp - 1 - r as its rows, so that every rank has
// the same causal work. A rank's queries meet every rank's keys and values, one source rank at
// a time as they travel around the ring; a query chunk against a key/value chunk is wholly
// visible (an earlier chunk), causal (the same chunk) or hidden (a later one: skipped). The
// forward pass merges each block's output into fp32 running results by the blocks'
// log-sum-exps, and saves the final log-sum-exps as the fused kernels do; the backward pass
// recomputes each block's probabilities from them, adds dq to the rank's own rows and dk, dv
// to the source's gradient buffer, which travels on with the source's keys and values until it
// is back with their owner. Keys and values travel packed, (B T / cp, 2 NKV hd) rows [k | v];
// their gradients as fp32 rows of the same shape. The kernels are the fused kernels' teams
// (kernels/flash_attention.hpp), their causal mask taken on positions.
// Staged products (kernels/attention.hpp) run whole batched products instead: the ring
// first places every source's keys and values at their positions in the staged copies
// (ring_place_keys_values), the rank's queries meet them all at once, and backward each
// source's travelling gradient buffer takes the rank's gradients at the source's positions
// (ring_take_key_value_gradients).
#include <type_traits>
#include <utility>

#include "lamina/kernels/attention.hpp"
#include "lamina/kernels/context_chunks.hpp"
#include "lamina/kernels/flash_attention.hpp"

namespace lamina {

// The fp32 running results of a rank's queries (ring_attention_begin .. ring_attention_end).
template <class Exec>
struct RingAttentionState {
  Mat<Exec> y;    // (B T / cp, NH hd) attention output so far
  Mats<Exec> lse; // (B NH, T / cp, 1) each row's log-sum-exp so far
};

namespace detail {

// One query chunk (rows q_row.. of each sequence's rows, positions from q_pos) against one
// key/value chunk (rows k_row.. of the packed source rows, positions from k_pos), each
// blocks.T rows. `blocks` counts the blocks of a chunk.
struct ChunkPair {
  FlashBlocks blocks;
  std::int64_t rows;  // a sequence's rows on a rank
  std::int64_t q_row, q_pos, k_row, k_pos;

  // The key block at c0 is seen by the last query of the query block at r0 (n rows).
  KOKKOS_INLINE_FUNCTION bool visible(std::int64_t r0, std::int64_t n, std::int64_t c0) const {
    return k_pos + c0 <= q_pos + r0 + n - 1;
  }
  // Query block at r0 of (sequence, query head) bh as FlashBackwardBlock::load_queries reads it:
  // r0 a row of the sequence's rows on this rank.
  KOKKOS_INLINE_FUNCTION FlashTile query_tile(std::int64_t bh, std::int64_t r0) const {
    return {bh, bh / blocks.L.NH * rows, bh % blocks.L.NH * blocks.hd, 0, q_row + r0, blocks.size(r0)};
  }
  // Packed key (part 1) or value (part 2) columns of query head h.
  KOKKOS_INLINE_FUNCTION std::int64_t kv_column(int part, std::int64_t h) const {
    return (part - 1) * blocks.L.NKV * blocks.hd + h / blocks.L.group() * blocks.hd;
  }
};

template <class Exec, class T>
struct RingAttentionForward {
  using Member = typename Teams<Exec>::member_type;
  ChunkPair pair;
  FlashBlocks blocks;  // pair.blocks, where for_each_flash_block looks
  float scale;
  int level;
  MatOf<Exec, T> qkv, kv;
  RingAttentionState<Exec> acc;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t bh = team.league_rank() / blocks.blocks, r0 = team.league_rank() % blocks.blocks * kFlashBlock;
    const FlashTile t = pair.query_tile(bh, r0);
    const std::int64_t hd = blocks.hd, B = kFlashBlock, h = bh % blocks.L.NH, krow = bh / blocks.L.NH * pair.rows;
    const auto sc = team.team_scratch(level);
    const ScratchMat<Exec> q = scratch_block<Exec>(sc, hd), kvb = scratch_block<Exec>(sc, hd),
                           o = scratch_block<Exec>(sc, hd), s = scratch_block<Exec>(sc, B), st(sc, B, 3);
    flash_start_rows(team, q, o, st, qkv, t.row0 + t.r0, t.col0, t.n, hd, scale);
    for (std::int64_t c0 = 0; c0 < blocks.T && pair.visible(r0, t.n, c0); c0 += B) {
      const std::int64_t m = blocks.size(c0), at = krow + pair.k_row + c0;
      flash_key_block(
          team, q, kvb, s, st, o, t.n, m, hd, pair.q_pos + r0 - (pair.k_pos + c0),
          [&] { flash_load(team, kvb, kv, at, pair.kv_column(1, h), m, hd, 1.0f); },
          [&] { flash_load(team, kvb, kv, at, pair.kv_column(2, h), m, hd, 1.0f); });
    }
    // Merge: y = (y e^lse_y + o e^lse_o) / (e^lse_y + e^lse_o), the weights in st(i, 1..2).
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n), [&](std::int64_t i) {
      float& lse = acc.lse(bh, t.r0 + i, 0);
      if (st(i, 1) <= 0.0f) {  // no key of this block is seen
        st(i, 1) = 0.0f;
        st(i, 2) = 1.0f;
        return;
      }
      const float block = st(i, 0) + math::log(st(i, 1));
      const float mx = math::max(lse, block), wy = fast_exp(lse - mx), wo = fast_exp(block - mx);
      st(i, 1) = wo / (wy + wo) / st(i, 1);
      st(i, 2) = wy / (wy + wo);
      lse = mx + math::log(wy + wo);
    });
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t.n * hd), [&](std::int64_t e) {
      const std::int64_t i = e / hd, d = e % hd;
      float& y = acc.y(t.row0 + t.r0 + i, t.col0 + d);
      y = y * st(i, 2) + o(i, d) * st(i, 1);
    });
  }
};

// dk, dv of one key block of the source's chunk and key/value head, over the visible query
// blocks of each query head that reads it: added to dkv.
template <class Exec, class T>
struct RingAttentionBackwardKeys {
  using Member = typename Teams<Exec>::member_type;
  ChunkPair pair;
  FlashBlocks blocks;
  float scale;
  int level;
  Mat<Exec> dkv, dout;
  MatOf<Exec, T> qkv, kv, out;
  MatsOf<Exec, T> lse;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t G = blocks.L.group(), NKV = blocks.L.NKV, hd = blocks.hd, B = kFlashBlock;
    const std::int64_t kvh = team.league_rank() / blocks.blocks, s = kvh / NKV, h0 = kvh % NKV * G;
    const std::int64_t c0 = team.league_rank() % blocks.blocks * B, m = blocks.size(c0);
    const std::int64_t krow = s * pair.rows + pair.k_row + c0;
    const std::int64_t kcol = pair.kv_column(1, h0), vcol = pair.kv_column(2, h0);
    const auto sc = team.team_scratch(level);
    const auto b = FlashBackwardBlock<Exec>::in_scratch(sc, hd, true);
    const ScratchMat<Exec> dk = scratch_block<Exec>(sc, hd), dv = scratch_block<Exec>(sc, hd);
    flash_load(team, b.k, kv, krow, kcol, m, hd, 1.0f);
    flash_load(team, b.v, kv, krow, vcol, m, hd, 1.0f);
    flash_zero(team, dk, m, hd);
    flash_zero(team, dv, m, hd);
    for (std::int64_t j = 0; j < G; ++j) {
      for (std::int64_t r0 = 0; r0 < blocks.T; r0 += B) {
        if (!pair.visible(r0, blocks.size(r0), c0)) continue;
        const FlashTile qt = pair.query_tile(s * blocks.L.NH + h0 + j, r0);
        team.team_barrier();
        b.load_queries(team, qt, scale, qkv, dout, out, lse, hd);
        team.team_barrier();
        b.template probabilities<true>(team, pair.q_pos + r0, qt.n, pair.k_pos + c0, m, hd);
        team.team_barrier();
        b.add_key_gradients(team, dk, dv, qt.n, m, hd);
      }
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, m * hd), [&](std::int64_t e) {
      const std::int64_t jj = e / hd, d = e % hd;
      dkv(krow + jj, kcol + d) += dk(jj, d);
      dkv(krow + jj, vcol + d) += dv(jj, d);
    });
  }
};

// dq of one query block over the source chunk's visible key blocks: added to dqkv.
template <class Exec, class T>
struct RingAttentionBackwardQueries {
  using Member = typename Teams<Exec>::member_type;
  ChunkPair pair;
  FlashBlocks blocks;
  float scale;
  int level;
  Mat<Exec> dqkv, dout;
  MatOf<Exec, T> qkv, kv, out;
  MatsOf<Exec, T> lse;

  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t bh = team.league_rank() / blocks.blocks, r0 = team.league_rank() % blocks.blocks * kFlashBlock;
    const FlashTile qt = pair.query_tile(bh, r0);
    const std::int64_t hd = blocks.hd, B = kFlashBlock, h = bh % blocks.L.NH, krow = bh / blocks.L.NH * pair.rows;
    const auto sc = team.team_scratch(level);
    const auto b = FlashBackwardBlock<Exec>::in_scratch(sc, hd, false);
    const ScratchMat<Exec> dq = scratch_block<Exec>(sc, hd);
    b.load_queries(team, qt, scale, qkv, dout, out, lse, hd);
    flash_zero(team, dq, qt.n, hd);
    for (std::int64_t c0 = 0; c0 < blocks.T && pair.visible(r0, qt.n, c0); c0 += B) {
      const std::int64_t m = blocks.size(c0);
      team.team_barrier();
      flash_load(team, b.k, kv, krow + pair.k_row + c0, pair.kv_column(1, h), m, hd, 1.0f);
      flash_load(team, b.v, kv, krow + pair.k_row + c0, pair.kv_column(2, h), m, hd, 1.0f);
      team.team_barrier();
      b.template probabilities<false>(team, pair.q_pos + r0, qt.n, pair.k_pos + c0, m, hd);
      team.team_barrier();
      b.add_query_gradient(team, dq, qt.n, m, hd);
    }
    team.team_barrier();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, qt.n * hd), [&](std::int64_t e) {
      const std::int64_t i = e / hd, d = e % hd;
      dqkv(qt.row0 + qt.r0 + i, qt.col0 + d) += scale * dq(i, d);
    });
  }
};

// dst(r, dst0 + c) = src(r, src0 + c), rounded where dst is bf16 (c < the copied width).
template <class Dst, class Src>
struct CopyColumns {
  Dst dst;
  Src src;
  std::int64_t dst0, src0;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t r, std::int64_t c) const {
    put(dst(r, dst0 + c), widen(src(r, src0 + c)));
  }
};

template <class Exec, class Dst, class Src>
void copy_columns(const Exec& exec, const char* label, const Dst& dst, std::int64_t dst0, const Src& src,
                  std::int64_t src0, std::int64_t width) {
  Kokkos::parallel_for(label, RowMajor<Exec, 2>(exec, {0, 0}, {static_cast<std::int64_t>(dst.extent(0)), width}),
                       CopyColumns<Dst, Src>{dst, src, dst0, src0});
}

// The running log-sum-exps saved as the fused kernels save theirs.
template <class Exec, class LseV>
struct SaveLogSumExps {
  LseV lse;
  Mats<Exec> running;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t bh, std::int64_t t) const {
    save_log_sum_exp(&lse(bh, t, 0), running(bh, t, 0));
  }
};

// The visible pairs of this rank's chunks with the source rank's: f(ChunkPair).
template <class F>
void for_each_visible_pair(const QkvLayout& L, const ContextChunks& chunks, int source, F f) {
  const std::int64_t c = chunks.size();
  for (int a = 0; a < 2; ++a) {
    for (int b = 0; b < 2; ++b) {
      const std::int64_t qc = chunks.chunk(chunks.rank, a), kc = chunks.chunk(source, b);
      if (kc <= qc) f(ChunkPair{FlashBlocks(L, c), chunks.rows(), a * c, qc * c, b * c, kc * c});
    }
  }
}

}  // namespace detail

// kv (B T / cp, 2 NKV hd) = the [k | v] columns of the rank's qkv rows, to send.
template <class Exec, class T>
void ring_pack_keys_values(const Exec& exec, const MatOf<Exec, T>& kv, const MatOf<Exec, T>& qkv) {
  const std::int64_t width = static_cast<std::int64_t>(kv.extent(1));
  detail::copy_columns(exec, "lamina::ring_pack_keys_values", kv, 0, qkv,
                       static_cast<std::int64_t>(qkv.extent(1)) - width, width);
}

// Running results of no key yet.
template <class Exec>
void ring_attention_begin(const Exec& exec, const RingAttentionState<Exec>& acc) {
  Kokkos::deep_copy(exec, acc.y, 0.0f);
  Kokkos::deep_copy(exec, acc.lse, detail::kNoScoresYet);
}

// This rank's queries in qkv against the keys and values of rank `source`, packed in kv
// (ring_pack_keys_values), merged into acc.
template <class Exec, class T>
void ring_attention_forward(const Exec& exec, const RingAttentionState<Exec>& acc, const MatOf<Exec, T>& qkv,
                            const MatOf<Exec, T>& kv, std::int64_t NH, const ContextChunks& chunks, int source) {
  const std::int64_t hd = static_cast<std::int64_t>(acc.y.extent(1)) / NH;
  const QkvLayout L = QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, hd);
  const std::int64_t BNH = static_cast<std::int64_t>(acc.lse.extent(0));
  detail::for_each_visible_pair(L, chunks, source, [&](const detail::ChunkPair& p) {
    detail::for_each_flash_block(exec, "lamina::ring_attention_forward", BNH, p.blocks.scratch_bytes<Exec>(3, 1),
                                 detail::RingAttentionForward<Exec, T>{
                                     p, p.blocks, 1.0f / math::sqrt(static_cast<float>(hd)), 0, qkv, kv, acc});
  });
}

// out (B T / cp, NH hd) and the saved log-sum-exps lse (B NH, T / cp, 2), as
// flash_attention_forward leaves them, from the running results of every source.
template <class Exec, class OutV, class LseV>
void ring_attention_end(const Exec& exec, const OutV& out, const LseV& lse, const RingAttentionState<Exec>& acc) {
  detail::copy_columns(exec, "lamina::ring_attention_out", out, 0, acc.y, 0, static_cast<std::int64_t>(out.extent(1)));
  Kokkos::parallel_for("lamina::ring_attention_lse",
                       RowMajor<Exec, 2>(exec, {0, 0}, {static_cast<std::int64_t>(lse.extent(0)),
                                                        static_cast<std::int64_t>(lse.extent(1))}),
                       detail::SaveLogSumExps<Exec, LseV>{lse, acc.lse});
}

// The backward pass against rank `source`'s keys and values (kv, packed): dq added to the q
// columns of dqkv (B T / cp, qkv width), dk and dv to the source's dkv (B T / cp, 2 NKV hd).
// dout (B T / cp, NH hd); qkv, out, lse: as this rank's forward pass left them.
template <class Exec, class QkvV, class OutV, class LseV>
void ring_attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const Mat<Exec>& dkv, const Mat<Exec>& dout,
                             const QkvV& qkv, const QkvV& kv, const OutV& out, const LseV& lse, std::int64_t NH,
                             const ContextChunks& chunks, int source) {
  using T = StoredType<OutV>;
  const std::int64_t BNH = static_cast<std::int64_t>(lse.extent(0));
  const std::int64_t hd = static_cast<std::int64_t>(out.extent(1)) / NH;
  const QkvLayout L = QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, hd);
  const float scale = 1.0f / math::sqrt(static_cast<float>(hd));
  detail::for_each_visible_pair(L, chunks, source, [&](const detail::ChunkPair& p) {
    detail::for_each_flash_block(
        exec, "lamina::ring_attention_backward_keys", BNH / L.group(), p.blocks.scratch_bytes<Exec>(6, 2),
        detail::RingAttentionBackwardKeys<Exec, T>{p, p.blocks, scale, 0, dkv, dout, qkv, kv, out, lse});
    detail::for_each_flash_block(
        exec, "lamina::ring_attention_backward_queries", BNH, p.blocks.scratch_bytes<Exec>(5, 1),
        detail::RingAttentionBackwardQueries<Exec, T>{p, p.blocks, scale, 0, dqkv, dout, qkv, kv, out, lse});
  });
}

namespace detail {

// A source's packed key/value rows <-> staged copies (B*NKV, T, hd) of every position:
// place (rounded where the copies are bf16), or take (the copies' gradients added to the
// rows).
template <class Rows, class Heads>
struct SourceRowsAndHeads {
  Rows kv;
  Heads k, v;
  ContextChunks source;  // the chunks of the rank whose rows kv holds
  std::int64_t NKV, hd;
  bool take;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, std::int64_t g, std::int64_t t, std::int64_t d) const {
    const std::int64_t row = b * source.rows() + t, p = source.position(t);
    auto& rk = kv(row, g * hd + d);
    auto& rv = kv(row, (NKV + g) * hd + d);
    auto& xk = k(b * NKV + g, p, d);
    auto& xv = v(b * NKV + g, p, d);
    if (take) {
      put(rk, widen(rk) + widen(xk));
      put(rv, widen(rv) + widen(xv));
    } else {
      put(xk, widen(rk));
      put(xv, widen(rv));
    }
  }
};

template <class Exec, class Rows, class Heads>
void source_rows_and_heads(const Exec& exec, const char* label, const Rows& kv, const Heads& k, const Heads& v,
                           const ContextChunks& source, bool take) {
  const std::int64_t BNKV = static_cast<std::int64_t>(k.extent(0)), hd = static_cast<std::int64_t>(k.extent(2));
  const std::int64_t NKV = static_cast<std::int64_t>(kv.extent(1)) / (2 * hd), B = BNKV / NKV;
  Kokkos::parallel_for(label, RowMajor<Exec, 4>(exec, {0, 0, 0, 0}, {B, NKV, source.rows(), hd}),
                       SourceRowsAndHeads<Rows, Heads>{kv, k, v, source, NKV, hd, take});
}

}  // namespace detail

// Staged products: the keys and values of rank `source` (kv, packed by
// ring_pack_keys_values) into ws.k and ws.v (B*NKV, chunks.T, hd) at their positions, as
// staged products in `math` read them (bf16 storage on a bf16 engine: bf16 copies in their
// first half).
template <class Exec, class T>
void ring_place_keys_values(const Exec& exec, const AttentionWorkspace<Exec>& ws, const MatOf<Exec, T>& kv,
                            const ContextChunks& chunks, int source, ProductMath math) {
  const ContextChunks from{chunks.T, chunks.cp, source};
  if constexpr (std::is_same<T, std::uint16_t>::value) {
    if (attention_staged_bf16<Exec>(AttentionProducts::staged, math)) {
      detail::source_rows_and_heads(exec, "lamina::ring_place_keys_values", kv, detail::halves<Exec>(ws.k),
                                    detail::halves<Exec>(ws.v), from, false);
      return;
    }
  }
  detail::source_rows_and_heads(exec, "lamina::ring_place_keys_values", kv, ws.k, ws.v, from, false);
}

// Their backward: this rank's gradients dk, dv (B*NKV, chunks.T, hd) of every position added,
// at rank `source`'s positions, to the source's travelling gradients dkv (B T / cp, 2 NKV hd).
template <class Exec>
void ring_take_key_value_gradients(const Exec& exec, const Mat<Exec>& dkv, const Mats<Exec>& dk, const Mats<Exec>& dv,
                                   const ContextChunks& chunks, int source) {
  detail::source_rows_and_heads(exec, "lamina::ring_take_key_value_gradients", dkv, dk, dv,
                                ContextChunks{chunks.T, chunks.cp, source}, true);
}

// The rank's own keys' and values' gradients, back from the ring in dkv, into the k and v
// columns of dqkv.
template <class Exec>
void ring_unpack_key_value_gradients(const Exec& exec, const Mat<Exec>& dqkv, const Mat<Exec>& dkv) {
  const std::int64_t width = static_cast<std::int64_t>(dkv.extent(1));
  detail::copy_columns(exec, "lamina::ring_unpack_key_value_gradients", dqkv,
                       static_cast<std::int64_t>(dqkv.extent(1)) - width, dkv, 0, width);
}

}  // namespace lamina
