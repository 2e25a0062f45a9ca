#pragma once
// Token + position embedding (GPT-2 "encoder"): out[b,t,:] = wte[tok[b,t],:] + wpe[t,:].
#include "lamina/kernels/common.hpp"

namespace lamina {

// out: (B*T, C); tokens: (B*T); wte: (V, C); wpe: (>=T, C)
template <class Exec>
void embedding_forward(const Exec& exec, const Mat<Exec>& out, const Tokens<Exec>& tokens, const ConstMat<Exec>& wte,
                       const ConstMat<Exec>& wpe, std::int64_t T) {
  const std::int64_t N = static_cast<std::int64_t>(out.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(out.extent(1));
  Kokkos::parallel_for(
      "lamina::embedding_forward", Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(
                                       exec, {0, 0}, {N, C}),
      KOKKOS_LAMBDA(std::int64_t i, std::int64_t c) { out(i, c) = wte(tokens(i), c) + wpe(i % T, c); });
}

// dwte: (V, C) +=; dwpe: (>=T, C) +=; dout: (B*T, C).
// One thread per channel walks all rows in order: no atomics, so repeated tokens sum
// in a fixed order and the result is bitwise reproducible.
template <class Exec>
void embedding_backward(const Exec& exec, const Mat<Exec>& dwte, const Mat<Exec>& dwpe, const ConstMat<Exec>& dout,
                        const Tokens<Exec>& tokens, std::int64_t T) {
  const std::int64_t N = static_cast<std::int64_t>(dout.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(dout.extent(1));
  Kokkos::parallel_for(
      "lamina::embedding_backward_wte", Range<Exec>(exec, 0, C), KOKKOS_LAMBDA(std::int64_t c) {
        for (std::int64_t i = 0; i < N; ++i) dwte(tokens(i), c) += dout(i, c);
      });
  const std::int64_t B = N / T;
  Kokkos::parallel_for(
      "lamina::embedding_backward_wpe",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(exec, {0, 0}, {T, C}),
      KOKKOS_LAMBDA(std::int64_t t, std::int64_t c) {
        float s = 0.0f;
        for (std::int64_t b = 0; b < B; ++b) s += dout(b * T + t, c);
        dwpe(t, c) += s;
      });
}

}  // namespace lamina
