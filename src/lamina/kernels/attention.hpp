#pragma once
// Causal multi-head self-attention core (between the QKV and output projections):
//   for each sequence b and head h:  P = softmax(mask(q k^T / sqrt(hd))),  y = P v
// qkv columns are [q | k | v], each head a contiguous slice of hd columns (GPT-2).
// On a host BLAS the products read q, k, v and write y in those rows, per (sequence, head)
// and without the blocks the causal mask zeroes; on a device fused kernels stream them
// through team scratch (kernels/flash_attention.hpp); elsewhere they run as batched GEMMs
// over per-head copies.
#include "lamina/core/config.hpp"
#include "lamina/kernels/fast_math.hpp"
#include "lamina/kernels/flash_attention.hpp"
#include "lamina/kernels/gemm.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

namespace detail {

// Iterates (b, h, t, d) with d fastest: contiguous in both layouts, so host loops
// vectorize and GPU threads coalesce, with no index division per element.
template <class Exec>
using HeadsPolicy = Kokkos::MDRangePolicy<Exec, Kokkos::Rank<4>, Kokkos::IndexType<std::int64_t>>;

// (B*NH, T, hd) q, k, v -> (B*T, 3C) columns [q | k | v]
template <class Exec>
struct HeadsToQkvRows {
  Mat<Exec> rows;
  Mats<Exec> q, k, v;
  std::int64_t NH, T, hd, C;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) const {
    rows(b * T + t, h * hd + d) = q(b * NH + h, t, d);
    rows(b * T + t, C + h * hd + d) = k(b * NH + h, t, d);
    rows(b * T + t, 2 * C + h * hd + d) = v(b * NH + h, t, d);
  }
};

// (B*T, 3C) columns [q | k | v] -> (B*NH, T, hd) q, k, v
template <class Exec>
struct QkvRowsToHeads {
  Mat<Exec> rows;
  Mats<Exec> q, k, v;
  std::int64_t NH, T, hd, C;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) const {
    q(b * NH + h, t, d) = rows(b * T + t, h * hd + d);
    k(b * NH + h, t, d) = rows(b * T + t, C + h * hd + d);
    v(b * NH + h, t, d) = rows(b * T + t, 2 * C + h * hd + d);
  }
};

// Scatter (B*T, 3C) columns into per-head (B*NH, T, hd) q, k, v, or gather back (to_rows).
template <class Exec>
void permute_heads(const Exec& exec, const char* label, const Mat<Exec>& rows, const Mats<Exec>& q,
                   const Mats<Exec>& k, const Mats<Exec>& v, std::int64_t NH, bool to_rows) {
  const std::int64_t B = static_cast<std::int64_t>(q.extent(0)) / NH;
  const std::int64_t T = static_cast<std::int64_t>(q.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(q.extent(2));
  const std::int64_t C = NH * hd;
  const HeadsPolicy<Exec> policy(exec, {0, 0, 0, 0}, {B, NH, T, hd});
  if (to_rows) {
    Kokkos::parallel_for(label, policy, HeadsToQkvRows<Exec>{rows, q, k, v, NH, T, hd, C});
  } else {
    Kokkos::parallel_for(label, policy, QkvRowsToHeads<Exec>{rows, q, k, v, NH, T, hd, C});
  }
}

// (B*NH, T, hd) heads -> (B*T, C) rows
template <class Exec>
struct HeadsToRows {
  Mat<Exec> rows;
  Mats<Exec> heads;
  std::int64_t NH, T, hd;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) const {
    rows(b * T + t, h * hd + d) = heads(b * NH + h, t, d);
  }
};

// (B*T, C) rows -> (B*NH, T, hd) heads
template <class Exec>
struct RowsToHeads {
  Mat<Exec> rows;
  Mats<Exec> heads;
  std::int64_t NH, T, hd;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, std::int64_t h, std::int64_t t, std::int64_t d) const {
    heads(b * NH + h, t, d) = rows(b * T + t, h * hd + d);
  }
};

// (B*T, C) rows <-> (B*NH, T, hd) heads for a single tensor.
template <class Exec>
void split_heads(const Exec& exec, const char* label, const Mat<Exec>& rows, const Mats<Exec>& heads,
                 std::int64_t NH, bool to_rows) {
  const std::int64_t B = static_cast<std::int64_t>(heads.extent(0)) / NH;
  const std::int64_t T = static_cast<std::int64_t>(heads.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(heads.extent(2));
  const HeadsPolicy<Exec> policy(exec, {0, 0, 0, 0}, {B, NH, T, hd});
  if (to_rows) {
    Kokkos::parallel_for(label, policy, HeadsToRows<Exec>{rows, heads, NH, T, hd});
  } else {
    Kokkos::parallel_for(label, policy, RowsToHeads<Exec>{rows, heads, NH, T, hd});
  }
}

// A score row's maximum and sum of exponentials: its log-sum-exp is max + log(sum).
struct RowSoftmax {
  float max, sum;
};

// Causal softmax of score row t in place (T entries); entries past t become 0.
template <class Row>
KOKKOS_INLINE_FUNCTION RowSoftmax causal_softmax_row(const Row& loop, float* row, std::int64_t t, std::int64_t T) {
  const float mx = loop.max(t + 1, [&](std::int64_t j) { return row[j]; });
  loop.for_each(t + 1, [&](std::int64_t j) { row[j] = fast_exp(row[j] - mx); });
  loop.barrier();
  const float sum = loop.sum(t + 1, [&](std::int64_t j) { return row[j]; }), inv = 1.0f / sum;
  loop.for_each(T, [&](std::int64_t j) { row[j] = j <= t ? row[j] * inv : 0.0f; });
  return {mx, sum};
}

// Its backward in place on the row's gradient: dS = P * (dP - sum_j P dP); masked entries are 0.
template <class Row>
KOKKOS_INLINE_FUNCTION void causal_softmax_row_backward(const Row& loop, float* drow, const float* prow,
                                                        std::int64_t t, std::int64_t T) {
  const float dot = loop.sum(t + 1, [&](std::int64_t j) { return prow[j] * drow[j]; });
  loop.for_each(T, [&](std::int64_t j) { drow[j] = j <= t ? prow[j] * (drow[j] - dot) : 0.0f; });
}

// One team per score row (b*NH + h, t).
template <class Exec>
struct AttentionSoftmaxForward {
  Mats<Exec> att;
  std::int64_t T;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t bh = team.league_rank() / T, t = team.league_rank() % T;
    causal_softmax_row(TeamRow<typename Teams<Exec>::member_type>{team}, &att(bh, t, 0), t, T);
  }
};

template <class Exec>
struct AttentionSoftmaxBackward {
  Mats<Exec> datt, att;
  std::int64_t T;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t bh = team.league_rank() / T, t = team.league_rank() % T;
    causal_softmax_row_backward(TeamRow<typename Teams<Exec>::member_type>{team}, &datt(bh, t, 0), &att(bh, t, 0),
                                t, T);
  }
};

// dbias += sums on the q and v parts only (see qkv_bias_backward).
template <class Exec>
struct QkvBiasBackward {
  Vec<Exec> dbias, sums;
  std::int64_t C;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t j) const {
    if (j < C || j >= 2 * C) dbias(j) += sums(j);
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

// Matrix (s, h) of a batch over sequences s and heads h: it starts at
// data + s * seq_stride + h * head_stride, its rows ld apart. q, k, v and y are read and
// written in place in their (B*T, width) rows this way, with no per-head copies.
struct HeadMatrices {
  float* data = nullptr;
  std::int64_t ld = 0, seq_stride = 0, head_stride = 0;
  float* at(std::int64_t s, std::int64_t h) const { return data + s * seq_stride + h * head_stride; }
};

// Part `part` (0 q, 1 k, 2 v) of (B*T, 3A) QKV rows, or (part 0) of (B*T, A) rows.
template <class Exec>
HeadMatrices row_heads(const Mat<Exec>& rows, std::int64_t parts, std::int64_t part, std::int64_t T,
                       std::int64_t hd) {
  const std::int64_t ld = static_cast<std::int64_t>(rows.stride_0());
  return {rows.data() + part * static_cast<std::int64_t>(rows.extent(1)) / parts, ld, T * ld, hd};
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

// Backward by column blocks of P and dS (all of dS done): dv = P^T dy, dk = scale dS^T q.
struct CausalAttentionBackwardColumns {
  CausalBlocks blocks;
  float scale;
  HeadMatrices dy, q, att, datt, dk, dv;
  void operator()(const std::int64_t item) const {
    const CausalBlock b = blocks[item];
    host_sgemm(b.product(CausalProduct::lower_transposed, 1.0f, att, dy, dv));
    host_sgemm(b.product(CausalProduct::lower_transposed, scale, datt, q, dk));
  }
};

template <class Exec, class Item>
void for_each_causal_block(const Exec& exec, const char* label, std::int64_t batch, const Item& item) {
  Kokkos::parallel_for(label,
                       Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, batch * item.blocks.blocks),
                       item);
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
// products take `math` (ProductMath: on CUDA, bf16 tensor cores), the other ways are fp32.
// The default is what the backend runs fastest; in_place needs a host BLAS it can call.
template <class Exec>
constexpr AttentionProducts kAttentionProducts =
    !Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible ? AttentionProducts::fused
    : kHostBlasLinked                                                 ? AttentionProducts::in_place
                                                                      : AttentionProducts::staged;

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
// and dq, dk, dv. Fused products on a host BLAS: probs, (B*NH, T, T) probabilities. The
// other ways leave them untouched.
template <class Exec>
struct AttentionWorkspace {
  Mats<Exec> q, k, v, y;
  Mats<Exec> dq, dk, dv;
  Mats<Exec> probs;
};

// out: (B*T, A) attention output before the projection, saved
// att: (B*NH, T, saved_attention_columns(how, T)) probabilities or log-sum-exps, saved
// qkv: (B*T, 3A) output of the QKV projection, saved
template <class Exec>
void attention_forward(const Exec& exec, const Mat<Exec>& out, const Mats<Exec>& att, const Mat<Exec>& qkv,
                       const AttentionWorkspace<Exec>& ws, std::int64_t NH,
                       AttentionProducts how = kAttentionProducts<Exec>, ProductMath math = ProductMath::fp32) {
  const std::int64_t BNH = static_cast<std::int64_t>(att.extent(0));
  const std::int64_t T = static_cast<std::int64_t>(att.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(out.extent(1)) / NH;
  const float scale = 1.0f / math::sqrt(static_cast<float>(hd));
  if constexpr (kAttentionInPlace<Exec>) {
    if (how != AttentionProducts::staged) {
      using detail::row_heads;
      const bool fused = how == AttentionProducts::fused;
      detail::for_each_causal_block(
          exec, "lamina::attention_forward_blocks", BNH,
          detail::CausalAttentionForward{detail::CausalBlocks(NH, T, hd), scale, row_heads<Exec>(qkv, 3, 0, T, hd),
                                         row_heads<Exec>(qkv, 3, 1, T, hd), row_heads<Exec>(qkv, 3, 2, T, hd),
                                         detail::score_heads<Exec>(fused ? ws.probs : att, NH),
                                         row_heads<Exec>(out, 1, 0, T, hd), fused ? att.data() : nullptr});
      return;
    }
  }
  if (how == AttentionProducts::fused) {
    flash_attention_forward(exec, out, att, qkv, NH);
    return;
  }
  detail::permute_heads(exec, "lamina::attention_forward_split", qkv, ws.q, ws.k, ws.v, NH, false);
  batched_gemm<Exec>(exec, "N", "T", scale, ws.q, ws.k, 0.0f, att, math);
  Kokkos::parallel_for("lamina::attention_forward_softmax", Teams<Exec>(exec, BNH * T, Kokkos::AUTO),
                       detail::AttentionSoftmaxForward<Exec>{att, T});
  batched_gemm<Exec>(exec, "N", "N", 1.0f, att, ws.v, 0.0f, ws.y, math);
  detail::split_heads(exec, "lamina::attention_forward_merge", out, ws.y, NH, true);
}

// dqkv: (B*T, 3A) overwritten; datt: (B*NH, T, T) workspace (a device's fused products
// keep it in team scratch instead); dout: (B*T, A); qkv, out, att: as attention_forward
// saved them
template <class Exec>
void attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const Mats<Exec>& datt, const Mat<Exec>& dout,
                        const Mat<Exec>& qkv, const Mat<Exec>& out, const Mats<Exec>& att,
                        const AttentionWorkspace<Exec>& ws, std::int64_t NH,
                        AttentionProducts how = kAttentionProducts<Exec>, ProductMath math = ProductMath::fp32) {
  const std::int64_t BNH = static_cast<std::int64_t>(att.extent(0));
  const std::int64_t T = static_cast<std::int64_t>(att.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(dout.extent(1)) / NH;
  const float scale = 1.0f / math::sqrt(static_cast<float>(hd));
  if constexpr (kAttentionInPlace<Exec>) {
    if (how != AttentionProducts::staged) {
      using detail::row_heads;
      const detail::CausalBlocks blocks(NH, T, hd);
      const detail::HeadMatrices dS = detail::score_heads<Exec>(datt, NH), dy = row_heads<Exec>(dout, 1, 0, T, hd),
                                 q = row_heads<Exec>(qkv, 3, 0, T, hd), k = row_heads<Exec>(qkv, 3, 1, T, hd);
      detail::HeadMatrices P = detail::score_heads<Exec>(att, NH);
      if (how == AttentionProducts::fused) {
        P = detail::score_heads<Exec>(ws.probs, NH);
        detail::for_each_causal_block(exec, "lamina::attention_backward_probabilities", BNH,
                                      detail::CausalAttentionProbabilities{blocks, scale, q, k, P, att.data()});
      }
      detail::for_each_causal_block(
          exec, "lamina::attention_backward_row_blocks", BNH,
          detail::CausalAttentionBackwardRows{blocks, scale, dy, q, k, row_heads<Exec>(qkv, 3, 2, T, hd), P, dS,
                                              row_heads<Exec>(dqkv, 3, 0, T, hd)});
      detail::for_each_causal_block(exec, "lamina::attention_backward_column_blocks", BNH,
                                    detail::CausalAttentionBackwardColumns{blocks, scale, dy, q, P, dS,
                                                                           row_heads<Exec>(dqkv, 3, 1, T, hd),
                                                                           row_heads<Exec>(dqkv, 3, 2, T, hd)});
      return;
    }
  }
  if (how == AttentionProducts::fused) {
    flash_attention_backward(exec, dqkv, dout, qkv, out, att, NH);
    return;
  }
  detail::split_heads(exec, "lamina::attention_backward_split", dout, ws.y, NH, false);
  detail::permute_heads(exec, "lamina::attention_backward_split_qkv", qkv, ws.q, ws.k, ws.v, NH, false);
  batched_gemm<Exec>(exec, "N", "T", 1.0f, ws.y, ws.v, 0.0f, datt, math);     // dP = dy v^T
  batched_gemm<Exec>(exec, "T", "N", 1.0f, att, ws.y, 0.0f, ws.dv, math);     // dv = P^T dy
  Kokkos::parallel_for("lamina::attention_backward_softmax", Teams<Exec>(exec, BNH * T, Kokkos::AUTO),
                       detail::AttentionSoftmaxBackward<Exec>{datt, att, T});
  batched_gemm<Exec>(exec, "N", "N", scale, datt, ws.k, 0.0f, ws.dq, math);   // dq = scale dS k
  batched_gemm<Exec>(exec, "T", "N", scale, datt, ws.q, 0.0f, ws.dk, math);   // dk = scale dS^T q
  detail::permute_heads(exec, "lamina::attention_backward_merge", dqkv, ws.dq, ws.dk, ws.dv, NH, true);
}

// Gradient of the fused QKV bias, dbias: (3C) +=, from dqkv: (N, 3C).
// The k part is exactly zero: adding b_k to every key adds the same q . b_k to all scores
// of a query row, and softmax is shift-invariant. A float column sum would instead
// return rounding noise (~1e-11), which Adam's g / (|g| + eps) turns into steps of a
// sizeable fraction of lr, so the k part is not accumulated at all.
// sums: (3C) workspace; ones: (>=N) ones
template <class Exec>
void qkv_bias_backward(const Exec& exec, const Vec<Exec>& dbias, const ConstMat<Exec>& dqkv, const Vec<Exec>& sums,
                       const ConstVec<Exec>& ones) {
  const std::int64_t C3 = static_cast<std::int64_t>(dqkv.extent(1)), C = C3 / 3;
  Kokkos::deep_copy(exec, sums, 0.0f);
  add_column_sums(exec, sums, dqkv, ones);
  Kokkos::parallel_for("lamina::qkv_bias_backward", Range<Exec>(exec, 0, C3),
                       detail::QkvBiasBackward<Exec>{dbias, sums, C});
}

}  // namespace lamina
