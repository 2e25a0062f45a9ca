#pragma once
// Shared vocabulary of the kernels.
//
// Dimension glossary
//   B   sequences in a micro-batch        T   sequence length (positions)
//   C   model width (d_model)             NH  attention heads, hd = C / NH
//   V   vocabulary size                   L   transformer blocks
//   N   rows of a 2-D activation, N = B*T
//   dp, tp, pp: data-, tensor- and pipeline-parallel group sizes (never seen by a kernel)
//
// Gradient contract (every op in this directory)
//   - forward(exec, out..., cache..., inp..., params..., sizes) writes its outputs and the
//     cache that backward needs (mean, rstd, softmax probabilities): outputs first.
//   - backward(exec, dinp..., dparams..., dout..., inp/cache/params..., sizes):
//     parameter gradients ACCUMULATE (+=), so micro-batches and tied weights add up;
//     activation gradients OVERWRITE.
//   - All matrices are row-major (Kokkos::LayoutRight), like PyTorch and HuggingFace;
//     linear weights are HuggingFace Conv1D (in, out): y = x @ W + b.
//   - Launches are labelled "lamina::<op>" and run on the given execution-space
//     instance; nothing fences: whoever reads a result on the host fences.
//   - Reductions run in a fixed order (no atomics) so that results are bitwise
//     reproducible run to run, which bit-identical restarts rely on.
//   - Kernels in headers are named functors, never KOKKOS_LAMBDA (a lint test checks).
//     nvcc type-erases an extended __host__ __device__ lambda through function pointers
//     kept in per-translation-unit statics (an unnamed namespace), while the wrapper's
//     copy/destroy/call members are weak: a kernel template instantiated in several .cpp
//     files can construct the closure with one TU's code and copy it with another's,
//     whose pointers are still null (the CUDA adamw_update crash). Functors are plain types.
#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "lamina/core/kokkos_compat.hpp"

namespace lamina {

template <class Exec>
using Mat = Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec>
using ConstMat = Kokkos::View<const float**, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec>
using Vec = Kokkos::View<float*, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec>
using ConstVec = Kokkos::View<const float*, Kokkos::LayoutRight, typename Exec::memory_space>;
// A batch of matrices, (batch, rows, cols).
template <class Exec>
using Mats = Kokkos::View<float***, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec>
using ConstMats = Kokkos::View<const float***, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec>
using Tokens = Kokkos::View<const std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space>;
// bf16 storage: the upper half of an IEEE float, as std::uint16_t (kernels/bf16.hpp).
template <class Exec>
using Mat16 = Kokkos::View<std::uint16_t**, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec>
using ConstMat16 = Kokkos::View<const std::uint16_t**, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec>
using Mats16 = Kokkos::View<std::uint16_t***, Kokkos::LayoutRight, typename Exec::memory_space>;
// Views of activations in their storage type T: float, or std::uint16_t (bf16 runs).
template <class Exec, class T>
using MatOf = Kokkos::View<T**, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec, class T>
using VecOf = Kokkos::View<T*, Kokkos::LayoutRight, typename Exec::memory_space>;
template <class Exec, class T>
using MatsOf = Kokkos::View<T***, Kokkos::LayoutRight, typename Exec::memory_space>;
// The storage type of a view's elements (without const).
template <class V>
using StoredType = std::remove_const_t<typename V::value_type>;

// A read-only row-major matrix stored in fp32, or in bf16 (the parameters of bf16 runs):
// how kernels read weights. Products take either (gemm.hpp); element-wise kernels read
// either through widen().
template <class Exec>
struct MatRef {
  ConstMat<Exec> f32;
  ConstMat16<Exec> b16;
  MatRef() = default;
  MatRef(const ConstMat<Exec>& m) : f32(m) {}  // NOLINT(google-explicit-constructor): fp32 views pass as they are
  MatRef(const Mat<Exec>& m) : f32(m) {}       // NOLINT(google-explicit-constructor)
  MatRef(const ConstMat16<Exec>& m) : b16(m) {}  // NOLINT(google-explicit-constructor)
  bool bf16() const { return b16.data() != nullptr; }
  std::int64_t rows() const { return static_cast<std::int64_t>(bf16() ? b16.extent(0) : f32.extent(0)); }
  std::int64_t cols() const { return static_cast<std::int64_t>(bf16() ? b16.extent(1) : f32.extent(1)); }
};

namespace detail {
template <class T>
struct Identity {
  using type = T;
};
}  // namespace detail
// A MatRef function parameter that converts from an fp32 view: the execution space is
// deduced from the other arguments, not from it.
template <class Exec>
using MatRefArg = typename detail::Identity<MatRef<Exec>>::type;

template <class Exec>
using Range = Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>;
// Loops over row-major data in N dimensions: the last index fastest, within a tile and from
// tile to tile, so that neighbouring threads of a device read neighbouring addresses
// (Kokkos' default on CUDA walks the first index fastest). Every multi-dimensional loop of
// lamina is one of these (tests/lint checks).
template <class Exec, unsigned N>
using RowMajor = Kokkos::MDRangePolicy<Exec, Kokkos::Rank<N, Kokkos::Iterate::Right, Kokkos::Iterate::Right>,
                                       Kokkos::IndexType<std::int64_t>>;
template <class Exec>
using Teams = Kokkos::TeamPolicy<Exec>;

namespace detail {

template <class Exec>
constexpr bool kOnHost = Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible;

// A host's loop over elements [b kHostBlock, (b + 1) kHostBlock) of n, one work item per
// block, calling a copy of `body` made in the work item: its scalars then stay in registers
// and the loop vectorizes. Under Kokkos' OpenMP a functor is read through a pointer in
// the outlined region, so every store of a float could change its float members: its
// element loop reloaded them after each store and ran scalar, AdamW and GELU four to six
// times slower per thread than on Serial (perf, kernel timer).
constexpr std::int64_t kHostBlock = 4096;
template <class Body>
struct HostBlocks {
  Body body;
  std::int64_t n;
  void operator()(std::int64_t b) const {
    const Body f = body;
    const std::int64_t end = std::min(n, (b + 1) * kHostBlock);
    for (std::int64_t i = b * kHostBlock; i < end; ++i) f(i);
  }
};
template <class Exec, class Body>
void for_each_element(const char* label, const Exec& exec, std::int64_t n, const Body& body) {
  if constexpr (kOnHost<Exec>) {
    Kokkos::parallel_for(label, Range<Exec>(exec, 0, (n + kHostBlock - 1) / kHostBlock), HostBlocks<Body>{body, n});
  } else {
    Kokkos::parallel_for(label, Range<Exec>(exec, 0, n), body);
  }
}

// The same for rows: a work item per row i of `rows` calling body.row(i), a plain loop over
// the row's columns through raw pointers taken first, which vectorizes (a host); a team per
// row, its threads over the columns j < cols calling body.element(i, j) (a device).
template <class Body>
struct HostRows {
  Body body;
  void operator()(std::int64_t i) const { body.row(i); }
};
template <class Exec, class Body>
struct TeamRows {
  Body body;
  std::int64_t cols;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Kokkos::TeamPolicy<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, cols), [&](std::int64_t j) { body.element(i, j); });
  }
};
template <class Exec, class Body>
void for_each_row_element(const char* label, const Exec& exec, std::int64_t rows, std::int64_t cols, const Body& body) {
  if constexpr (kOnHost<Exec>) {
    Kokkos::parallel_for(label, Range<Exec>(exec, 0, rows), HostRows<Body>{body});
  } else {
    Kokkos::parallel_for(label, Teams<Exec>(exec, rows, Kokkos::AUTO), TeamRows<Exec, Body>{body, cols});
  }
}

}  // namespace detail

// Unmanaged shaped views over raw storage (a slice of a flat buffer).
template <class Exec>
Mat<Exec> as_mat(float* data, std::int64_t rows, std::int64_t cols) {
  return Kokkos::View<float**, Kokkos::LayoutRight, typename Exec::memory_space,
                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>(data, rows, cols);
}
template <class Exec>
Vec<Exec> as_vec(float* data, std::int64_t n) {
  return Kokkos::View<float*, Kokkos::LayoutRight, typename Exec::memory_space,
                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>(data, n);
}
template <class Exec>
Mats<Exec> as_mats(float* data, std::int64_t batch, std::int64_t rows, std::int64_t cols) {
  return Kokkos::View<float***, Kokkos::LayoutRight, typename Exec::memory_space,
                      Kokkos::MemoryTraits<Kokkos::Unmanaged>>(data, batch, rows, cols);
}
// The same over storage of either type.
template <class Exec, class T>
MatOf<Exec, T> as_mat_of(T* data, std::int64_t rows, std::int64_t cols) {
  return Kokkos::View<T**, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      data, rows, cols);
}
template <class Exec, class T>
VecOf<Exec, T> as_vec_of(T* data, std::int64_t n) {
  return Kokkos::View<T*, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      data, n);
}
template <class Exec, class T>
MatsOf<Exec, T> as_mats_of(T* data, std::int64_t batch, std::int64_t rows, std::int64_t cols) {
  return Kokkos::View<T***, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
      data, batch, rows, cols);
}

}  // namespace lamina
