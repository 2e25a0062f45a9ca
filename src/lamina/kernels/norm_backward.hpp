#pragma once
// What the norms' backward passes (LayerNorm, RMSNorm) share: a row's input gradient by a team
// or by a lone host thread, and the launch that sums the gain's (and LayerNorm's bias's)
// gradient over the rows. On a device one team per row writes per-row terms that column sums
// then add up. A host on one thread walks every row in one work item and adds each row's
// terms into the sums while the row is in cache, so that neither the (N, C) terms nor the
// output's gradient go through memory a second time; on several threads the rows' input
// gradients come first, then a work item per block of columns recomputes the terms through
// all the rows. Every column is summed in row order each way: the same sums, bit for bit.
#include "lamina/kernels/gemm.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

// Where a row's gain-gradient terms (dout * xhat) go: row i of the (N, C) scratch, or (ld 0)
// one row that the lone host thread adds into the sums before the next row overwrites it.
// Rounded to fp32 in memory either way: added straight into a sum, the product could be
// contracted into a fused multiply-add and the sums would differ in their last bits.
struct GainTerms {
  float* row0;
  std::int64_t ld;
  KOKKOS_INLINE_FUNCTION void put(std::int64_t i, std::int64_t c, float term) const { row0[i * ld + c] = term; }
};

// Terms nowhere: the rows' pass where a pass of its own takes the sums (NormGainSums).
struct NoGainTerms {
  KOKKOS_INLINE_FUNCTION void put(std::int64_t, std::int64_t, float) const {}
};

// Row i of an input gradient by `r` (TeamRow or SerialRow): dinp = dskip + local(c) where
// another branch's gradient joins (has_skip: a norm's input is the residual stream), else
// local(c). Two loops rather than a branch per element, so that each one vectorizes.
template <class Row, class Out, class Skip, class Local>
KOKKOS_INLINE_FUNCTION void store_gradient_row(const Row& r, std::int64_t i, std::int64_t C, const Out& dinp,
                                               const Skip& dskip, bool has_skip, const Local& local) {
  if (has_skip) {
    r.for_each(C, [&](std::int64_t c) { dinp(i, c) = dskip(i, c) + local(c); });
  } else {
    r.for_each(C, [&](std::int64_t c) { dinp(i, c) = local(c); });
  }
}

// The sums of a host's passes in the first three rows of the (N >= 3, C) scratch: the gain's,
// the bias's, and a row's terms; a work item owns columns [c0, c1) of each.
template <class Exec, class D>
struct NormSums {
  Mat<Exec> scratch;
  Vec<Exec> dweight, dbias;
  MatOf<Exec, const D> dout;
  std::int64_t C;
  float* wsum() const { return scratch.data(); }
  float* bsum() const { return dbias.data() != nullptr ? scratch.data() + C : nullptr; }
  float* terms() const { return scratch.data() + 2 * C; }
  void zero(std::int64_t c0, std::int64_t c1) const {
    for (std::int64_t c = c0; c < c1; ++c) wsum()[c] = scratch.data()[C + c] = 0.0f;
  }
  // Row i's share over columns [c0, c1): the gain's sums += its terms (in memory, rounded:
  // see GainTerms), the bias's (if any) += its output gradient.
  void add_row(std::int64_t i, std::int64_t c0, std::int64_t c1) const {
    float *w = wsum(), *b = bsum();
    const float* t = terms();
    for (std::int64_t c = c0; c < c1; ++c) w[c] += t[c];
    if (b == nullptr) return;
    const D* d = &dout(i, 0);
    for (std::int64_t c = c0; c < c1; ++c) b[c] += widen(d[c]);
  }
  // dweight (and dbias) += the sums.
  void add(std::int64_t c0, std::int64_t c1) const {
    for (std::int64_t c = c0; c < c1; ++c) dweight(c) += wsum()[c];
    for (std::int64_t c = c0; bsum() != nullptr && c < c1; ++c) dbias(c) += bsum()[c];
  }
};

// Every row of `backward` (a functor with row(Row, i, Terms)) on one thread, each row's terms
// added into the sums in order. D: the output gradient's storage type.
template <class Exec, class Backward, class D>
struct NormBackwardSummed {
  Backward backward;
  NormSums<Exec, D> sums;
  std::int64_t N;
  void operator()(std::int64_t) const {
    const std::int64_t C = sums.C;
    sums.zero(0, C);
    for (std::int64_t i = 0; i < N; ++i) {
      backward.row(SerialRow{}, i, GainTerms{sums.terms(), 0});
      sums.add_row(i, 0, C);
    }
    sums.add(0, C);
  }
};

// Each row's input gradient on a host thread, its terms left to NormGainSums.
template <class Backward>
struct NormRows {
  Backward backward;
  void operator()(std::int64_t i) const { backward.row(SerialRow{}, i, NoGainTerms{}); }
};

// The sums over `block` columns per work item: each row's terms recomputed
// (backward.gain_terms(i)(c): the value row() hands to its Terms) and added in row order.
template <class Exec, class Backward, class D>
struct NormGainSums {
  Backward backward;
  NormSums<Exec, D> sums;
  std::int64_t N, block;
  void operator()(std::int64_t b) const {
    const std::int64_t c0 = b * block, c1 = std::min(c0 + block, sums.C);
    float* terms = sums.terms();
    sums.zero(c0, c1);
    for (std::int64_t i = 0; i < N; ++i) {
      const auto term = backward.gain_terms(i);
      for (std::int64_t c = c0; c < c1; ++c) terms[c] = term(c);
      sums.add_row(i, c0, c1);
    }
    sums.add(c0, c1);
  }
};

// A host's norm backward on several threads: the rows' input gradients, then the sums by
// `block` columns per work item.
template <class Exec, class Backward, class D>
void norm_backward_by_columns(const char* name, const Exec& exec, const Backward& backward,
                              const NormSums<Exec, D>& sums, std::int64_t N, std::int64_t block) {
  Kokkos::parallel_for(name, Range<Exec>(exec, 0, N), NormRows<Backward>{backward});
  Kokkos::parallel_for("lamina::norm_gain_sums", Range<Exec>(exec, 0, (sums.C + block - 1) / block),
                       NormGainSums<Exec, Backward, D>{backward, sums, N, block});
}

// Runs a norm's backward over N rows of C: `backward` (row(Row, i, Terms), gain_terms(i), and
// a team operator writing its terms into `scratch`, (N, C)) then dweight += the terms' column
// sums and dbias (empty: none) += dout's; on a host the same sums in one pass (one thread) or
// two (several), with the scratch's first rows for the sums. dout: fp32,
// or bf16 (the tensor-parallel sum of it, parallel.tp_sums) as it is stored; partials: for
// a device's column sums (add_column_sums).
template <class Exec, class Backward, class DV>
void norm_backward(const char* name, const Exec& exec, const Backward& backward, std::int64_t N, std::int64_t C,
                   const Mat<Exec>& scratch, const Vec<Exec>& dweight, const Vec<Exec>& dbias, const DV& dout,
                   const Vec<Exec>& partials) {
  using D = StoredType<DV>;
  if constexpr (detail::kOnHost<Exec>) {
    if (N >= 3) {
      const NormSums<Exec, D> sums{scratch, dweight, dbias, dout, C};
      if (detail::one_host_thread(exec)) {
        Kokkos::parallel_for(name, Range<Exec>(exec, 0, 1), NormBackwardSummed<Exec, Backward, D>{backward, sums, N});
      } else {
        norm_backward_by_columns(name, exec, backward, sums, N, detail::summed_columns(exec, C));
      }
      return;
    }
  }
  Kokkos::parallel_for(name, Teams<Exec>(exec, N, Kokkos::AUTO), backward);
  add_column_sums(exec, dweight, scratch, partials);
  if (dbias.data() != nullptr) add_column_sums(exec, dbias, dout, partials);
}

}  // namespace lamina
