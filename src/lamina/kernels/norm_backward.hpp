#pragma once
// What the norms' backward passes (LayerNorm, RMSNorm) share: a row's input gradient by a team
// or by a host thread, and the launch that sums the gain's (and LayerNorm's bias's) gradient
// over the rows. On a device one team per row writes per-row terms that column sums then add
// up, by blocks of rows (two_stage_column_sums). A host takes those blocks of rows as its work
// items and adds each row's terms into its block's sums while the row is in cache, so that
// neither the (N, C) terms nor the output's gradient go through memory a second time; then
// each column adds its blocks' sums in order. The same blocks and order each way: the same
// sums, bit for bit, whatever the thread count.
#include "lamina/kernels/gemm.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

// Where a row's gain-gradient terms (dout * xhat) go: row i of the (N, C) scratch, or (ld 0)
// one row that a host thread adds into its sums before the next row overwrites it. Rounded
// to fp32 in memory either way: added straight into a sum, the product could be contracted
// into a fused multiply-add and the sums would differ in their last bits.
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

// A host's work item per block of rows: each row's input gradient, and its terms (and, with
// a bias, its output gradient) added into the block's sums. The (N, C) scratch holds, for
// `blocks` blocks, the gain's sums (blocks, C), the bias's (blocks, C) and a row of terms each.
template <class Exec, class Backward, class D>
struct NormBackwardBlocks {
  Backward backward;
  MatOf<Exec, const D> dout;
  float* scratch;
  std::int64_t N, C, blocks, block_rows;
  bool bias;
  void operator()(std::int64_t b) const {
    float* __restrict__ w = scratch + b * C;
    float* __restrict__ bs = scratch + (blocks + b) * C;
    float* __restrict__ t = scratch + (2 * blocks + b) * C;
    for (std::int64_t c = 0; c < C; ++c) w[c] = bs[c] = 0.0f;
    const std::int64_t end = std::min(N, (b + 1) * block_rows);
    for (std::int64_t i = b * block_rows; i < end; ++i) {
      backward.row(SerialRow{}, i, GainTerms{t, 0});
      for (std::int64_t c = 0; c < C; ++c) w[c] += t[c];
      if (!bias) continue;
      const D* d = &dout(i, 0);
      for (std::int64_t c = 0; c < C; ++c) bs[c] += widen(d[c]);
    }
  }
};

// Runs a norm's backward over N rows of C: `backward` (row(Row, i, Terms), and a team
// operator writing its terms into `scratch`, (N, C)) then dweight += the terms' column sums
// and dbias (empty: none) += dout's; on a host (N >= 3) the same sums by blocks of rows with
// the scratch for the blocks' sums. dout: fp32, or bf16 (the tensor-parallel sum of it,
// parallel.tp_sums) as it is stored; partials: for a device's column sums (add_column_sums).
template <class Exec, class Backward, class DV>
void norm_backward(const char* name, const Exec& exec, const Backward& backward, std::int64_t N, std::int64_t C,
                   const Mat<Exec>& scratch, const Vec<Exec>& dweight, const Vec<Exec>& dbias, const DV& dout,
                   const Vec<Exec>& partials) {
  using D = StoredType<DV>;
  if constexpr (detail::kOnHost<Exec>) {
    if (N >= 3) {
      // The blocks of a device's column sums (as many as its partial sums hold), three rows
      // of C in the scratch each.
      const std::int64_t blocks = std::min(detail::column_blocks(N, C, static_cast<std::int64_t>(partials.extent(0))),
                                           N / 3);
      const bool bias = dbias.data() != nullptr;
      Kokkos::parallel_for(name, Range<Exec>(exec, 0, blocks),
                           NormBackwardBlocks<Exec, Backward, D>{backward, dout, scratch.data(), N, C, blocks,
                                                                 (N + blocks - 1) / blocks, bias});
      detail::add_block_sums(exec, dweight, scratch.data(), blocks, C);
      if (bias) detail::add_block_sums(exec, dbias, scratch.data() + blocks * C, blocks, C);
      return;
    }
  }
  Kokkos::parallel_for(name, Teams<Exec>(exec, N, Kokkos::AUTO), backward);
  add_column_sums(exec, dweight, scratch, partials);
  if (dbias.data() != nullptr) add_column_sums(exec, dbias, dout, partials);
}

}  // namespace lamina
