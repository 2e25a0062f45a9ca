#pragma once
// Causal multi-head self-attention core (between the QKV and output projections):
//   for each sequence b and head h:  P = softmax(mask(q k^T / sqrt(hd))),  y = P v
// qkv columns are [q | k | v], each head a contiguous slice of hd columns; query head h
// reads key and value head h / (NH / NKV) (kernels/qkv_layout.hpp: GPT-2 has NKV = NH).
// On a host BLAS the products read q, k, v and write y in those rows, per (sequence, head)
// and without the blocks the causal mask zeroes (in bf16 runs on a CPU with bf16
// instructions, oneDNN's bf16 products over every sequence and head at once); on a device
// fused kernels stream them through team scratch (kernels/flash_attention.hpp); elsewhere
// they run as batched GEMMs over per-head copies.
#include <algorithm>
#include <cstring>
#include <utility>

#include "lamina/core/config.hpp"
#include "lamina/kernels/context_chunks.hpp"
#include "lamina/kernels/fast_math.hpp"
#include "lamina/kernels/flash_attention.hpp"
#include "lamina/kernels/gemm.hpp"
#include "lamina/kernels/qkv_layout.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

namespace detail {

// Iterates (b, h, t, d) with d fastest: contiguous in both layouts, so host loops
// vectorize and GPU threads coalesce, with no index division per element.
template <class Exec>
using HeadsPolicy = RowMajor<Exec, 4>;

// Staged copies of the query-shaped tensors (q, y, their gradients; the scores) are ordered
// by position in the group first: copy (j, b, g) holds query head h = g G + j of sequence
// b (G = NH / NKV query heads per key/value head), so that the query heads that read the
// NKV key/value heads' copies (b, g) are one contiguous batch for each j. With G = 1 that
// is (b, h).
KOKKOS_INLINE_FUNCTION std::int64_t staged_head(const QkvLayout& L, std::int64_t B, std::int64_t b, std::int64_t h) {
  const std::int64_t G = L.group();
  return h % G * B * L.NKV + b * L.NKV + h / G;
}

// (B*T, width) rows, NH heads from column col0 <-> staged (B*NH, T, hd) copies, each side
// fp32 or bf16 (a value rounded where it goes from fp32 to bf16).
template <class Rows, class Heads>
struct QueryRowsAndHeads {
  Rows rows;
  Heads heads;
  QkvLayout L;
  std::int64_t B, T, col0;
  bool to_rows;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) const {
    auto& r = rows(b * T + t, col0 + h * L.hd + d);
    auto& x = heads(staged_head(L, B, b, h), t, d);
    if (to_rows) {
      put(r, widen(x));
    } else {
      put(x, widen(r));
    }
  }
};

// (B*T, width) rows' NKV key and value heads <-> (B*NKV, T, hd) copies.
template <class Rows, class Heads>
struct KeyValueRowsAndHeads {
  Rows rows;
  Heads k, v;
  QkvLayout L;
  std::int64_t T;
  bool to_rows;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, std::int64_t g, std::int64_t t, std::int64_t d) const {
    auto& rk = rows(b * T + t, L.column(1) + g * L.hd + d);
    auto& rv = rows(b * T + t, L.column(2) + g * L.hd + d);
    auto& xk = k(b * L.NKV + g, t, d);
    auto& xv = v(b * L.NKV + g, t, d);
    if (to_rows) {
      put(rk, widen(xk));
      put(rv, widen(xv));
    } else {
      put(xk, widen(rk));
      put(xv, widen(rv));
    }
  }
};

// NH heads of (B*T, width) rows from column col0 <-> staged copies (to_rows: back).
template <class Exec, class Rows, class Heads>
void split_heads(const Exec& exec, const char* label, const Rows& rows, std::int64_t col0, const Heads& heads,
                 const QkvLayout& L, bool to_rows) {
  const std::int64_t B = static_cast<std::int64_t>(heads.extent(0)) / L.NH;
  const std::int64_t T = static_cast<std::int64_t>(heads.extent(1));
  Kokkos::parallel_for(label, HeadsPolicy<Exec>(exec, {0, 0, 0, 0}, {B, L.NH, T, L.hd}),
                       QueryRowsAndHeads<Rows, Heads>{rows, heads, L, B, T, col0, to_rows});
}

// [q | k | v] rows <-> staged copies of q (B*NH, T, hd) and k, v (B*NKV, T, hd).
template <class Exec, class Rows, class Heads>
void permute_heads(const Exec& exec, const char* label, const Rows& rows, const Heads& q, const Heads& k,
                   const Heads& v, const QkvLayout& L, bool to_rows) {
  split_heads(exec, label, rows, 0, q, L, to_rows);
  const std::int64_t B = static_cast<std::int64_t>(q.extent(0)) / L.NH;
  const std::int64_t T = static_cast<std::int64_t>(q.extent(1));
  Kokkos::parallel_for(label, HeadsPolicy<Exec>(exec, {0, 0, 0, 0}, {B, L.NKV, T, L.hd}),
                       KeyValueRowsAndHeads<Rows, Heads>{rows, k, v, L, T, to_rows});
}

// A score row's maximum and sum of exponentials: its log-sum-exp is max + log(sum).
struct RowSoftmax {
  float max, sum;
};

// The exponentials exp(scale (s_j - max)) of score row t in place up to t, and the row's
// scaled maximum and their sum, each exponential summed as it is written rather than read
// back in a pass of its own (the same sums: the lanes' order is the sum's). The barrier: a
// team's next loop over the row reads entries other threads wrote.
template <class Row>
KOKKOS_INLINE_FUNCTION RowSoftmax causal_exponentials(const Row& loop, float* row, std::int64_t t, float scale) {
  const float mx = loop.max(t + 1, [&](std::int64_t j) { return row[j]; });
  const float sum = loop.sum(t + 1, [&](std::int64_t j) { return row[j] = fast_exp(scale * (row[j] - mx)); });
  loop.barrier();
  return {scale * mx, sum};
}

// Causal softmax of score row t in place (T entries), of the scores times `scale` (> 0);
// entries past t become 0.
template <class Row>
KOKKOS_INLINE_FUNCTION RowSoftmax causal_softmax_row(const Row& loop, float* row, std::int64_t t, std::int64_t T,
                                                     float scale = 1.0f) {
  const RowSoftmax r = causal_exponentials(loop, row, t, scale);
  const float inv = 1.0f / r.sum;
  loop.for_each(T, [&](std::int64_t j) { row[j] = j <= t ? row[j] * inv : 0.0f; });
  return r;
}

// Its backward in place on the row's gradient: dS = P * (dP - sum_j P dP); masked entries are 0.
template <class Row>
KOKKOS_INLINE_FUNCTION void causal_softmax_row_backward(const Row& loop, float* drow, const float* prow,
                                                        std::int64_t t, std::int64_t T) {
  const float dot = loop.sum(t + 1, [&](std::int64_t j) { return prow[j] * drow[j]; });
  loop.for_each(T, [&](std::int64_t j) { drow[j] = j <= t ? prow[j] * (drow[j] - dot) : 0.0f; });
}

// A staged score matrix (B*NH, rows, keys): row t of each (sequence, head) is the query at
// position chunks.position(t) (context parallelism: the rank's rows), column j the key at
// position j, seen where j <= that position.
struct ScoreRows {
  ContextChunks chunks;
  std::int64_t rows, keys;
  template <class M>
  static ScoreRows of(const M& scores, const ContextChunks& chunks) {
    return {chunks, static_cast<std::int64_t>(scores.extent(1)), static_cast<std::int64_t>(scores.extent(2))};
  }
  std::int64_t count(std::int64_t BNH) const { return BNH * rows; }
  KOKKOS_INLINE_FUNCTION std::int64_t bh(std::int64_t item) const { return item / rows; }
  KOKKOS_INLINE_FUNCTION std::int64_t t(std::int64_t item) const { return item % rows; }
  KOKKOS_INLINE_FUNCTION std::int64_t last_seen(std::int64_t item) const { return chunks.position(t(item)); }
};

// One team per score row (b*NH + h, t).
template <class Exec>
struct AttentionSoftmaxForward {
  Mats<Exec> att;
  ScoreRows r;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    causal_softmax_row(TeamRow<typename Teams<Exec>::member_type>{team}, &att(r.bh(i), r.t(i), 0), r.last_seen(i),
                       r.keys);
  }
};

template <class Exec>
struct AttentionSoftmaxBackward {
  Mats<Exec> datt, att;
  ScoreRows r;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank(), bh = r.bh(i), t = r.t(i);
    causal_softmax_row_backward(TeamRow<typename Teams<Exec>::member_type>{team}, &datt(bh, t, 0), &att(bh, t, 0),
                                r.last_seen(i), r.keys);
  }
};

// Staged products in bf16: the softmax of a row of bf16 scores, as the scores' product
// rounded them (unscaled: scale > 0 applies here, as oneDNN 2's bf16 products would not fuse
// it), in place into the saved bf16 probabilities (entries past the last seen: 0), in fp32
// arithmetic: the row's maximum, its sum of exponentials, then each exponential again over
// the sum (the row cannot hold fp32 exponentials; Megatron's fused softmax reads and writes
// bf16 so).
template <class Exec>
struct AttentionSoftmaxForward16 {
  Mats16<Exec> att;
  float scale;
  ScoreRows r;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank(), seen = r.last_seen(i);
    const TeamRow<typename Teams<Exec>::member_type> loop{team};
    std::uint16_t* row = &att(r.bh(i), r.t(i), 0);
    const float mx = loop.max(seen + 1, [&](std::int64_t j) { return from_bf16(row[j]); });
    const float sum = loop.sum(seen + 1, [&](std::int64_t j) { return fast_exp(scale * (from_bf16(row[j]) - mx)); });
    const float inv = 1.0f / sum;
    loop.for_each(r.keys, [&](std::int64_t j) {
      row[j] = j <= seen ? to_bf16(fast_exp(scale * (from_bf16(row[j]) - mx)) * inv) : std::uint16_t{0};
    });
  }
};

// Its backward in place on the bf16 dP, as its product rounded it: the score gradients
// scale * P * (dP - sum_j P dP) from it and the saved bf16 P, rounded into the same row for the
// products (masked entries 0). Each entry is read before it is written, by the thread that
// writes it, and the sum is whole before any is.
template <class Exec>
struct AttentionSoftmaxBackward16 {
  Mats16<Exec> att, ds;
  float scale;
  ScoreRows r;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank(), bh = r.bh(i), t = r.t(i), seen = r.last_seen(i);
    const TeamRow<typename Teams<Exec>::member_type> loop{team};
    const std::uint16_t* prow = &att(bh, t, 0);
    std::uint16_t* row = &ds(bh, t, 0);
    const float dot = loop.sum(seen + 1, [&](std::int64_t j) { return from_bf16(prow[j]) * from_bf16(row[j]); });
    loop.for_each(r.keys, [&](std::int64_t j) {
      row[j] = j <= seen ? to_bf16(scale * (from_bf16(prow[j]) * (from_bf16(row[j]) - dot))) : std::uint16_t{0};
    });
  }
};

// dbias += sums on the q and v parts only, k being [k0, k1) (see qkv_bias_backward).
template <class Exec>
struct QkvBiasBackward {
  Vec<Exec> dbias, sums;
  std::int64_t k0, k1;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t j) const {
    if (j < k0 || j >= k1) dbias(j) += sums(j);
  }
};

// The per-(sequence, head) products of causal attention on a host BLAS, cut into row blocks
// that skip what the mask zeroes: (n + 1) / 2n of the work at n blocks. With T x T operand L
// lower triangular (probabilities or their gradient), per (sequence, head):
//   scores:           C = A B^T, C (T x T): row block r only up to column r1 (the rest is
//                     masked; the softmax reads no further)
//   lower:            C = L X: row block r only reads L's columns, X's rows below r1
//   lower_transposed: C = L^T X: row block r only reads L's rows, X's rows from r0
enum class CausalProduct { scores, lower, lower_transposed };

// Measured at T = 256, hd = 64 (bench-torch step, OpenMP): 6 % less time in these products
// than blocks of 64; 16 was no faster, 128 slower.
constexpr std::int64_t kCausalBlock = 32;

// Matrix (s, h) of a batch over sequences s and query heads h: it starts at
// data + s * seq_stride + (h / group) * head_stride, its rows ld apart (group: query heads per
// key/value head for keys and values, else 1). q, k, v and y are read and written in place in
// their (B*T, width) rows this way, with no per-head copies.
struct HeadMatrices {
  float* data = nullptr;
  std::int64_t ld = 0, seq_stride = 0, head_stride = 0, group = 1;
  float* at(std::int64_t s, std::int64_t h) const { return data + s * seq_stride + h / group * head_stride; }
};

// The heads of (B*T, width) rows from column col0, hd columns each (group: as HeadMatrices).
template <class Exec>
HeadMatrices row_heads(const Mat<Exec>& rows, std::int64_t col0, std::int64_t T, std::int64_t hd,
                       std::int64_t group = 1) {
  const std::int64_t ld = static_cast<std::int64_t>(rows.stride_0());
  return {rows.data() + col0, ld, T * ld, hd, group};
}
// Part 0 (q), 1 (k) or 2 (v) of [q | k | v] rows, as query head h reads it.
template <class Exec>
HeadMatrices qkv_heads(const Mat<Exec>& rows, const QkvLayout& L, int part, std::int64_t T) {
  return row_heads<Exec>(rows, L.column(part), T, L.hd, part == 0 ? 1 : L.group());
}

// (B*NH, T, T) score matrices.
template <class Exec>
HeadMatrices score_heads(const Mats<Exec>& s, std::int64_t NH) {
  const std::int64_t stride = static_cast<std::int64_t>(s.stride_0());
  return {s.data(), static_cast<std::int64_t>(s.stride_1()), NH * stride, stride};
}

// Row block [r0, r1) of (sequence s, head h) of one of the products above.
struct CausalBlock {
  std::int64_t s, h, r0, r1, T, hd;

  RowMajorGemm product(CausalProduct kind, float alpha, const HeadMatrices& a, const HeadMatrices& b,
                   const HeadMatrices& c) const {
    RowMajorGemm p;
    p.alpha = alpha;
    p.a = a.at(s, h) + r0 * a.ld;
    p.lda = a.ld;
    p.b = b.at(s, h);
    p.ldb = b.ld;
    p.c = c.at(s, h) + r0 * c.ld;
    p.ldc = c.ld;
    p.m = r1 - r0;
    switch (kind) {
      case CausalProduct::scores:  // A rows r0..r1, B rows 0..r1
        p.tb = 'T';
        p.n = r1;
        p.k = hd;
        break;
      case CausalProduct::lower:  // L rows r0..r1, columns 0..r1
        p.n = hd;
        p.k = r1;
        break;
      case CausalProduct::lower_transposed:  // L rows r0..T, columns r0..r1; X rows r0..T
        p.ta = 'T';
        p.a += r0;
        p.b += r0 * b.ld;
        p.n = hd;
        p.k = T - r0;
        break;
    }
    return p;
  }
};

// Work items: every row block of every (sequence, head), (s, h) major.
struct CausalBlocks {
  std::int64_t NH, T, hd, blocks;
  CausalBlocks(std::int64_t nh, std::int64_t t, std::int64_t d)
      : NH(nh), T(t), hd(d), blocks((t + kCausalBlock - 1) / kCausalBlock) {}
  CausalBlock operator[](std::int64_t item) const {
    const std::int64_t i = item / blocks, r0 = item % blocks * kCausalBlock;
    return {i / NH, i % NH, r0, std::min(T, r0 + kCausalBlock), T, hd};
  }
};

// Where (sequence s, head h)'s saved log-sum-exps start in (B*NH, T, 2).
inline float* log_sum_exps(float* lse, const CausalBlock& b, std::int64_t NH) {
  return lse + (b.s * NH + b.h) * b.T * 2;
}

// Whole row blocks of attention per work item, so that each block's scores are still in
// the thread's cache when it takes their softmax and multiplies them by v. With lse (fused
// products) the rows' log-sum-exps are saved there, (B*NH, T, 2).
struct CausalAttentionForward {
  CausalBlocks blocks;
  float scale;
  HeadMatrices q, k, v, att, y;
  float* lse = nullptr;
  void operator()(const std::int64_t item) const {
    const CausalBlock b = blocks[item];
    host_sgemm(b.product(CausalProduct::scores, scale, q, k, att));
    for (std::int64_t t = b.r0; t < b.r1; ++t) {
      const RowSoftmax r = causal_softmax_row(SerialRow{}, att.at(b.s, b.h) + t * att.ld, t, b.T);
      if (lse != nullptr) save_log_sum_exp(log_sum_exps(lse, b, blocks.NH) + 2 * t, r.max + math::log(r.sum));
    }
    host_sgemm(b.product(CausalProduct::lower, 1.0f, att, v, y));
  }
};

// Fused products' backward on a host BLAS: the probabilities of a row block again, from
// the scores and the saved log-sum-exps (entries past the diagonal 0, as the softmax left them).
struct CausalAttentionProbabilities {
  CausalBlocks blocks;
  float scale;
  HeadMatrices q, k, att;
  float* lse;
  void operator()(const std::int64_t item) const {
    const CausalBlock b = blocks[item];
    host_sgemm(b.product(CausalProduct::scores, scale, q, k, att));
    const float* saved = log_sum_exps(lse, b, blocks.NH);
    for (std::int64_t t = b.r0; t < b.r1; ++t) {
      float* row = att.at(b.s, b.h) + t * att.ld;
      const float l = load_log_sum_exp(saved + 2 * t);
      for (std::int64_t j = 0; j <= t; ++j) row[j] = fast_exp(row[j] - l);
      for (std::int64_t j = t + 1; j < b.T; ++j) row[j] = 0.0f;
    }
  }
};

// Backward by row blocks: dP = dy v^T, dS = softmax backward, dq = scale dS k.
struct CausalAttentionBackwardRows {
  CausalBlocks blocks;
  float scale;
  HeadMatrices dy, q, k, v, att, datt, dq;
  void operator()(const std::int64_t item) const {
    const CausalBlock b = blocks[item];
    host_sgemm(b.product(CausalProduct::scores, 1.0f, dy, v, datt));
    for (std::int64_t t = b.r0; t < b.r1; ++t) {
      causal_softmax_row_backward(SerialRow{}, datt.at(b.s, b.h) + t * datt.ld, att.at(b.s, b.h) + t * att.ld, t,
                                  b.T);
    }
    host_sgemm(b.product(CausalProduct::lower, scale, datt, k, dq));
  }
};

// Backward by column blocks of P and dS (all of dS done): dv = P^T dy, dk = scale dS^T q,
// summed over the query heads of a key/value head (items: its blocks, `blocks` over NKV).
struct CausalAttentionBackwardColumns {
  CausalBlocks blocks;
  std::int64_t group;
  float scale;
  HeadMatrices dy, q, att, datt, dk, dv;
  void operator()(const std::int64_t item) const {
    CausalBlock b = blocks[item];
    const std::int64_t g = b.h;
    for (std::int64_t j = 0; j < group; ++j) {
      b.h = g * group + j;
      RowMajorGemm pv = b.product(CausalProduct::lower_transposed, 1.0f, att, dy, dv);
      RowMajorGemm sq = b.product(CausalProduct::lower_transposed, scale, datt, q, dk);
      pv.beta = sq.beta = j == 0 ? 0.0f : 1.0f;
      host_sgemm(pv);
      host_sgemm(sq);
    }
  }
};

template <class Exec, class Item>
void for_each_causal_block(const Exec& exec, const char* label, std::int64_t batch, const Item& item) {
  Kokkos::parallel_for(label,
                       Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, batch * item.blocks.blocks),
                       item);
}

// Attention's products in bf16 on a host's oneDNN (bf16 runs on a CPU with bf16
// instructions), with the numerics of PyTorch's bf16 autocast and of cuBLAS: operands in bf16,
// sums in fp32. Each product covers a block of query rows of every head of one sequence at
// once (oneDNN threads it), so that the block's fp32 scores are still in cache when its rows
// read them (a block of every sequence's heads, 12 MB at GPT-2 124M's 4 x 1024, was read back
// from memory), and skips what the causal mask zeroes, as the host BLAS's row blocks do.
// The scores (q k^T) and dP (dy v^T) read dense copies of a sequence's q or dy and of a
// block's keys or values (Bf16Operands) and write a block's fp32 rows; the other products read
// q, k, v and dy as the run stores them (bf16 rows), the probabilities as saved (bf16, in
// place) or (fused) a block's bf16 copy, and a block's score gradients rounded as the
// softmax's backward writes its rows. Fused backward recomputes the scores into
// AttentionWorkspace::probs. The output products write the output rounded into its storage
// as they sum it.
// Rows per block: 128. On a 2-core Xeon with AMX, GPT-2 124M's step (4 x 1024) was 3-4 %
// faster than with 64 in two alternating rounds, bench-torch's (T = 256, where 128 skips
// less of the mask) within its noise; on an EPYC 64 and 128 had been equal within 5 %, 32
// slower.
constexpr std::int64_t kBf16RowBlock = 128;

// The bf16 copies, in AttentionWorkspace::narrowed, and a block's fp32 scores or dP.
// oneDNN 2.6 runs its AMX kernels only on dense operands (no padding between the matrices of
// a batch either), so the scores' and dP's products (k = hd: the ones that ran slowest, 170-230
// GFLOP/s on q, k, v where they are) read dense copies (DenseRowBlocks, DenseKeys, BlockKeys)
// and write a dense block. Of the other four, the three that write fp32 gradients into the
// rows run oneDNN 2.6's AVX-512 kernels on dense operands too (measured), and the product with
// v reads the saved probabilities, whose rows are T long.
struct Bf16Operands {
  std::uint16_t* dy;  // (B*T, A) rows (backward)
  // A row block of one sequence's heads (NH, kBf16RowBlock, T):
  std::uint16_t* p;   // its probabilities (fused)
  std::uint16_t* ds;  // its score gradients (backward)
  std::uint16_t* rows;        // one sequence's q (forward) or dy (backward), DenseRowBlocks
  std::uint16_t* keys;        // its keys (forward) or values (backward), DenseKeys
  std::uint16_t* block_keys;  // the first keys or values a block meets, BlockKeys
  float* scores;              // its scores (forward) or dP (backward), dense_scores

  static std::int64_t block(std::int64_t NH, std::int64_t T) { return NH * kBf16RowBlock * T; }
  static std::int64_t copies(std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t hd) {
    return (B * T * NH * hd + 2 * block(NH, T) + 3 * T * NH * hd + 1) / 2;  // floats
  }
  // floats
  static std::int64_t size(std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t hd) {
    return copies(B, T, NH, hd) + block(NH, T);
  }
  static Bf16Operands in(float* narrowed, std::int64_t floats, std::int64_t B, std::int64_t T, std::int64_t NH,
                         std::int64_t hd) {
    if (floats < size(B, T, NH, hd)) {
      throw std::logic_error("lamina::attention: the bf16 operands exceed AttentionWorkspace::narrowed");
    }
    std::uint16_t* p = reinterpret_cast<std::uint16_t*>(narrowed);
    const std::int64_t NA = B * T * NH * hd, A = NH * hd;
    std::uint16_t* rows = p + NA + 2 * block(NH, T);
    return {p, p + NA, p + NA + block(NH, T), rows, rows + T * A, rows + 2 * T * A, narrowed + copies(B, T, NH, hd)};
  }
};

// Where query head h's rows of a block are in the dense copies: position j NKV + g for
// h = g G + j, so that group member j's batch over the key/value heads g is dense.
inline std::int64_t dense_position(std::int64_t h, std::int64_t NH, std::int64_t NKV) {
  const std::int64_t G = NH / NKV;
  return h % G * NKV + h / G;
}

// One sequence's query-shaped rows (q or dy: NH heads hd wide from column col0 of rows ld
// apart) copied block by block of kBf16RowBlock rows: the m rows of block [r0, r1) from
// r0 NH hd, head h's (m, hd) at dense_position(h).
struct DenseRowBlocks {
  const std::uint16_t* src;
  std::int64_t ld, col0;
  std::uint16_t* dst;
  std::int64_t T, NH, NKV, hd;
  void operator()(const std::int64_t item) const {  // item: t NH + h
    const std::int64_t t = item / NH, h = item % NH, r0 = t / kBf16RowBlock * kBf16RowBlock;
    const std::int64_t m = std::min(T - r0, kBf16RowBlock), at = dense_position(h, NH, NKV) * m + t - r0;
    std::memcpy(dst + r0 * NH * hd + at * hd, src + t * ld + col0 + h * hd, sizeof(std::uint16_t) * hd);
  }
};

// One sequence's T keys (or values) of its NKV heads, hd wide from column col0 of rows ld
// apart, as (NKV, T, hd).
struct DenseKeys {
  const std::uint16_t* src;
  std::int64_t ld, col0;
  std::uint16_t* dst;
  std::int64_t T, NKV, hd;
  void operator()(const std::int64_t item) const {  // item: key NKV + g
    const std::int64_t key = item / NKV, g = item % NKV;
    std::memcpy(dst + (g * T + key) * hd, src + key * ld + col0 + g * hd, sizeof(std::uint16_t) * hd);
  }
};

// The first r1 of them, (NKV, r1, hd): the block's batch over the heads, dense.
struct BlockKeys {
  const std::uint16_t* src;
  std::uint16_t* dst;
  std::int64_t T, r1, hd;
  void operator()(const std::int64_t g) const {
    std::memcpy(dst + g * r1 * hd, src + g * T * hd, sizeof(std::uint16_t) * r1 * hd);
  }
};

template <class Exec, class Copy>
void dense_copy(const Exec& exec, const char* label, std::int64_t items, const Copy& copy) {
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, items), copy);
  exec.fence();  // oneDNN reads the copy
}

// The first r1 keys (or values) in o.keys as a block's batch reads them: o.keys itself where
// they are all of them or one head's, else copied into o.block_keys.
template <class Exec>
const std::uint16_t* block_keys(const Exec& exec, const Bf16Operands& o, std::int64_t T, std::int64_t r1,
                                std::int64_t NKV, std::int64_t hd) {
  if (r1 == T || NKV == 1) return o.keys;
  dense_copy(exec, "lamina::attention_block_keys", NKV, BlockKeys{o.keys, o.block_keys, T, r1, hd});
  return o.block_keys;
}

// Matrix (s, h) of bf16 rows or scores, as HeadMatrices (group 1); a product's output
// rounded into bf16 (RoundedHeads).
struct HeadMatrices16 {
  const std::uint16_t* data = nullptr;
  std::int64_t ld = 0, seq_stride = 0, head_stride = 0;
};
struct RoundedHeads {
  std::uint16_t* data = nullptr;
  std::int64_t ld = 0, seq_stride = 0, head_stride = 0;
};

// Query heads g G + j (g = 0..NKV-1) of query-shaped matrices (q, dy, y, dq, the scores):
// the batch over (sequence, key/value head g) that reads key/value head g, for each j.
template <class M>
M group_member(M m, std::int64_t G, std::int64_t j) {
  m.data += j * m.head_stride;
  m.head_stride *= G;
  return m;
}

// A block's rows of every (sequence, head): rows r0.. of each matrix.
template <class M>
M from_row(M m, std::int64_t r0) {
  m.data += r0 * m.ld;
  return m;
}

// The product op(A) op(B) for every (sequence, head) of B x NH: op(A) m x k, op(B) k x n, C
// fp32 (HeadMatrices) or bf16 (RoundedHeads).
template <class C>
std::pair<RowMajorGemm, HeadBatch> head_batch(std::int64_t B, std::int64_t NH, char ta, char tb, std::int64_t m,
                                              std::int64_t n, std::int64_t k, const HeadMatrices16& a,
                                              const HeadMatrices16& b, const C& c) {
  RowMajorGemm g;
  g.ta = ta;
  g.tb = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = a.ld;
  g.ldb = b.ld;
  g.ldc = c.ld;
  HeadBatch batch;
  batch.sequences = B;
  batch.heads = NH;
  batch.a = {a.seq_stride, a.head_stride};
  batch.b = {b.seq_stride, b.head_stride};
  batch.c = {c.seq_stride, c.head_stride};
  return {g, batch};
}

// C = alpha op(A) op(B) + beta C for every (sequence, head) of B x NH.
inline void head_products(std::int64_t B, std::int64_t NH, char ta, char tb, std::int64_t m, std::int64_t n,
                          std::int64_t k, float alpha, const HeadMatrices16& a, const HeadMatrices16& b, float beta,
                          const HeadMatrices& c) {
  auto [g, batch] = head_batch(B, NH, ta, tb, m, n, k, a, b, c);
  g.alpha = alpha;
  g.beta = beta;
  g.c = c.data;
  host_gemm_bf16(g, a.data, b.data, batch);
}

// C = op(A) op(B), the fp32 sums rounded to nearest into the bf16 C as the product writes them.
inline void head_products(std::int64_t B, std::int64_t NH, char ta, char tb, std::int64_t m, std::int64_t n,
                          std::int64_t k, const HeadMatrices16& a, const HeadMatrices16& b, const RoundedHeads& c) {
  const auto [g, batch] = head_batch(B, NH, ta, tb, m, n, k, a, b, c);
  host_gemm_bf16_rounded(g, a.data, b.data, c.data, nullptr, batch);
}

// Rows r0..r0+m of the heads of one sequence, one item per row: i / m is the head, bh0 the
// sequence's first (sequence, head).
struct Bf16Rows {
  std::int64_t NH, T, r0, m, r1, bh0;
  std::int64_t bh(std::int64_t i) const { return bh0 + i / m; }
  std::int64_t t(std::int64_t i) const { return r0 + i % m; }
  float* row(const HeadMatrices& x, std::int64_t i) const { return x.at(bh(i) / NH, bh(i) % NH) + t(i) * x.ld; }
  // Row i of a block (NH, kBf16RowBlock, T), the one sequence's: a block's bf16 copy, or its
  // fp32 scores.
  template <class T_>
  T_* in_block(T_* x, std::int64_t i) const {
    return x + (i / m * kBf16RowBlock + i % m) * T;
  }
  // Row i of a block's dense fp32 scores or dP (NH, m, r1), heads at dense_position.
  float* dense(float* x, std::int64_t NKV, std::int64_t i) const {
    return x + (dense_position(i / m, NH, NKV) * m + i % m) * r1;
  }
  // Row t of (sequence, head) in saved (B*NH, T, width) rows.
  std::uint16_t* saved(std::uint16_t* x, std::int64_t width, std::int64_t i) const {
    return x + (bh(i) * T + t(i)) * width;
  }
};

// causal_softmax_row's probabilities of row t rounded into `out` (n >= t + 1 entries, past
// t: 0), the fp32 row written only up to t: the rows are scratch, and writing them whole and
// reading them back to round them doubled the memory the rows' pass moved.
KOKKOS_INLINE_FUNCTION RowSoftmax causal_softmax_row16(float* row, std::uint16_t* out, std::int64_t t, std::int64_t n,
                                                       float scale) {
  const RowSoftmax r = causal_exponentials(SerialRow{}, row, t, scale);
  const float inv = 1.0f / r.sum;
  for (std::int64_t j = 0; j < n; ++j) out[j] = j <= t ? to_bf16(row[j] * inv) : std::uint16_t{0};
  return r;
}

// Softmax of a block's (unscaled) dense score rows into probabilities, rounded into the
// saved probabilities up to the block's last row (in place: the products read no further,
// and the columns past it, half the saved rows, are left unwritten), or (fused: p16) into
// the block's bf16 copy with the rows' log-sum-exps saved. The products leave attention's
// scale to the rows: oneDNN 2's bf16 kernels would not fuse it.
struct Bf16SoftmaxRows {
  Bf16Rows rows;
  std::int64_t NKV;
  float* scores;
  std::uint16_t* saved;  // probabilities (in place) or log-sum-exps (fused)
  std::uint16_t* p16;    // fused, else null
  float scale;
  void operator()(const std::int64_t i) const {
    float* row = rows.dense(scores, NKV, i);
    if (p16 == nullptr) {
      causal_softmax_row16(row, rows.saved(saved, rows.T, i), rows.t(i), rows.r1, scale);
    } else {
      const RowSoftmax r = causal_softmax_row16(row, rows.in_block(p16, i), rows.t(i), rows.r1, scale);
      save_log_sum_exp(rows.saved(saved, 2, i), r.max + math::log(r.sum));
    }
  }
};

// widen(p[j]) * d[j]: a row's probabilities (fp32, or bf16 as saved) times dP, callable
// where SerialRow's loops are compiled for host and device alike.
template <class P>
struct ProbabilityTimes {
  const P* p;
  const float* d;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t j) const { return widen(p[j]) * d[j]; }
};

// Score gradients of a block's rows (dP dense, as the scores) from their probabilities: the
// saved bf16 ones (in place), or (fused) recomputed from the unscaled scores in P's rows and
// the saved log-sum-exps and rounded into the block's copy; the gradients times `scale`,
// which dq and dk carry, rounded into the block's copy (dP is scratch and not written).
struct Bf16SoftmaxBackwardRows {
  Bf16Rows rows;
  std::int64_t NKV;
  HeadMatrices P;
  float* dP;
  std::uint16_t* saved;  // probabilities (in place) or log-sum-exps (fused)
  bool fused;
  std::uint16_t *p16, *ds16;
  float scale;
  // dS = P * (dP - sum_j P dP) of row i (diagonal t), as causal_softmax_row_backward takes it
  template <class Prob>
  void round_gradients(std::int64_t i, std::int64_t t, const Prob* prow) const {
    const float* drow = rows.dense(dP, NKV, i);
    std::uint16_t* d16 = rows.in_block(ds16, i);
    const float dot = SerialRow{}.sum(t + 1, ProbabilityTimes<Prob>{prow, drow});
    for (std::int64_t j = 0; j < rows.r1; ++j) {
      d16[j] = j <= t ? to_bf16(scale * (widen(prow[j]) * (drow[j] - dot))) : std::uint16_t{0};
    }
  }
  void operator()(const std::int64_t i) const {
    const std::int64_t t = rows.t(i);
    if (fused) {
      float* prow = rows.row(P, i);
      const float l = load_log_sum_exp(rows.saved(saved, 2, i));
      for (std::int64_t j = 0; j <= t; ++j) prow[j] = fast_exp(scale * prow[j] - l);
      std::uint16_t* p = rows.in_block(p16, i);
      for (std::int64_t j = 0; j < rows.r1; ++j) p[j] = j <= t ? to_bf16(prow[j]) : std::uint16_t{0};
      round_gradients(i, t, static_cast<const float*>(prow));
    } else {
      round_gradients(i, t, static_cast<const std::uint16_t*>(rows.saved(saved, rows.T, i)));
    }
  }
};

// The matrices of sequence s alone.
template <class M>
M sequence(M m, std::int64_t s) {
  m.data += s * m.seq_stride;
  return m;
}

// Matrix (s, h) of bf16 (B*T, width) rows, heads hd wide from column col0.
inline HeadMatrices16 row_heads16(const std::uint16_t* rows, std::int64_t width, std::int64_t col0, std::int64_t T,
                                  std::int64_t hd) {
  return {rows + col0, width, T * width, hd};
}

// A row block's bf16 copy (NH, kBf16RowBlock, T), one sequence's.
inline HeadMatrices16 block_heads16(const std::uint16_t* block, std::int64_t NH, std::int64_t T) {
  return {block, T, NH * kBf16RowBlock * T, kBf16RowBlock * T};
}

// Saved (B*NH, T, T) bf16 probabilities.
inline HeadMatrices16 score_heads16(const std::uint16_t* saved, std::int64_t NH, std::int64_t T) {
  return {saved, T, NH * T * T, T * T};
}

template <class Exec, class Item>
void for_each_row(const Exec& exec, const char* label, std::int64_t NH, const Item& item) {
  Kokkos::parallel_for(label, Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, NH * item.rows.m),
                       item);
  exec.fence();  // oneDNN reads what the rows wrote
}

// What both passes start from: the shapes, the softmax scale, q, k, v in the stored rows
// (k and v as the batches over (sequence, key/value head) see them).
struct Bf16Pass {
  std::int64_t N, B, A, G;
  float scale;
  HeadMatrices16 q, k, v;

  template <class V>
  Bf16Pass(const V& qkv, const QkvLayout& L, std::int64_t T)
      : N(static_cast<std::int64_t>(qkv.extent(0))),
        B(N / T),
        A(L.NH * L.hd),
        G(L.group()),
        scale(1.0f / math::sqrt(static_cast<float>(L.hd))),
        q(row_heads16(qkv.data(), L.width(), L.column(0), T, L.hd)),
        k(row_heads16(qkv.data(), L.width(), L.column(1), T, L.hd)),
        v(row_heads16(qkv.data(), L.width(), L.column(2), T, L.hd)) {}
};

// The scores (forward) or dP (backward) of block [r0, r0 + m) of a sequence's query heads
// against its first r1 keys, from the dense copies into the dense fp32 block (NH, m, r1):
// A = the block's rows (DenseRowBlocks), B^T = the keys (DenseKeys), once per group member.
template <class Exec>
void dense_scores(const Exec& exec, const Bf16Operands& o, std::int64_t r0, std::int64_t m, std::int64_t r1,
                  const QkvLayout& L, std::int64_t T) {
  const std::int64_t NH = L.NH, NKV = L.NKV, hd = L.hd;
  const HeadMatrices16 keys{block_keys(exec, o, T, r1, NKV, hd), hd, NKV * r1 * hd, r1 * hd};
  for (std::int64_t j = 0; j < L.group(); ++j) {
    const HeadMatrices16 a{o.rows + (r0 * NH + j * NKV * m) * hd, hd, NKV * m * hd, m * hd};
    const HeadMatrices c{o.scores + j * NKV * m * r1, r1, NKV * m * r1, m * r1};
    head_products(1, NKV, 'N', 'T', m, r1, hd, 1.0f, a, keys, 0.0f, c);
  }
}

// y = softmax(scale q k^T) v by row blocks into `out` (bf16, rounded as the products write
// it), a sequence at a time. in place: the probabilities saved in `att` (B*NH, T, T); fused:
// the log-sum-exps saved in `att` (B*NH, T, 2).
template <class Exec>
void bf16_attention_forward(const Exec& exec, const Mat16<Exec>& out, const Mats16<Exec>& att, const Mat16<Exec>& qkv,
                            bool fused, const Vec<Exec>& narrowed, const QkvLayout& L, std::int64_t T) {
  const Bf16Pass b(qkv, L, T);
  const std::int64_t B = b.B, hd = L.hd, NH = L.NH, NKV = L.NKV, G = b.G, W = L.width();
  const Bf16Operands o = Bf16Operands::in(narrowed.data(), static_cast<std::int64_t>(narrowed.extent(0)), B, T, NH, hd);
  std::uint16_t* p16 = fused ? o.p : nullptr;
  const HeadMatrices16& v = b.v;
  const HeadMatrices16 p = fused ? block_heads16(p16, NH, T) : score_heads16(att.data(), NH, T);
  const RoundedHeads y{out.data(), b.A, T * b.A, hd};
  exec.fence();  // q, k, v written
  for (std::int64_t s = 0; s < B; ++s) {
    const std::uint16_t* rows = qkv.data() + s * T * W;
    dense_copy(exec, "lamina::attention_dense_rows", T * NH,
               DenseRowBlocks{rows, W, L.column(0), o.rows, T, NH, NKV, hd});
    dense_copy(exec, "lamina::attention_dense_keys", T * NKV, DenseKeys{rows, W, L.column(1), o.keys, T, NKV, hd});
    for (std::int64_t r0 = 0; r0 < T; r0 += kBf16RowBlock) {
      const std::int64_t r1 = std::min(T, r0 + kBf16RowBlock), m = r1 - r0;
      dense_scores(exec, o, r0, m, r1, L, T);
      for_each_row(exec, "lamina::attention_forward_bf16_rows", NH,
                   Bf16SoftmaxRows{{NH, T, r0, m, r1, s * NH}, NKV, o.scores, att.data(), p16, b.scale});
      for (std::int64_t j = 0; j < G; ++j) {
        head_products(1, NKV, 'N', 'N', m, hd, r1, group_member(fused ? p : from_row(sequence(p, s), r0), G, j),
                      sequence(v, s), group_member(from_row(sequence(y, s), r0), G, j));
      }
    }
  }
}

// dqkv from dy (the output gradient, (B T, NH hd) bf16 rows) by row blocks, last first, a
// sequence at a time: dP = dy v^T, dS = the softmax's backward,
// dq = (scale dS) k for the block's rows; dv += P^T dy and dk += (scale dS)^T q for the rows up
// to the block's last (the last block covers them all and starts the sums). att: the saved
// probabilities, or (fused) log-sum-exps, with the probabilities recomputed into P.
template <class Exec>
void bf16_attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const std::uint16_t* dout,
                             const Mat16<Exec>& qkv, const Mats16<Exec>& att, bool fused, const HeadMatrices& P,
                             const Vec<Exec>& narrowed, const QkvLayout& L, std::int64_t T) {
  const Bf16Pass b(qkv, L, T);
  const std::int64_t B = b.B, A = b.A, hd = L.hd, NH = L.NH, NKV = L.NKV, G = b.G, W = L.width();
  const Bf16Operands o = Bf16Operands::in(narrowed.data(), static_cast<std::int64_t>(narrowed.extent(0)), B, T, NH, hd);
  exec.fence();  // dy written
  const HeadMatrices16 &q = b.q, &k = b.k, dy = row_heads16(dout, A, 0, T, hd),
                       p = fused ? block_heads16(o.p, NH, T) : score_heads16(att.data(), NH, T),
                       ds = block_heads16(o.ds, NH, T);
  const HeadMatrices dq = row_heads<Exec>(dqkv, L.column(0), T, hd), dk = row_heads<Exec>(dqkv, L.column(1), T, hd),
                     dv = row_heads<Exec>(dqkv, L.column(2), T, hd);
  const std::int64_t last = (T - 1) / kBf16RowBlock * kBf16RowBlock;
  // Each product batched over (sequence, key/value head), once per query head j of a group;
  // dk and dv sum over the group's query heads.
  auto each = [G](auto&& product) {
    for (std::int64_t j = 0; j < G; ++j) product(j);
  };
  for (std::int64_t s = 0; s < B; ++s) {
    const std::uint16_t* rows = qkv.data() + s * T * W;
    dense_copy(exec, "lamina::attention_dense_rows", T * NH,
               DenseRowBlocks{dout + s * T * A, A, 0, o.rows, T, NH, NKV, hd});
    dense_copy(exec, "lamina::attention_dense_keys", T * NKV, DenseKeys{rows, W, L.column(2), o.keys, T, NKV, hd});
    for (std::int64_t r0 = last; r0 >= 0; r0 -= kBf16RowBlock) {
      const std::int64_t r1 = std::min(T, r0 + kBf16RowBlock), m = r1 - r0;
      const float sums = r0 == last ? 0.0f : 1.0f;
      const auto at = [s, r0](const auto& x) { return from_row(sequence(x, s), r0); };
      if (fused) {
        each([&](std::int64_t j) {
          head_products(1, NKV, 'N', 'T', m, r1, hd, 1.0f, group_member(at(q), G, j), sequence(k, s), 0.0f,
                        group_member(at(P), G, j));
        });
      }
      dense_scores(exec, o, r0, m, r1, L, T);
      for_each_row(exec, "lamina::attention_backward_bf16_rows", NH,
                   Bf16SoftmaxBackwardRows{{NH, T, r0, m, r1, s * NH}, NKV, P, o.scores, att.data(), fused, o.p, o.ds,
                                           b.scale});
      each([&](std::int64_t j) {
        head_products(1, NKV, 'N', 'N', m, hd, r1, 1.0f, group_member(ds, G, j), sequence(k, s), 0.0f,
                      group_member(at(dq), G, j));
      });
      each([&](std::int64_t j) {
        head_products(1, NKV, 'T', 'N', r1, hd, m, 1.0f, group_member(fused ? p : at(p), G, j),
                      group_member(at(dy), G, j), j == 0 ? sums : 1.0f, sequence(dv, s));
      });
      each([&](std::int64_t j) {
        head_products(1, NKV, 'T', 'N', r1, hd, m, 1.0f, group_member(ds, G, j), group_member(at(q), G, j),
                      j == 0 ? sums : 1.0f, sequence(dk, s));
      });
    }
  }
}

}  // namespace detail

// How attention_forward and attention_backward run (AttentionProducts, core/config.hpp).
// in_place: on a host BLAS, per (sequence, head) and row block, straight from and into the
// rows, without the blocks the mask zeroes, each block's softmax taken while its scores are
// in cache. fused: only each row's log-sum-exp is saved and backward recomputes the
// probabilities: on a host BLAS as in_place, the probabilities of one layer at a time in
// AttentionWorkspace::probs; on a device in kernels that keep them in team scratch
// (kernels/flash_attention.hpp). staged: per-head copies in AttentionWorkspace, whole
// batched products and a softmax kernel of one team per row (a host with another BLAS); its
// products take `math` (ProductMath: on CUDA, bf16 tensor cores). On bf16 storage, in_place
// and fused on a host run their products in bf16 on oneDNN where `math` is bf16 (a CPU with
// bf16 instructions), by row blocks of one sequence batched over heads; device kernels are fp32.
// The default is what the backend runs fastest; in_place needs a host BLAS it can call. On
// a device that is staged: the fused kernels compute without tensor cores, and GPT-2 124M's
// bf16 step (16 x 1024 tokens, an H200) took 965 ms with them against 433 ms staged. fused
// keeps no probabilities, for sequences whose B·heads·T² do not fit.
constexpr AttentionProducts kDeviceAttentionProducts = AttentionProducts::staged;
template <class Exec>
constexpr AttentionProducts kAttentionProducts =
    kHostBlasLinked && Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible ? AttentionProducts::in_place
                                                                                      : kDeviceAttentionProducts;

// Whether the host BLAS products (in_place, and fused on a host) can run on Exec.
template <class Exec>
constexpr bool kAttentionInPlace = kAttentionProducts<Exec> == AttentionProducts::in_place;

// Columns per score row that attention_forward saves for backward: the probabilities, or
// (fused) the row's log-sum-exp in two parts.
constexpr std::int64_t saved_attention_columns(AttentionProducts how, std::int64_t T) {
  return how == AttentionProducts::fused ? 2 : T;
}

// Scratch of one layer's attention. Staged products: per-head (B*NH, T, hd) copies;
// forward q, k, v, y; backward q, k, v (may share dqkv's memory: written last), y for dy,
// and dq, dk, dv. Fused products on a host BLAS: probs, (B*NH, T, T) probabilities. bf16
// products on a host's oneDNN: narrowed, their operands rounded to bf16
// (attention_scratch() floats). The other ways leave them untouched.
// Where attention on bf16 storage has no bf16 way of its own (attention_stores_bf16 false),
// qkv32, y32 and att32: fp32 copies of q, k, v, the output and what is saved, on which it runs
// as an fp32 run does.
template <class Exec>
struct AttentionWorkspace {
  Mats<Exec> q, k, v, y;
  Mats<Exec> dq, dk, dv;
  Mats<Exec> probs;
  Vec<Exec> narrowed;
  Mat<Exec> qkv32, y32;
  Mats<Exec> att32;
};

// Whether attention run `how` with products in `math` on Exec has its products on a host's
// oneDNN in bf16.
template <class Exec>
bool attention_on_host_bf16(AttentionProducts how, ProductMath math) {
  return kAttentionInPlace<Exec> && how != AttentionProducts::staged && math == ProductMath::bf16 &&
         detail::bf16_engine<Exec>();
}

// Whether staged products in bf16 run on Exec's bf16 engine (cuBLAS, a host's oneDNN) on
// bf16 copies of q, k, v and dy, the saved bf16 probabilities and the score gradients
// rounded to bf16.
template <class Exec>
bool attention_staged_bf16(AttentionProducts how, ProductMath math) {
  return how == AttentionProducts::staged && math == ProductMath::bf16 && detail::bf16_engine<Exec>();
}

// Whether attention reads and writes bf16 storage as it is (else through fp32 copies): on a
// host's oneDNN, in a device's fused kernels, and in staged products in bf16.
template <class Exec>
bool attention_stores_bf16(AttentionProducts how, ProductMath math) {
  return attention_on_host_bf16<Exec>(how, math) || (!kAttentionInPlace<Exec> && how == AttentionProducts::fused) ||
         attention_staged_bf16<Exec>(how, math);
}

// Floats of the fp32 copies that attention on bf16 storage takes, with NKV key/value heads
// and T rows of each sequence meeting `keys` keys (T; context parallelism: the sequence's):
// qkv32, y32 and att32 where it has no bf16 way of its own.
template <class Exec>
std::int64_t attention_copies(AttentionProducts how, ProductMath math, std::int64_t B, std::int64_t T, std::int64_t NH,
                              std::int64_t hd, std::int64_t NKV, std::int64_t keys) {
  if (attention_stores_bf16<Exec>(how, math)) return 0;
  return B * T * (2 * NH + 2 * NKV) * hd + B * NH * T * saved_attention_columns(how, keys);
}

// Points ws's fp32 copies (attention_copies() floats from p) at their places.
template <class Exec>
void place_attention_copies(AttentionWorkspace<Exec>& ws, float* p, AttentionProducts how, ProductMath math,
                            std::int64_t B, std::int64_t T, std::int64_t NH, std::int64_t hd, std::int64_t NKV,
                            std::int64_t keys) {
  const std::int64_t N = B * T, A = NH * hd, W = A + 2 * NKV * hd;
  if (attention_copies<Exec>(how, math, B, T, NH, hd, NKV, keys) == 0) return;
  ws.qkv32 = as_mat<Exec>(p, N, W);
  ws.y32 = as_mat<Exec>(p + N * W, N, A);
  ws.att32 = as_mats<Exec>(p + N * (W + A), B * NH, T, saved_attention_columns(how, keys));
}

// Floats of AttentionWorkspace::narrowed that attention takes on Exec (0: none).
template <class Exec>
std::int64_t attention_scratch(AttentionProducts how, ProductMath math, std::int64_t B, std::int64_t T,
                               std::int64_t NH, std::int64_t hd) {
  return attention_on_host_bf16<Exec>(how, math) ? detail::Bf16Operands::size(B, T, NH, hd) : 0;
}

namespace detail {

// The staged copies that batched products over (sequence, key/value head) take: query head
// j of each group (staged_head's order: contiguous), and the key or value heads.
template <class Exec>
Mats<Exec> staged_group(const Mats<Exec>& m, const QkvLayout& L, std::int64_t B, std::int64_t j) {
  const std::int64_t n = B * L.NKV, rows = static_cast<std::int64_t>(m.extent(1)),
                     cols = static_cast<std::int64_t>(m.extent(2));
  return as_mats<Exec>(m.data() + j * n * rows * cols, n, rows, cols);
}
template <class Exec>
Mats16<Exec> staged_group(const Mats16<Exec>& m, const QkvLayout& L, std::int64_t B, std::int64_t j) {
  const std::int64_t n = B * L.NKV, rows = static_cast<std::int64_t>(m.extent(1)),
                     cols = static_cast<std::int64_t>(m.extent(2));
  return Mats16<Exec>(m.data() + j * n * rows * cols, n, rows, cols);
}
template <class Exec>
Mats<Exec> staged_kv(const Mats<Exec>& m, const QkvLayout& L, std::int64_t B) {
  return staged_group<Exec>(m, L, B, 0);
}

// A bf16 copy of m's shape in the first half of m's memory.
template <class Exec>
Mats16<Exec> halves(const Mats<Exec>& m) {
  return Mats16<Exec>(reinterpret_cast<std::uint16_t*>(m.data()), m.extent(0), m.extent(1), m.extent(2));
}

// The fp32 copy of bf16 [q | k | v] rows, in their shape.
template <class Exec>
Mat<Exec> shaped_like(const Mat<Exec>& copy, const Mat16<Exec>& rows) {
  return as_mat<Exec>(copy.data(), static_cast<std::int64_t>(rows.extent(0)),
                      static_cast<std::int64_t>(rows.extent(1)));
}

// [q | k | v] rows into staged copies; under context parallelism q alone, the keys and values
// of every position being in place already (ring_place_keys_values).
template <class Exec, class Rows, class Heads>
void split_staged(const Exec& exec, const char* label, const Rows& qkv, const Heads& q, const Heads& k,
                  const Heads& v, const QkvLayout& L, const ContextChunks& chunks) {
  if (chunks.cp > 1) {
    split_heads(exec, label, qkv, 0, q, L, false);
  } else {
    permute_heads(exec, label, qkv, q, k, v, L, false);
  }
}

// Staged gradients back into dqkv's rows; under context parallelism dq alone, dk and dv of
// every position staying for the ring (ring_take_key_value_gradients).
template <class Exec>
void merge_staged(const Exec& exec, const char* label, const Mat<Exec>& dqkv, const Mats<Exec>& dq,
                  const Mats<Exec>& dk, const Mats<Exec>& dv, const QkvLayout& L, const ContextChunks& chunks) {
  if (chunks.cp > 1) {
    split_heads(exec, label, dqkv, 0, dq, L, true);
  } else {
    permute_heads(exec, label, dqkv, dq, dk, dv, L, true);
  }
}

// Staged products in bf16 (attention_staged_bf16) on bf16 storage: q, k, v copied per head
// as they are stored, into the first half of the staged copies' fp32 memory; the scores
// rounded into the saved rows by their product, the softmax (scaled there) turning them into
// the probabilities in place, which the output's products read as saved; the output in fp32
// (ws.y), rounded into its rows.
template <class Exec>
void staged_bf16_attention_forward(const Exec& exec, const Mat16<Exec>& out, const Mats16<Exec>& att,
                                   const Mat16<Exec>& qkv, const AttentionWorkspace<Exec>& ws, const QkvLayout& L,
                                   const ContextChunks& chunks) {
  const ScoreRows r = ScoreRows::of(att, chunks);
  const std::int64_t BNH = static_cast<std::int64_t>(att.extent(0)), B = BNH / L.NH;
  const float scale = 1.0f / math::sqrt(static_cast<float>(L.hd));
  const Mats16<Exec> q = halves<Exec>(ws.q), k = halves<Exec>(staged_kv<Exec>(ws.k, L, B)),
                     v = halves<Exec>(staged_kv<Exec>(ws.v, L, B));
  split_staged(exec, "lamina::attention_forward_split", qkv, q, k, v, L, chunks);
  for (std::int64_t j = 0; j < L.group(); ++j) {
    batched_gemm_bf16(exec, "N", "T", staged_group<Exec>(q, L, B, j), k, staged_group<Exec>(att, L, B, j));
  }
  Kokkos::parallel_for("lamina::attention_forward_softmax", Teams<Exec>(exec, r.count(BNH), Kokkos::AUTO),
                       AttentionSoftmaxForward16<Exec>{att, scale, r});
  for (std::int64_t j = 0; j < L.group(); ++j) {
    batched_gemm_bf16(exec, "N", "N", 1.0f, staged_group<Exec>(att, L, B, j), v, 0.0f,
                      staged_group<Exec>(ws.y, L, B, j));
  }
  split_heads(exec, "lamina::attention_forward_merge", out, 0, ws.y, L, true);
}

// Its backward: dy rounded into bf16 copies (ws.y's memory), q, k and v copied again; dP
// rounded into bf16 by its product (in datt's memory), the score gradients with attention's
// scale in place of it; dq, dk, dv in fp32 (dk, dv summed over each group), into dqkv's rows
// (context parallelism: dq alone, dk and dv of every position left in ws.dk, ws.dv).
template <class Exec>
void staged_bf16_attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const Mats<Exec>& datt,
                                    const Mat<Exec>& dout, const Mat16<Exec>& qkv, const Mats16<Exec>& att,
                                    const AttentionWorkspace<Exec>& ws, const QkvLayout& L,
                                    const ContextChunks& chunks) {
  const ScoreRows r = ScoreRows::of(att, chunks);
  const std::int64_t BNH = static_cast<std::int64_t>(att.extent(0)), B = BNH / L.NH, G = L.group();
  const float scale = 1.0f / math::sqrt(static_cast<float>(L.hd));
  const Mats16<Exec> dy = halves<Exec>(ws.y), q = halves<Exec>(ws.q), k = halves<Exec>(staged_kv<Exec>(ws.k, L, B)),
                     v = halves<Exec>(staged_kv<Exec>(ws.v, L, B)), ds = halves<Exec>(datt);
  const Mats<Exec> dk = staged_kv<Exec>(ws.dk, L, B), dv = staged_kv<Exec>(ws.dv, L, B);
  split_heads(exec, "lamina::attention_backward_split", dout, 0, dy, L, false);
  split_staged(exec, "lamina::attention_backward_split_qkv", qkv, q, k, v, L, chunks);
  for (std::int64_t j = 0; j < G; ++j) {  // dP = dy v^T; dv = sum over the group of P^T dy
    const Mats16<Exec> dyj = staged_group<Exec>(dy, L, B, j);
    batched_gemm_bf16(exec, "N", "T", dyj, v, staged_group<Exec>(ds, L, B, j));
    batched_gemm_bf16(exec, "T", "N", 1.0f, staged_group<Exec>(att, L, B, j), dyj, j == 0 ? 0.0f : 1.0f, dv);
  }
  Kokkos::parallel_for("lamina::attention_backward_softmax", Teams<Exec>(exec, r.count(BNH), Kokkos::AUTO),
                       AttentionSoftmaxBackward16<Exec>{att, ds, scale, r});
  for (std::int64_t j = 0; j < G; ++j) {  // dq = dS k; dk = sum over the group of dS^T q
    const Mats16<Exec> dsj = staged_group<Exec>(ds, L, B, j);
    batched_gemm_bf16(exec, "N", "N", 1.0f, dsj, k, 0.0f, staged_group<Exec>(ws.dq, L, B, j));
    batched_gemm_bf16(exec, "T", "N", 1.0f, dsj, staged_group<Exec>(q, L, B, j), j == 0 ? 0.0f : 1.0f, dk);
  }
  merge_staged(exec, "lamina::attention_backward_merge", dqkv, ws.dq, dk, dv, L, chunks);
}

}  // namespace detail

// out: (B*T, NH hd) attention output before the projection, saved
// att: (B*NH, T, saved_attention_columns(how, T)) probabilities or log-sum-exps, saved
// qkv: (B*T, (NH + 2 NKV) hd) output of the QKV projection, saved (kernels/qkv_layout.hpp)
// The staged products take ws.k and ws.v as (B*NKV, T, hd).
// chunks: context parallelism on staged products (cp > 1): T is the rank's rows of each
// sequence, the queries at chunks' positions, against the keys and values of all chunks.T
// positions, placed in ws.k and ws.v beforehand (ring_place_keys_values); att (B*NH, T,
// chunks.T).
template <class Exec>
void attention_forward(const Exec& exec, const Mat<Exec>& out, const Mats<Exec>& att, const Mat<Exec>& qkv,
                       const AttentionWorkspace<Exec>& ws, std::int64_t NH,
                       AttentionProducts how = kAttentionProducts<Exec>, ProductMath math = ProductMath::fp32,
                       const ContextChunks& chunks = {}) {
  const std::int64_t BNH = static_cast<std::int64_t>(att.extent(0));
  const std::int64_t T = static_cast<std::int64_t>(att.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(out.extent(1)) / NH;
  const QkvLayout L = QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, hd);
  const float scale = 1.0f / math::sqrt(static_cast<float>(hd));
  if constexpr (kAttentionInPlace<Exec>) {
    if (how != AttentionProducts::staged) {
      using detail::qkv_heads;
      const bool fused = how == AttentionProducts::fused;
      detail::for_each_causal_block(
          exec, "lamina::attention_forward_blocks", BNH,
          detail::CausalAttentionForward{detail::CausalBlocks(NH, T, hd), scale, qkv_heads<Exec>(qkv, L, 0, T),
                                         qkv_heads<Exec>(qkv, L, 1, T), qkv_heads<Exec>(qkv, L, 2, T),
                                         detail::score_heads<Exec>(fused ? ws.probs : att, NH),
                                         detail::row_heads<Exec>(out, 0, T, hd), fused ? att.data() : nullptr});
      return;
    }
  }
  if (how == AttentionProducts::fused) {
    flash_attention_forward(exec, out, att, qkv, NH);
    return;
  }
  const std::int64_t B = BNH / NH;
  const detail::ScoreRows r = detail::ScoreRows::of(att, chunks);
  const Mats<Exec> k = detail::staged_kv<Exec>(ws.k, L, B), v = detail::staged_kv<Exec>(ws.v, L, B);
  detail::split_staged(exec, "lamina::attention_forward_split", qkv, ws.q, k, v, L, chunks);
  for (std::int64_t j = 0; j < L.group(); ++j) {
    batched_gemm<Exec>(exec, "N", "T", scale, detail::staged_group<Exec>(ws.q, L, B, j), k, 0.0f,
                       detail::staged_group<Exec>(att, L, B, j), math);
  }
  Kokkos::parallel_for("lamina::attention_forward_softmax", Teams<Exec>(exec, r.count(BNH), Kokkos::AUTO),
                       detail::AttentionSoftmaxForward<Exec>{att, r});
  for (std::int64_t j = 0; j < L.group(); ++j) {
    batched_gemm<Exec>(exec, "N", "N", 1.0f, detail::staged_group<Exec>(att, L, B, j), v, 0.0f,
                       detail::staged_group<Exec>(ws.y, L, B, j), math);
  }
  detail::split_heads(exec, "lamina::attention_forward_merge", out, 0, ws.y, L, true);
}

// dqkv: (B*T, (NH + 2 NKV) hd) overwritten; datt: (B*NH, T, T) workspace (a device's fused
// products keep it in team scratch instead); dout: (B*T, NH hd); qkv, out, att: as
// attention_forward saved them. The staged products take ws.k, ws.v, ws.dk and ws.dv as
// (B*NKV, T, hd). chunks: as attention_forward's; then only dqkv's q columns are written, and
// the keys' and values' gradients of every position are left in ws.dk and ws.dv
// (ring_take_key_value_gradients).
template <class Exec>
void attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const Mats<Exec>& datt, const Mat<Exec>& dout,
                        const Mat<Exec>& qkv, const Mat<Exec>& out, const Mats<Exec>& att,
                        const AttentionWorkspace<Exec>& ws, std::int64_t NH,
                        AttentionProducts how = kAttentionProducts<Exec>, ProductMath math = ProductMath::fp32,
                        const ContextChunks& chunks = {}) {
  const std::int64_t BNH = static_cast<std::int64_t>(att.extent(0));
  const std::int64_t T = static_cast<std::int64_t>(att.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(dout.extent(1)) / NH;
  const QkvLayout L = QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, hd);
  const float scale = 1.0f / math::sqrt(static_cast<float>(hd));
  if constexpr (kAttentionInPlace<Exec>) {
    if (how != AttentionProducts::staged) {
      using detail::qkv_heads;
      const detail::CausalBlocks blocks(NH, T, hd);
      const detail::HeadMatrices dS = detail::score_heads<Exec>(datt, NH), dy = detail::row_heads<Exec>(dout, 0, T, hd),
                                 q = qkv_heads<Exec>(qkv, L, 0, T), k = qkv_heads<Exec>(qkv, L, 1, T);
      detail::HeadMatrices P = detail::score_heads<Exec>(att, NH);
      if (how == AttentionProducts::fused) {
        P = detail::score_heads<Exec>(ws.probs, NH);
        detail::for_each_causal_block(exec, "lamina::attention_backward_probabilities", BNH,
                                      detail::CausalAttentionProbabilities{blocks, scale, q, k, P, att.data()});
      }
      detail::for_each_causal_block(
          exec, "lamina::attention_backward_row_blocks", BNH,
          detail::CausalAttentionBackwardRows{blocks, scale, dy, q, k, qkv_heads<Exec>(qkv, L, 2, T), P, dS,
                                              qkv_heads<Exec>(dqkv, L, 0, T)});
      // By key/value head: each sums its query heads' contributions.
      detail::for_each_causal_block(exec, "lamina::attention_backward_column_blocks", BNH / L.group(),
                                    detail::CausalAttentionBackwardColumns{detail::CausalBlocks(L.NKV, T, hd),
                                                                           L.group(), scale, dy, q, P, dS,
                                                                           qkv_heads<Exec>(dqkv, L, 1, T),
                                                                           qkv_heads<Exec>(dqkv, L, 2, T)});
      return;
    }
  }
  if (how == AttentionProducts::fused) {
    flash_attention_backward(exec, dqkv, dout, qkv, out, att, NH);
    return;
  }
  const std::int64_t B = BNH / NH, G = L.group();
  using detail::staged_group;
  const Mats<Exec> k = detail::staged_kv<Exec>(ws.k, L, B), v = detail::staged_kv<Exec>(ws.v, L, B),
                   dk = detail::staged_kv<Exec>(ws.dk, L, B), dv = detail::staged_kv<Exec>(ws.dv, L, B);
  const detail::ScoreRows r = detail::ScoreRows::of(att, chunks);
  detail::split_heads(exec, "lamina::attention_backward_split", dout, 0, ws.y, L, false);
  detail::split_staged(exec, "lamina::attention_backward_split_qkv", qkv, ws.q, k, v, L, chunks);
  for (std::int64_t j = 0; j < G; ++j) {  // dP = dy v^T; dv = sum over the group of P^T dy
    const Mats<Exec> dy = staged_group<Exec>(ws.y, L, B, j);
    batched_gemm<Exec>(exec, "N", "T", 1.0f, dy, v, 0.0f, staged_group<Exec>(datt, L, B, j), math);
    batched_gemm<Exec>(exec, "T", "N", 1.0f, staged_group<Exec>(att, L, B, j), dy, j == 0 ? 0.0f : 1.0f, dv, math);
  }
  Kokkos::parallel_for("lamina::attention_backward_softmax", Teams<Exec>(exec, r.count(BNH), Kokkos::AUTO),
                       detail::AttentionSoftmaxBackward<Exec>{datt, att, r});
  for (std::int64_t j = 0; j < G; ++j) {  // dq = scale dS k; dk = sum over the group of scale dS^T q
    const Mats<Exec> dS = staged_group<Exec>(datt, L, B, j);
    batched_gemm<Exec>(exec, "N", "N", scale, dS, k, 0.0f, staged_group<Exec>(ws.dq, L, B, j), math);
    batched_gemm<Exec>(exec, "T", "N", scale, dS, staged_group<Exec>(ws.q, L, B, j), j == 0 ? 0.0f : 1.0f, dk, math);
  }
  detail::merge_staged(exec, "lamina::attention_backward_merge", dqkv, ws.dq, dk, dv, L, chunks);
}

// Attention on bf16 storage (bf16 runs): qkv, out and att as attention_forward's, stored in
// bf16. On a host's oneDNN, in a device's fused kernels and in staged products on a bf16
// engine they are read and written as they are; elsewhere attention runs on fp32 copies of
// them in AttentionWorkspace (qkv32, y32, att32).
template <class Exec>
void attention_forward(const Exec& exec, const Mat16<Exec>& out, const Mats16<Exec>& att, const Mat16<Exec>& qkv,
                       const AttentionWorkspace<Exec>& ws, std::int64_t NH,
                       AttentionProducts how = kAttentionProducts<Exec>, ProductMath math = ProductMath::fp32,
                       const ContextChunks& chunks = {}) {
  const std::int64_t T = static_cast<std::int64_t>(att.extent(1));
  if (attention_staged_bf16<Exec>(how, math)) {
    const std::int64_t width = static_cast<std::int64_t>(out.extent(1));
    detail::staged_bf16_attention_forward(
        exec, out, att, qkv, ws, QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, width / NH), chunks);
    return;
  }
  if constexpr (kAttentionInPlace<Exec>) {
    if (attention_on_host_bf16<Exec>(how, math)) {
      const bool fused = how == AttentionProducts::fused;
      const std::int64_t width = static_cast<std::int64_t>(out.extent(1));
      const QkvLayout L = QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, width / NH);
      detail::bf16_attention_forward(exec, out, att, qkv, fused, ws.narrowed, L, T);
      return;
    }
  } else if (how == AttentionProducts::fused) {  // a device's fused kernels
    flash_attention_forward(exec, out, att, qkv, NH);
    return;
  }
  const Mat<Exec> qkv32 = detail::shaped_like<Exec>(ws.qkv32, qkv);
  from_bf16(exec, as_vec<Exec>(qkv32.data(), static_cast<std::int64_t>(qkv.size())),
            Bf16Vec<Exec>(qkv.data(), qkv.size()));
  attention_forward(exec, ws.y32, ws.att32, qkv32, ws, NH, how, math, chunks);
  to_bf16(exec, Bf16Vec<Exec>(att.data(), att.size()), ConstVec<Exec>(ws.att32.data(), static_cast<std::int64_t>(att.size())));
  to_bf16(exec, Bf16Vec<Exec>(out.data(), out.size()), ConstVec<Exec>(ws.y32.data(), static_cast<std::int64_t>(out.size())));
}

// attention_backward with its output gradient already in bf16 (dout: (B T, NH hd) rows, as
// a product that rounds writes them), attention on a host's oneDNN only
// (attention_on_host_bf16): no pass rounds it.
template <class Exec>
void attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const ConstMat16<Exec>& dout,
                        const Mat16<Exec>& qkv, const Mat16<Exec>& out, const Mats16<Exec>& att,
                        const AttentionWorkspace<Exec>& ws, std::int64_t NH, AttentionProducts how, ProductMath math) {
  if (!attention_on_host_bf16<Exec>(how, math) || dout.extent(1) != out.extent(1) ||
      static_cast<std::int64_t>(dout.stride_0()) != static_cast<std::int64_t>(out.extent(1))) {
    throw std::logic_error("lamina::attention_backward: a bf16 output gradient is for attention on a host's oneDNN");
  }
  if constexpr (kAttentionInPlace<Exec>) {
    const std::int64_t T = static_cast<std::int64_t>(att.extent(1)), hd = static_cast<std::int64_t>(out.extent(1)) / NH;
    const bool fused = how == AttentionProducts::fused;
    detail::bf16_attention_backward(exec, dqkv, dout.data(), qkv, att, fused,
                                    fused ? detail::score_heads<Exec>(ws.probs, NH) : detail::HeadMatrices{},
                                    ws.narrowed, QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, hd), T);
  }
}

template <class Exec>
void attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const Mats<Exec>& datt, const Mat<Exec>& dout,
                        const Mat16<Exec>& qkv, const Mat16<Exec>& out, const Mats16<Exec>& att,
                        const AttentionWorkspace<Exec>& ws, std::int64_t NH,
                        AttentionProducts how = kAttentionProducts<Exec>, ProductMath math = ProductMath::fp32,
                        const ContextChunks& chunks = {}) {
  const std::int64_t T = static_cast<std::int64_t>(att.extent(1));
  if (attention_staged_bf16<Exec>(how, math)) {
    const std::int64_t hd = static_cast<std::int64_t>(out.extent(1)) / NH;
    detail::staged_bf16_attention_backward(exec, dqkv, datt, dout, qkv, att, ws,
                                           QkvLayout::of(static_cast<std::int64_t>(qkv.extent(1)), NH, hd), chunks);
    return;
  }
  if constexpr (kAttentionInPlace<Exec>) {
    if (attention_on_host_bf16<Exec>(how, math)) {
      // dout rounded into the bf16 operands' dy rows.
      const std::int64_t N = static_cast<std::int64_t>(dout.extent(0)), A = static_cast<std::int64_t>(out.extent(1));
      const detail::Bf16Operands o = detail::Bf16Operands::in(
          ws.narrowed.data(), static_cast<std::int64_t>(ws.narrowed.extent(0)), N / T, T, NH, A / NH);
      to_bf16(exec, Bf16Vec<Exec>(o.dy, N * A), ConstVec<Exec>(dout.data(), N * A));
      attention_backward(exec, dqkv, ConstMat16<Exec>(o.dy, N, A), qkv, out, att, ws, NH, how, math);
      return;
    }
  } else if (how == AttentionProducts::fused) {
    flash_attention_backward(exec, dqkv, dout, qkv, out, att, NH);
    return;
  }
  const Mat<Exec> qkv32 = detail::shaped_like<Exec>(ws.qkv32, qkv);
  from_bf16(exec, as_vec<Exec>(qkv32.data(), static_cast<std::int64_t>(qkv.size())),
            Bf16Vec<Exec>(qkv.data(), qkv.size()));
  from_bf16(exec, as_vec<Exec>(ws.att32.data(), static_cast<std::int64_t>(att.size())),
            Bf16Vec<Exec>(att.data(), att.size()));
  from_bf16(exec, as_vec<Exec>(ws.y32.data(), static_cast<std::int64_t>(out.size())),
            Bf16Vec<Exec>(out.data(), out.size()));
  attention_backward(exec, dqkv, datt, dout, qkv32, ws.y32, ws.att32, ws, NH, how, math, chunks);
}

// Gradient of the fused QKV bias, dbias: (W) +=, from sums: (W) the column sums of dqkv (N, W),
// [q | k | v] rows with NH query heads of hd columns (kernels/qkv_layout.hpp), as the QKV
// layer's backward takes them for its bias gradient (into sums, zeroed: the pass that rounds
// dqkv for the products sums it on a host's one thread).
// The k part is exactly zero: adding b_k to every key adds the same q . b_k to all scores
// of a query row, and softmax is shift-invariant. A float column sum would instead
// return rounding noise (~1e-11), which Adam's g / (|g| + eps) turns into steps of a
// sizeable fraction of lr, so the k part is not accumulated at all.
template <class Exec>
void qkv_bias_backward(const Exec& exec, const Vec<Exec>& dbias, const Vec<Exec>& sums, std::int64_t NH,
                       std::int64_t hd) {
  const std::int64_t W = static_cast<std::int64_t>(sums.extent(0));
  const QkvLayout L = QkvLayout::of(W, NH, hd);
  Kokkos::parallel_for("lamina::qkv_bias_backward", Range<Exec>(exec, 0, W),
                       detail::QkvBiasBackward<Exec>{dbias, sums, L.column(1), L.column(2)});
}

}  // namespace lamina
