#pragma once
// GELU, tanh approximation (GPT-2; PyTorch approximate="tanh"):
//   gelu(x) = 0.5 x (1 + tanh(s (x + 0.044715 x^3))),  s = sqrt(2 / pi)
#include <type_traits>

#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/fast_math.hpp"

namespace lamina {

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

KOKKOS_INLINE_FUNCTION float gelu(float x) {
  return 0.5f * x * (1.0f + fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x)));
}

// The MLP's bias and activation in one pass, by rows: the product's output in
// (fp32, or bf16 where the product rounded it into the pre-activation itself), the
// pre-activation and the activation out in their storage type T.
template <class Exec, class P, class T>
struct BiasGeluForward {
  MatOf<Exec, const P> product;
  MatOf<Exec, T> pre, out;
  ConstVec<Exec> bias;
  bool has_bias, writes_pre;
  KOKKOS_INLINE_FUNCTION void element(std::int64_t i, std::int64_t j) const {
    const float x = has_bias ? widen(product(i, j)) + bias(j) : widen(product(i, j));
    if (writes_pre) put(pre(i, j), x);
    put(out(i, j), gelu(x));
  }
  void row(std::int64_t i) const {
    const P* y = &product(i, 0);
    T *p = &pre(i, 0), *o = &out(i, 0);
    const float* b = bias.data();
    const std::int64_t n = static_cast<std::int64_t>(pre.extent(1));
    // A loop per case, so that each vectorizes: a bias read only where there is one, and pre
    // written only where it is not the product itself.
    auto loop = [&](auto add, auto keep) {
      for (std::int64_t j = 0; j < n; ++j) {
        float x = widen(y[j]);
        if constexpr (decltype(add)::value) x += b[j];
        if constexpr (decltype(keep)::value) put(p[j], x);
        put(o[j], gelu(x));
      }
    };
    using yes = std::true_type;
    using no = std::false_type;
    if (has_bias) {
      writes_pre ? loop(yes{}, yes{}) : loop(yes{}, no{});
    } else {
      writes_pre ? loop(no{}, yes{}) : loop(no{}, no{});
    }
  }
};

// pre: (N, F) = product + bias (kept for backward); out: (N, F) = gelu(pre), both as stored;
// product: (N, F) the product, fp32 without its bias, or pre itself (its bias included where
// the product's epilogue added it: bias empty)
template <class Exec, class V, class PV>
void bias_gelu_forward(const Exec& exec, const V& pre, const V& out, const PV& product, const ConstVec<Exec>& bias) {
  using P = StoredType<PV>;
  const bool has_bias = bias.data() != nullptr;
  const bool writes_pre = has_bias || static_cast<const void*>(product.data()) != static_cast<const void*>(pre.data());
  detail::for_each_row_element("lamina::bias_gelu_forward", exec, static_cast<std::int64_t>(pre.extent(0)),
                       static_cast<std::int64_t>(pre.extent(1)),
                       BiasGeluForward<Exec, P, StoredType<V>>{MatOf<Exec, const P>(product), pre, out, bias, has_bias,
                                                               writes_pre});
}

KOKKOS_INLINE_FUNCTION float gelu_grad(float x) {
  const float th = fast_tanh(kGeluScale * (x + kGeluCubic * x * x * x));
  const float dth = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x) * (1.0f - th * th);
  return 0.5f * (1.0f + th) + 0.5f * x * dth;
}

template <class Exec, class T>
struct GeluBackward {
  Vec<Exec> dinp;
  VecOf<Exec, const T> inp;
  ConstVec<Exec> dout;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dinp(i) = gelu_grad(widen(inp(i))) * dout(i); }
};

// The GELU's backward as the pass that rounds the MLP's output gradient for its first
// layer's products applies it (backward_products' gate): gelu'(pre(i, j)) * dy, pre as stored.
template <class Exec, class T>
struct GeluGate {
  MatOf<Exec, const T> pre;
  KOKKOS_INLINE_FUNCTION float operator()(float dy, std::int64_t i, std::int64_t j) const {
    return gelu_grad(widen(pre(i, j))) * dy;
  }
  struct Row {
    const T* pre;
    KOKKOS_INLINE_FUNCTION float operator()(float dy, std::int64_t j) const { return gelu_grad(widen(pre[j])) * dy; }
  };
  KOKKOS_INLINE_FUNCTION Row row(std::int64_t i) const { return {&pre(i, 0)}; }
};

// dinp = gelu'(inp) * dout; dinp, dout, inp: (n) flattened, inp as stored (float or bf16)
template <class Exec, class InV>
void gelu_backward(const Exec& exec, const Vec<Exec>& dinp, const InV& inp, const ConstVec<Exec>& dout) {
  Kokkos::parallel_for("lamina::gelu_backward", Range<Exec>(exec, 0, static_cast<std::int64_t>(dinp.extent(0))),
                       GeluBackward<Exec, StoredType<InV>>{dinp, inp, dout});
}

}  // namespace lamina
