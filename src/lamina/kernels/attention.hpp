#pragma once
// Causal multi-head self-attention core (between the QKV and output projections):
//   for each sequence b and head h:  P = softmax(mask(q k^T / sqrt(hd))),  y = P v
// qkv columns are [q | k | v], each head a contiguous slice of hd columns (GPT-2).
// The products run as batched GEMMs over the B*NH (sequence, head) pairs; on a host BLAS
// without the blocks the causal mask zeroes.
#include "lamina/kernels/fast_math.hpp"
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

// Causal softmax in place, one team per score row (b*NH + h, t); entries past t become 0.
template <class Exec>
struct AttentionSoftmaxForward {
  Mats<Exec> att;
  std::int64_t T;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t bh = team.league_rank() / T, t = team.league_rank() % T;
    const float mx = team_max(team, t + 1, [&](std::int64_t j) { return att(bh, t, j); });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, t + 1),
                         [&](std::int64_t j) { att(bh, t, j) = fast_exp(att(bh, t, j) - mx); });
    team.team_barrier();
    const float inv = 1.0f / team_sum(team, t + 1, [&](std::int64_t j) { return att(bh, t, j); });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, T),
                         [&](std::int64_t j) { att(bh, t, j) = j <= t ? att(bh, t, j) * inv : 0.0f; });
  }
};

// Softmax backward in place on datt, one team per score row (see attention_backward).
template <class Exec>
struct AttentionSoftmaxBackward {
  Mats<Exec> datt, att;
  std::int64_t T;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t bh = team.league_rank() / T, t = team.league_rank() % T;
    const float dot = team_sum(team, t + 1, [&](std::int64_t j) { return att(bh, t, j) * datt(bh, t, j); });
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, T), [&](std::int64_t j) {
      datt(bh, t, j) = j <= t ? att(bh, t, j) * (datt(bh, t, j) - dot) : 0.0f;
    });
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

// The T x T products of causal attention on a host BLAS, cut into row blocks that skip what
// the mask zeroes: 5/8 of the work at four blocks. With T x T operand L lower triangular
// (probabilities or their gradient), per (sequence, head):
//   scores:           C = A B^T, C (T x T): row block r only up to column r1 (the rest is
//                     masked; the softmax reads no further)
//   lower:            C = L X: row block r only reads L's columns, X's rows below r1
//   lower_transposed: C = L^T X: row block r only reads L's rows, X's rows from r0
enum class CausalProduct { scores, lower, lower_transposed };

struct CausalBlocks {
  HostGemm g;  // the batch's first product, whole
  CausalProduct kind;
  std::int64_t T, block, blocks, stride_a, stride_b, stride_c;
  void operator()(const std::int64_t item) const {
    const std::int64_t i = item / blocks, r0 = item % blocks * block, r1 = std::min(T, r0 + block);
    HostGemm p = g;
    p.a += i * stride_a;
    p.b += i * stride_b;
    p.c += i * stride_c + r0 * g.ldc;
    p.m = r1 - r0;
    switch (kind) {
      case CausalProduct::scores:  // A rows r0..r1, B rows 0..r1
        p.a += r0 * g.lda;
        p.n = r1;
        break;
      case CausalProduct::lower:  // L rows r0..r1, columns 0..r1
        p.a += r0 * g.lda;
        p.k = r1;
        break;
      case CausalProduct::lower_transposed:  // L rows r0..T, columns r0..r1; X rows r0..T
        p.a += r0 * g.lda + r0;
        p.b += r0 * g.ldb;
        p.k = T - r0;
        break;
    }
    host_sgemm(p);
  }
};

template <class Exec>
constexpr bool kCausalBlocksOnHost =
    kHostBlasLinked && Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible;

constexpr std::int64_t kCausalBlock = 64;

// batched_gemm for one of the products above; whole products where no host BLAS is linked.
template <class Exec>
void causal_batched_gemm(const Exec& exec, CausalProduct kind, const char* ta, const char* tb, float alpha,
                         const ConstMats<Exec>& A, const ConstMats<Exec>& B, const Mats<Exec>& C) {
  const std::int64_t batch = static_cast<std::int64_t>(C.extent(0));
  const std::int64_t T = static_cast<std::int64_t>(kind == CausalProduct::scores ? C.extent(2) : A.extent(2));
  if constexpr (kCausalBlocksOnHost<Exec>) {
    if (batch > 0 && T > kCausalBlock) {
      auto a = Kokkos::subview(A, 0, Kokkos::ALL, Kokkos::ALL);
      auto b = Kokkos::subview(B, 0, Kokkos::ALL, Kokkos::ALL);
      auto c = Kokkos::subview(C, 0, Kokkos::ALL, Kokkos::ALL);
      const HostGemm g = host_gemm(ta, tb, alpha, a, b, 0.0f, c);
      if (fits_blas_int(g)) {
        const std::int64_t blocks = (T + kCausalBlock - 1) / kCausalBlock;
        Kokkos::parallel_for("lamina::attention_causal_products",
                             Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(exec, 0, batch * blocks),
                             CausalBlocks{g, kind, T, kCausalBlock, blocks, static_cast<std::int64_t>(A.stride_0()),
                                          static_cast<std::int64_t>(B.stride_0()),
                                          static_cast<std::int64_t>(C.stride_0())});
        return;
      }
    }
  }
  batched_gemm<Exec>(exec, ta, tb, alpha, A, B, 0.0f, C);
}

}  // namespace detail

// out: (B*T, C) attention output before the projection
// q, k, v: (B*NH, T, hd) saved for backward; att: (B*NH, T, T) probabilities, saved
// y: (B*NH, T, hd) workspace; qkv: (B*T, 3C) output of the QKV projection
template <class Exec>
void attention_forward(const Exec& exec, const Mat<Exec>& out, const Mats<Exec>& q, const Mats<Exec>& k,
                       const Mats<Exec>& v, const Mats<Exec>& att, const Mats<Exec>& y, const Mat<Exec>& qkv,
                       std::int64_t NH) {
  const std::int64_t BNH = static_cast<std::int64_t>(q.extent(0));
  const std::int64_t T = static_cast<std::int64_t>(q.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(q.extent(2));
  const float scale = 1.0f / math::sqrt(static_cast<float>(hd));
  detail::permute_heads(exec, "lamina::attention_forward_split", qkv, q, k, v, NH, false);
  detail::causal_batched_gemm<Exec>(exec, detail::CausalProduct::scores, "N", "T", scale, q, k, att);
  Kokkos::parallel_for("lamina::attention_forward_softmax", Teams<Exec>(exec, BNH * T, Kokkos::AUTO),
                       detail::AttentionSoftmaxForward<Exec>{att, T});
  detail::causal_batched_gemm<Exec>(exec, detail::CausalProduct::lower, "N", "N", 1.0f, att, v, y);
  detail::split_heads(exec, "lamina::attention_forward_merge", out, y, NH, true);
}

// dqkv: (B*T, 3C) overwritten; dout: (B*T, C)
// dq, dk, dv, dy: (B*NH, T, hd) workspace; datt: (B*NH, T, T) workspace
// q, k, v, att: as saved by attention_forward
template <class Exec>
void attention_backward(const Exec& exec, const Mat<Exec>& dqkv, const Mats<Exec>& dq, const Mats<Exec>& dk,
                        const Mats<Exec>& dv, const Mats<Exec>& datt, const Mats<Exec>& dy, const Mat<Exec>& dout,
                        const Mats<Exec>& q, const Mats<Exec>& k, const Mats<Exec>& v, const Mats<Exec>& att,
                        std::int64_t NH) {
  const std::int64_t BNH = static_cast<std::int64_t>(q.extent(0));
  const std::int64_t T = static_cast<std::int64_t>(q.extent(1));
  const std::int64_t hd = static_cast<std::int64_t>(q.extent(2));
  const float scale = 1.0f / math::sqrt(static_cast<float>(hd));
  detail::split_heads(exec, "lamina::attention_backward_split", dout, dy, NH, false);
  using detail::CausalProduct;
  detail::causal_batched_gemm<Exec>(exec, CausalProduct::scores, "N", "T", 1.0f, dy, v, datt);            // dP = dy v^T
  detail::causal_batched_gemm<Exec>(exec, CausalProduct::lower_transposed, "T", "N", 1.0f, att, dy, dv);  // dv = P^T dy
  // Softmax backward, row by row: dS = P * (dP - sum_j P dP); masked entries are zero.
  Kokkos::parallel_for("lamina::attention_backward_softmax", Teams<Exec>(exec, BNH * T, Kokkos::AUTO),
                       detail::AttentionSoftmaxBackward<Exec>{datt, att, T});
  detail::causal_batched_gemm<Exec>(exec, CausalProduct::lower, "N", "N", scale, datt, k, dq);              // dq = scale dS k
  detail::causal_batched_gemm<Exec>(exec, CausalProduct::lower_transposed, "T", "N", scale, datt, q, dk);  // dk = scale dS^T q
  detail::permute_heads(exec, "lamina::attention_backward_merge", dqkv, dq, dk, dv, NH, true);
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
