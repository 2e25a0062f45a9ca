#pragma once
// GELU, tanh approximation (GPT-2; PyTorch approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2 / pi)
#include "lamina/kernels/common.hpp"
#include "lamina/kernels/fast_math.hpp"

namespace lamina {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

KOKKOS_INLINE_FUNCTION float gelu(float x) {
  return 0.5f * x * (1.0f + fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
}

// The MLP's bias and activation in one pass, one team per row.
template <class Exec>
struct BiasGeluForward {
  Mat<Exec> pre, out;
  ConstVec<Exec> bias;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, static_cast<std::int64_t>(pre.extent(1))),
                         [&](std::int64_t j) {
                           const float x = pre(i, j) + bias(j);
                           pre(i, j) = x;
                           out(i, j) = gelu(x);
                         });
  }
};

// pre: (N, F) the product without its bias, += bias (kept for backward); out: (N, F) = gelu(pre)
template <class Exec>
void bias_gelu_forward(const Exec& exec, const Mat<Exec>& pre, const Mat<Exec>& out, const ConstVec<Exec>& bias) {
  Kokkos::parallel_for("lamina::bias_gelu_forward",
                       Teams<Exec>(exec, static_cast<std::int64_t>(pre.extent(0)), Kokkos::AUTO),
                       BiasGeluForward<Exec>{pre, out, bias});
}

template <class Exec>
struct GeluBackward {
  Vec<Exec> dinp;
  ConstVec<Exec> inp, dout;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const float x = inp(i);
    const float th = fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x));
    const float dth = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x) * (1.0f - th * th);
    dinp(i) = (0.5f * (1.0f + th) + 0.5f * x * dth) * dout(i);
  }
};

// dinp = gelu'(inp) * dout; dinp, dout, inp: (n) flattened
template <class Exec>
void gelu_backward(const Exec& exec, const Vec<Exec>& dinp, const ConstVec<Exec>& inp, const ConstVec<Exec>& dout) {
  Kokkos::parallel_for("lamina::gelu_backward", Range<Exec>(exec, 0, static_cast<std::int64_t>(dinp.extent(0))),
                       GeluBackward<Exec>{dinp, inp, dout});
}

}  // namespace lamina
