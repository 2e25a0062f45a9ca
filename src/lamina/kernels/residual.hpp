#pragma once
// Residual connection: out = a + b. Its backward is the identity on both branches: the
// model hands the same gradient to both, and the skip branch joins the other one inside
// layernorm_backward (its `dskip` argument), which saves a pass over memory.
#include "lamina/kernels/common.hpp"

namespace lamina {

template <class Exec>
struct ResidualForward {
  Vec<Exec> out;
  ConstVec<Exec> a, b;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { out(i) = a(i) + b(i); }
};

// out, a, b: (n) flattened
template <class Exec>
void residual_forward(const Exec& exec, const Vec<Exec>& out, const ConstVec<Exec>& a, const ConstVec<Exec>& b) {
  Kokkos::parallel_for("lamina::residual_forward", Range<Exec>(exec, 0, static_cast<std::int64_t>(out.extent(0))),
                       ResidualForward<Exec>{out, a, b});
}

}  // namespace lamina
