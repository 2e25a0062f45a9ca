#pragma once
// What the norms' backward passes (LayerNorm, RMSNorm) share: a row's input gradient by a team
// or by a lone host thread, and the launch that sums the gain's (and LayerNorm's bias's)
// gradient over the rows. One team per row writes per-row terms that column sums then add
// up; a host on one thread walks every row in one work item and adds each row's terms into
// the sums while the row is in cache, in the same row order (the same sums, bit for bit), so
// that neither the (N, C) terms nor the output's gradient go through memory a second time.
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

// Every row of `backward` (a functor with row(Row, i, GainTerms)) on one thread: the sums in
// its scratch's first two rows (zeroed here), a row's terms in the third, each row's added in
// order, then the sums added into dweight (and dbias). D: the output gradient's storage type.
template <class Exec, class Backward, class D>
struct NormBackwardSummed {
  Backward backward;
  Mat<Exec> scratch;
  Vec<Exec> dweight, dbias;
  MatOf<Exec, const D> dout;
  std::int64_t N, C;
  void operator()(std::int64_t) const {
    const bool bias = dbias.data() != nullptr;
    float* wsum = scratch.data();
    float* bsum = wsum + C;
    const float* terms = bsum + C;
    for (std::int64_t c = 0; c < 2 * C; ++c) wsum[c] = 0.0f;
    for (std::int64_t i = 0; i < N; ++i) {
      backward.row(SerialRow{}, i, GainTerms{bsum + C, 0});
      for (std::int64_t c = 0; c < C; ++c) wsum[c] += terms[c];
      if (bias) {
        const D* d = &dout(i, 0);
        for (std::int64_t c = 0; c < C; ++c) bsum[c] += widen(d[c]);
      }
    }
    for (std::int64_t c = 0; c < C; ++c) dweight(c) += wsum[c];
    for (std::int64_t c = 0; bias && c < C; ++c) dbias(c) += bsum[c];
  }
};

// Runs a norm's backward over N rows of C: `backward` (row(Row, i, GainTerms) and a team
// operator writing its terms into `scratch`, (N, C)) then dweight += the terms' column sums
// and dbias (empty: none) += dout's; or the same on one host thread in one pass. dout: fp32,
// or bf16 (the tensor-parallel sum of it, parallel.tp_sums) as it is stored; partials: for
// a device's column sums (add_column_sums).
template <class Exec, class Backward, class DV>
void norm_backward(const char* name, const Exec& exec, const Backward& backward, std::int64_t N, std::int64_t C,
                   const Mat<Exec>& scratch, const Vec<Exec>& dweight, const Vec<Exec>& dbias, const DV& dout,
                   const Vec<Exec>& partials) {
  using D = StoredType<DV>;
  if constexpr (detail::kOnHost<Exec>) {
    if (detail::one_host_thread(exec) && N >= 3) {
      Kokkos::parallel_for(name, Range<Exec>(exec, 0, 1),
                           NormBackwardSummed<Exec, Backward, D>{backward, scratch, dweight, dbias, dout, N, C});
      return;
    }
  }
  Kokkos::parallel_for(name, Teams<Exec>(exec, N, Kokkos::AUTO), backward);
  add_column_sums(exec, dweight, scratch, partials);
  if (dbias.data() != nullptr) add_column_sums(exec, dbias, dout, partials);
}

}  // namespace lamina
