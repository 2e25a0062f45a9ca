#pragma once
// SwiGLU (Shazeer 2020; Llama's MLP): out = silu(gate) * up, silu(x) = x / (1 + e^-x), with
// gate and up the two halves of one product's output (N, 2F) = [gate | up], so that the
// MLP's first two products are one. The halves are kept for backward in their storage type
// (float, or bf16 in bf16 runs) as GELU keeps its pre-activation; arithmetic is fp32.
#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/fast_math.hpp"

namespace lamina {

KOKKOS_INLINE_FUNCTION float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

// By rows: the product's output in (fp32, or bf16 where the product rounded it
// into the kept halves themselves), the kept halves and the activation out in their storage
// type T.
template <class Exec, class P, class T>
struct SwigluForward {
  MatOf<Exec, const P> product;
  MatOf<Exec, T> pre, out;
  bool writes_pre;
  KOKKOS_INLINE_FUNCTION void element(std::int64_t i, std::int64_t j) const {
    const std::int64_t F = static_cast<std::int64_t>(out.extent(1));
    if (writes_pre) {
      put(pre(i, j), widen(product(i, j)));
      put(pre(i, F + j), widen(product(i, F + j)));
    }
    // From the values as kept, so that backward differentiates what forward computed.
    const float gs = widen(pre(i, j)), us = widen(pre(i, F + j));
    put(out(i, j), gs * sigmoid(gs) * us);
  }
  void row(std::int64_t i) const {
    const std::int64_t F = static_cast<std::int64_t>(out.extent(1));
    const P* y = &product(i, 0);
    T *p = &pre(i, 0), *o = &out(i, 0);
    if (writes_pre) {
      for (std::int64_t j = 0; j < 2 * F; ++j) put(p[j], widen(y[j]));
    }
    for (std::int64_t j = 0; j < F; ++j) {
      const float gs = widen(p[j]), us = widen(p[F + j]);
      put(o[j], gs * sigmoid(gs) * us);
    }
  }
};

// pre: (N, 2F) = [gate | up] as stored, kept for backward; out: (N, F) = silu(gate) * up as
// stored; product: (N, 2F) fp32, or pre itself
template <class Exec, class V, class PV>
void swiglu_forward(const Exec& exec, const V& pre, const V& out, const PV& product) {
  using P = StoredType<PV>;
  const bool writes_pre = static_cast<const void*>(product.data()) != static_cast<const void*>(pre.data());
  detail::for_each_row_element("lamina::swiglu_forward", exec, static_cast<std::int64_t>(out.extent(0)),
                       static_cast<std::int64_t>(out.extent(1)),
                       SwigluForward<Exec, P, StoredType<V>>{MatOf<Exec, const P>(product), pre, out, writes_pre});
}

template <class Exec, class T, class D>
struct SwigluBackward {
  MatOf<Exec, D> dpre;
  MatOf<Exec, const T> pre;
  ConstMat<Exec> dout;
  KOKKOS_INLINE_FUNCTION void element(std::int64_t i, std::int64_t j) const {
    const std::int64_t F = static_cast<std::int64_t>(dout.extent(1));
    const float g = widen(pre(i, j)), u = widen(pre(i, F + j)), s = sigmoid(g), d = dout(i, j);
    put(dpre(i, j), d * u * s * (1.0f + g * (1.0f - s)));  // silu'(g) = s (1 + g (1 - s))
    put(dpre(i, F + j), d * g * s);
  }
  void row(std::int64_t i) const {
    const std::int64_t F = static_cast<std::int64_t>(dout.extent(1));
    const T* p = &pre(i, 0);
    const float* dy = &dout(i, 0);
    D* dp = &dpre(i, 0);
    for (std::int64_t j = 0; j < F; ++j) {
      const float g = widen(p[j]), u = widen(p[F + j]), s = sigmoid(g), d = dy[j];
      put(dp[j], d * u * s * (1.0f + g * (1.0f - s)));
      put(dp[F + j], d * g * s);
    }
  }
};

// dpre: (N, 2F) = [dgate | dup], fp32, or bf16 (rounded to nearest) where the products read
// it as stored (linear_swiglu_backward); pre: (N, 2F) as forward kept it; dout: (N, F)
template <class Exec, class DV, class PreV>
void swiglu_backward(const Exec& exec, const DV& dpre, const PreV& pre, const ConstMat<Exec>& dout) {
  detail::for_each_row_element("lamina::swiglu_backward", exec, static_cast<std::int64_t>(dout.extent(0)),
                       static_cast<std::int64_t>(dout.extent(1)),
                       SwigluBackward<Exec, StoredType<PreV>, StoredType<DV>>{dpre, pre, dout});
}

}  // namespace lamina
