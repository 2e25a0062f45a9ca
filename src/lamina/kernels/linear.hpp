#pragma once
// Dense layers. linear: y = x @ W + b with W in HuggingFace Conv1D layout (in, out).
// tied head: logits = x @ E^T with E the (V, C) token embedding (no bias).
#include "lamina/kernels/gemm.hpp"
#include "lamina/kernels/gelu.hpp"
#include "lamina/kernels/swiglu.hpp"

namespace lamina {

template <class Exec>
struct LinearBiasBroadcast {
  Mat<Exec> out;
  ConstVec<Exec> bias;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j) const { out(i, j) = bias(j); }
};

// out = product + bias (if any), rounded into bf16 storage: a product's epilogue.
template <class Exec>
struct LinearBiasStore {
  Mat16<Exec> out;
  ConstMat<Exec> product;
  ConstVec<Exec> bias;
  bool has_bias;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    out(i, j) = to_bf16(has_bias ? product(i, j) + bias(j) : product(i, j));
  }
};

// Every product takes `math` (ProductMath): bf16 reads its operands rounded to bf16 where the
// execution space has a bf16 engine (gemm.hpp), and always sums in fp32. Weights are fp32 or
// bf16 (MatRef), activations fp32 or bf16 as the run stores them; `scratch` (gemm.hpp,
// product_scratch) is where products convert what their engine cannot read as it is.

namespace detail {
// out = inp @ weight (+ beta out): inp as stored.
template <class Exec, class InV>
void linear_product(const Exec& exec, const Mat<Exec>& out, const InV& inp, const MatRefArg<Exec>& weight,
                    float beta, ProductMath math, const Vec<Exec>& scratch) {
  if constexpr (std::is_same<StoredType<InV>, std::uint16_t>::value) {
    gemm(exec, "N", 1.0f, ConstMat16<Exec>(inp), weight, beta, out, math, scratch);
  } else {
    gemm(exec, "N", "N", 1.0f, inp, weight, beta, out, math, scratch);
  }
}
}  // namespace detail

// out: (N, OC) fp32; inp: (N, IC) fp32 or bf16; weight: (IC, OC); bias: (OC), or empty for
// none (where the kernel reading out adds it: residual_forward, bias_gelu_forward)
template <class Exec, class InV>
void linear_forward(const Exec& exec, const Mat<Exec>& out, const InV& inp, const MatRefArg<Exec>& weight,
                    const ConstVec<Exec>& bias, ProductMath math, const Vec<Exec>& scratch = Vec<Exec>()) {
  const std::int64_t N = static_cast<std::int64_t>(out.extent(0));
  const std::int64_t OC = static_cast<std::int64_t>(out.extent(1));
  if (bias.data() == nullptr) {
    detail::linear_product(exec, out, inp, weight, 0.0f, math, scratch);
    return;
  }
  // Broadcasting the bias first lets the product accumulate onto it (beta = 1) instead
  // of a second pass over the output.
  Kokkos::parallel_for(
      "lamina::linear_forward_bias",
      RowMajor<Exec, 2>(exec, {0, 0}, {N, OC}),
      LinearBiasBroadcast<Exec>{out, bias});
  detail::linear_product(exec, out, inp, weight, 1.0f, math, scratch);
}

// The same with out stored in bf16: where the products round (rounding_products), the
// product writes out with its bias as its epilogue; else the product into `product` (N, OC)
// fp32, then its bias (if any) added as it is rounded into out, in one pass.
template <class Exec, class InV>
void linear_forward(const Exec& exec, const Mat16<Exec>& out, const InV& inp, const MatRefArg<Exec>& weight,
                    const ConstVec<Exec>& bias, ProductMath math, const Vec<Exec>& scratch, const Mat<Exec>& product) {
  const std::int64_t N = static_cast<std::int64_t>(out.extent(0));
  const std::int64_t OC = static_cast<std::int64_t>(out.extent(1));
  if constexpr (std::is_same<StoredType<InV>, std::uint16_t>::value) {
    if (weight.bf16() && rounding_products<Exec>(math, bias.data() != nullptr)) {
      gemm_rounded(exec, "N", ConstMat16<Exec>(inp), weight, bias, out);
      return;
    }
  }
  detail::linear_product(exec, product, inp, weight, 0.0f, math, scratch);
  Kokkos::parallel_for("lamina::linear_forward_bias_bf16", RowMajor<Exec, 2>(exec, {0, 0}, {N, OC}),
                       LinearBiasStore<Exec>{out, product, bias, bias.data() != nullptr});
}

// The MLP's first layer with GELU, stored in bf16: pre = inp @ weight + bias (kept for
// backward) and out = gelu(pre). Where the products apply GELU as their epilogue
// (gelu_epilogue: cuBLASLt), one product writes both; where they write bf16 with their bias
// (rounding_products: a host's oneDNN), the product writes pre and one pass reads it for out;
// else the product into `product` (N, F) fp32, and one pass adds the bias and writes both.
template <class Exec>
void linear_gelu_forward(const Exec& exec, const Mat16<Exec>& pre, const Mat16<Exec>& out,
                         const ConstMat16<Exec>& inp, const MatRefArg<Exec>& weight, const ConstVec<Exec>& bias,
                         ProductMath math, const Vec<Exec>& scratch, const Mat<Exec>& product) {
  const bool has_bias = bias.data() != nullptr;
  if (weight.bf16() && has_bias && gelu_epilogue<Exec>(math, static_cast<std::int64_t>(pre.stride_0()))) {
    gemm_rounded_gelu(exec, inp, weight, bias, pre, out);
  } else if (weight.bf16() && rounding_products<Exec>(math, has_bias)) {
    gemm_rounded(exec, "N", inp, weight, bias, pre);
    bias_gelu_forward(exec, pre, out, pre, ConstVec<Exec>());
  } else {
    detail::linear_product(exec, product, inp, weight, 0.0f, math, scratch);
    bias_gelu_forward(exec, pre, out, product, bias);
  }
}

// dinp: (N, IC) overwritten, fp32 or (where rounds_input_gradient) bf16; dweight: (IC, OC)
// +=; dbias: (OC) +=, or empty when the caller reduces the bias gradient itself; inp: as
// stored; partials: for the bias gradient's partial column sums (column_partials(N, OC), or
// fewer but at least OC floats), where a device sums dout's columns (add_column_sums) or a
// host's bf16 engine sums them as it rounds dout for the products.
template <class Exec, class InV, class DV>
void linear_backward(const Exec& exec, const DV& dinp, const Mat<Exec>& dweight, const Vec<Exec>& dbias,
                     const ConstMat<Exec>& dout, const InV& inp, const MatRefArg<Exec>& weight,
                     const Vec<Exec>& partials, ProductMath math, const Vec<Exec>& scratch = Vec<Exec>()) {
  const bool summed =
      backward_products(exec, "T", weight, dout, inp, dinp, dweight, WeightGradient::xt_dy, math, scratch, dbias,
                        partials);
  if (dbias.data() != nullptr && !summed) add_column_sums(exec, dbias, dout, partials);
}

// The MLP's first layer backward through its GELU: dact is d loss / d gelu(pre) (N, OC) and
// pre the kept pre-activation (as stored). Where the products round dact (a bf16 engine), the
// pass that rounds it, and sums the bias gradient, multiplies by gelu'(pre) as it reads: dact
// is left as it was, and no fp32 gradient of pre is written.
// Elsewhere dact becomes that gradient in a pass of its own, then the layer's backward.
template <class Exec, class InV, class PV, class DV>
void linear_gelu_backward(const Exec& exec, const DV& dinp, const Mat<Exec>& dweight, const Vec<Exec>& dbias,
                          const Mat<Exec>& dact, const PV& pre, const InV& inp, const MatRefArg<Exec>& weight,
                          const Vec<Exec>& partials, ProductMath math, const Vec<Exec>& scratch = Vec<Exec>()) {
  if (rounds_output_gradient<Exec>(math, weight)) {
    const GeluGate<Exec, StoredType<PV>> gate{pre};
    backward_products(exec, "T", weight, ConstMat<Exec>(dact), inp, dinp, dweight, WeightGradient::xt_dy, math,
                      scratch, dbias, partials, gate);
    return;
  }
  const Vec<Exec> flat(dact.data(), dact.size());
  gelu_backward(exec, flat, VecOf<Exec, const StoredType<PV>>(pre.data(), pre.size()), ConstVec<Exec>(flat));
  linear_backward(exec, dinp, dweight, dbias, dact, inp, weight, partials, math, scratch);
}

// The MLP's first layer backward through SwiGLU: dact is d loss / d act (N, F), pre the kept
// [gate | up] (N, 2F, as stored), dpre (N, 2F) fp32 workspace for [dgate | dup]. Where the
// products round their output gradient (a bf16 engine, a bf16 weight and input, no bias),
// SwiGLU's backward writes [dgate | dup] in bf16 into dpre's memory and both products read
// it as stored: no fp32 gradient of [gate | up] is written, and no pass rounds it. Elsewhere
// it is written in fp32, then the layer's backward.
template <class Exec, class InV, class PV, class DV>
void linear_swiglu_backward(const Exec& exec, const DV& dinp, const Mat<Exec>& dweight, const Vec<Exec>& dbias,
                            const Mat<Exec>& dpre, const ConstMat<Exec>& dact, const PV& pre, const InV& inp,
                            const MatRefArg<Exec>& weight, const Vec<Exec>& partials, ProductMath math,
                            const Vec<Exec>& scratch = Vec<Exec>()) {
  if constexpr (std::is_same<StoredType<InV>, std::uint16_t>::value) {
    if (rounds_output_gradient<Exec>(math, weight) && dbias.data() == nullptr) {
      const Mat16<Exec> d16(reinterpret_cast<std::uint16_t*>(dpre.data()), dpre.extent(0), dpre.extent(1));
      swiglu_backward(exec, d16, pre, dact);
      backward_products_bf16(exec, weight, ConstMat16<Exec>(d16), ConstMat16<Exec>(inp), dinp, dweight, math);
      return;
    }
  }
  swiglu_backward(exec, dpre, pre, dact);
  linear_backward(exec, dinp, dweight, dbias, dpre, inp, weight, partials, math, scratch);
}

// logits: (N, V); inp: (N, C); embedding: (V, C)
template <class Exec>
void tied_head_forward(const Exec& exec, const Mat<Exec>& logits, const ConstMat<Exec>& inp,
                       const MatRefArg<Exec>& embedding, ProductMath math, const Vec<Exec>& scratch = Vec<Exec>()) {
  gemm(exec, "N", "T", 1.0f, inp, embedding, 0.0f, logits, math, scratch);
}
// inp stored in bf16 (a bf16 run's final norm output): read as it is by a bf16 engine.
template <class Exec>
void tied_head_forward(const Exec& exec, const Mat<Exec>& logits, const ConstMat16<Exec>& inp,
                       const MatRefArg<Exec>& embedding, ProductMath math, const Vec<Exec>& scratch) {
  gemm(exec, "T", 1.0f, inp, embedding, 0.0f, logits, math, scratch);
}

// dinp: (N, C) overwritten; dembedding: (V, C) +=; dlogits: (N, V); inp: fp32 or bf16
template <class Exec, class InV>
void tied_head_backward(const Exec& exec, const Mat<Exec>& dinp, const Mat<Exec>& dembedding,
                        const ConstMat<Exec>& dlogits, const InV& inp, const MatRefArg<Exec>& embedding,
                        ProductMath math, const Vec<Exec>& scratch = Vec<Exec>()) {
  backward_products(exec, "N", embedding, dlogits, inp, dinp, dembedding, WeightGradient::dyt_x, math, scratch);
}

}  // namespace lamina
