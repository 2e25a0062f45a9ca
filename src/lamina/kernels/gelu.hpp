#pragma once
// GELU, tanh approximation (GPT-2; PyTorch approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2 / pi)
#include "lamina/kernels/common.hpp"

namespace lamina {

// tanh as a rational function x P(x^2) / Q(x^2) on |x| <= 9 (|tanh| rounds to 1 beyond).
// Pure arithmetic, so compilers vectorize it on the host (libm's tanhf is a scalar call,
// ~10 ns, which made GELU the slowest op of a step) and it is cheap on GPUs. The
// coefficients were fitted for lamina (perf/fit_tanh.py): max abs error 3.6e-7 in float.
KOKKOS_FORCEINLINE_FUNCTION float fast_tanh(float x) {
  const float xc = math::min(math::max(x, -9.0f), 9.0f);
  const float u = xc * xc;
  const float p = (((1.3373877e-08f * u + 2.0623149e-05f) * u + 3.4964498e-03f) * u + 1.3381753e-01f) * u +
                  9.9999998e-01f;
  const float q = (((7.7844849e-07f * u + 3.2870395e-04f) * u + 2.5880266e-02f) * u + 4.6715069e-01f) * u + 1.0f;
  return xc * p / q;
}

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// out, inp: (n) flattened
template <class Exec>
void gelu_forward(const Exec& exec, const Vec<Exec>& out, const ConstVec<Exec>& inp) {
  Kokkos::parallel_for(
      "lamina::gelu_forward", Range<Exec>(exec, 0, static_cast<std::int64_t>(out.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float x = inp(i);
        out(i) = 0.5f * x * (1.0f + fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
      });
}

// dinp = gelu'(inp) * dout; dinp, dout, inp: (n) flattened
template <class Exec>
void gelu_backward(const Exec& exec, const Vec<Exec>& dinp, const ConstVec<Exec>& inp, const ConstVec<Exec>& dout) {
  Kokkos::parallel_for(
      "lamina::gelu_backward", Range<Exec>(exec, 0, static_cast<std::int64_t>(dinp.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i) {
        const float x = inp(i);
        const float th = fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x));
        const float dth = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x) * (1.0f - th * th);
        dinp(i) = (0.5f * (1.0f + th) + 0.5f * x * dth) * dout(i);
      });
}

}  // namespace lamina
