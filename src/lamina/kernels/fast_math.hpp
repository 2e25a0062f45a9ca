#pragma once
// exp and tanh as straight-line arithmetic. libm's expf/tanhf are scalar calls on the
// host (2 and 10 ns), which made softmax, cross-entropy and GELU cost more than the
// GEMMs around them; these vectorize (and are cheap on GPUs too). Both are accurate to
// a few float ulps, far inside what the model tests demand (1e-4 against float64 torch).
#include <cstdint>
#include <cstring>

#include "lamina/core/kokkos_compat.hpp"

namespace lamina {

// exp(x) = 2^n exp(r), n = round(x / ln 2), |r| <= ln(2)/2 (Cody-Waite reduction with a
// two-part ln 2); exp(r) by its degree-7 Taylor polynomial (truncation error 5e-9).
// Inputs are clamped to [-87.3, 88.3], where n stays a normal float exponent; a NaN goes
// through as itself. The clamp, written with the constant first, sends a NaN to -87.3 (a
// NaN converted to an integer is undefined behaviour) and compiles to one vector minimum
// and maximum each.
KOKKOS_FORCEINLINE_FUNCTION float fast_exp(float in) {
  const float x = math::min(88.3f, math::max(-87.3f, in));
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float n = (x * 1.44269504088896341f + kRound) - kRound;
  const float r = (x - n * 0.693145751953125f) - n * 1.42860682030941723e-6f;
  const float p =
      1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f + r * (8.3333338e-3f +
                                                                                  r * (1.3888889e-3f + r * 1.9841270e-4f))))));
  const std::int32_t bits = (static_cast<std::int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));  // 2^n
  return in == in ? p * scale : in;
}

// tanh as a rational function x P(x^2) / Q(x^2) on |x| <= 9 (|tanh| rounds to 1 beyond),
// coefficients fitted for lamina (perf/fit_tanh.py): max abs error 3.6e-7 in float.
KOKKOS_FORCEINLINE_FUNCTION float fast_tanh(float x) {
  const float xc = math::min(math::max(x, -9.0f), 9.0f);
  const float u = xc * xc;
  const float p = (((1.3373877e-08f * u + 2.0623149e-05f) * u + 3.4964498e-03f) * u + 1.3381753e-01f) * u +
                  9.9999998e-01f;
  const float q = (((7.7844849e-07f * u + 3.2870395e-04f) * u + 2.5880266e-02f) * u + 4.6715069e-01f) * u + 1.0f;
  return xc * p / q;
}

}  // namespace lamina
