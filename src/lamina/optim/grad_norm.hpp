#pragma once
// Global gradient norm and the clipping coefficient (Pascanu et al. 2013; Megatron and
// PyTorch's clip_grad_norm_ use the same rule).
#include <KokkosBlas1_dot.hpp>
#include <cmath>

#include "lamina/kernels/common.hpp"

namespace lamina {

// Sum of squares of x, via the vendor BLAS dot product (vectorised, threaded, fixed order).
template <class Exec>
double sum_of_squares(const Exec&, const ConstVec<Exec>& x) {
  // BLAS dot is instantiated for LayoutLeft vectors; a 1-D view is the same either way.
  Kokkos::View<const float*, Kokkos::LayoutLeft, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      v(x.data(), x.extent(0));
  return static_cast<double>(KokkosBlas::dot(v, v));
}

// Multiplier for the gradients so that their global norm is at most max_norm (0: no clipping).
inline double clip_coefficient(double global_norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(global_norm)) return 1.0;
  const double c = max_norm / (global_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace lamina
