#pragma once
// Residual connection: out = a + (b + bias), where b is a projection's output and bias its
// bias, joined here instead of in a pass of its own (with tensor parallelism after the
// shards' partial products are summed, so every rank adds it once). Its backward is the
// identity on both branches: the model hands the same gradient to both, and the skip
// branch joins the other one inside layernorm_backward (its `dskip` argument), which saves
// a pass over memory; the bias gradient is the projection's (linear_backward).
#include "lamina/kernels/common.hpp"

namespace lamina {

// One team per row.
template <class Exec>
struct ResidualForward {
  Mat<Exec> out;
  ConstMat<Exec> a, b;
  ConstVec<Exec> bias;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, static_cast<std::int64_t>(out.extent(1))),
                         [&](std::int64_t j) { out(i, j) = a(i, j) + (b(i, j) + bias(j)); });
  }
};

// out, a, b: (N, C); bias: (C)
template <class Exec>
void residual_forward(const Exec& exec, const Mat<Exec>& out, const ConstMat<Exec>& a, const ConstMat<Exec>& b,
                      const ConstVec<Exec>& bias) {
  Kokkos::parallel_for("lamina::residual_forward",
                       Teams<Exec>(exec, static_cast<std::int64_t>(out.extent(0)), Kokkos::AUTO),
                       ResidualForward<Exec>{out, a, b, bias});
}

}  // namespace lamina
