#pragma once
// Global gradient norm and the clipping coefficient (Pascanu et al. 2013; Megatron and
// PyTorch's clip_grad_norm_ use the same rule).
#include <cmath>

#include "lamina/kernels/reduction.hpp"

namespace lamina {

// Multiplier for the gradients so that their global norm is at most max_norm (0: no clipping).
inline double clip_coefficient(double global_norm, double max_norm) {
  if (max_norm <= 0.0 || !std::isfinite(global_norm)) return 1.0;
  const double c = max_norm / (global_norm + 1e-6);
  return c < 1.0 ? c : 1.0;
}

}  // namespace lamina
