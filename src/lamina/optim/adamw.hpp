#pragma once
// AdamW (Loshchilov & Hutter, decoupled weight decay) with bias correction, in exactly
// PyTorch's order of operations (torch.optim.AdamW, single-tensor path), so that one
// step reproduces torch to float rounding. One kernel for every execution space: the
// same code updates optimizer-state subgroups on the host and on a device.
#include <algorithm>
#include <cmath>

#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/common.hpp"

namespace lamina {

// Scalars of one optimizer step, shared by all subgroups.
struct AdamWStep {
  float lr = 0.0f;
  float beta1 = 0.9f, beta2 = 0.999f, eps = 1e-8f;
  float bias_correction1 = 1.0f;       // 1 - beta1^t
  float bias_correction2_sqrt = 1.0f;  // sqrt(1 - beta2^t)
  float grad_scale = 1.0f;             // global-norm clipping coefficient

  static AdamWStep make(double lr, double beta1, double beta2, double eps, std::int64_t t, double grad_scale);
};

inline AdamWStep AdamWStep::make(double lr, double beta1, double beta2, double eps, std::int64_t t,
                                 double grad_scale) {
  AdamWStep s;
  s.lr = static_cast<float>(lr);
  s.beta1 = static_cast<float>(beta1);
  s.beta2 = static_cast<float>(beta2);
  s.eps = static_cast<float>(eps);
  s.bias_correction1 = static_cast<float>(1.0 - std::pow(beta1, static_cast<double>(t)));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(beta2, static_cast<double>(t))));
  s.grad_scale = static_cast<float>(grad_scale);
  return s;
}

// Elements below `split` decay by `decay_below`, the rest by `decay_above`: one launch updates
// a subgroup that holds both a layer's matrices and its biases and norm gains. Every
// multiply-add is an explicit fused one: nothing is left for a compiler to contract (nvcc
// does by default, g++ under -ffp-contract=fast), so that the host and the device, and any
// two compilers, give the same bits. `Round`: the update also writes each new value rounded
// to bf16 (a bf16 run's stored parameters), in the same pass.
template <class Exec, bool Round = false>
struct AdamWUpdate {
  Vec<Exec> params, m, v;
  ConstVec<Exec> grads;
  std::int64_t split;
  float decay_below, decay_above, one_minus_b1, one_minus_b2, step_size, bc2_sqrt, eps, b2, gs;
  Bf16Vec<Exec> rounded;  // Round: (n), beside params
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const float g = grads(i) * gs;
    const float mi = math::fma(one_minus_b1, g - m(i), m(i));  // torch: exp_avg.lerp_(grad, 1 - beta1)
    const float vi = math::fma(b2, v(i), (one_minus_b2 * g) * g);
    const float denom = math::sqrt(vi) / bc2_sqrt + eps;
    const float p = math::fma(-step_size, mi / denom, params(i) * (i < split ? decay_below : decay_above));
    params(i) = p;
    m(i) = mi;
    v(i) = vi;
    if constexpr (Round) rounded(i) = to_bf16(p);
  }
};

namespace detail {

template <class Exec, bool Round = false>
AdamWUpdate<Exec, Round> adamw_functor(const Vec<Exec>& params, const Vec<Exec>& m, const Vec<Exec>& v,
                                       const ConstVec<Exec>& grads, const AdamWStep& s, std::int64_t split,
                                       float wd_below, float wd_above, const Bf16Vec<Exec>& rounded = Bf16Vec<Exec>()) {
  return AdamWUpdate<Exec, Round>{params,
                                  m,
                                  v,
                                  grads,
                                  split,
                                  1.0f - s.lr * wd_below,
                                  1.0f - s.lr * wd_above,
                                  1.0f - s.beta1,
                                  1.0f - s.beta2,
                                  s.lr / s.bias_correction1,
                                  s.bias_correction2_sqrt,
                                  s.eps,
                                  s.beta2,
                                  s.grad_scale,
                                  rounded};
}

template <class Exec, bool Round>
void adamw_launch(const Exec& exec, const Vec<Exec>& params, const Vec<Exec>& m, const Vec<Exec>& v,
                  const ConstVec<Exec>& grads, const AdamWStep& s, std::int64_t split, float wd_below, float wd_above,
                  const Bf16Vec<Exec>& rounded) {
  const std::int64_t n = static_cast<std::int64_t>(params.extent(0));
  if (n == 0) return;
  for_each_element("lamina::adamw_update", exec, n,
                   adamw_functor<Exec, Round>(params, m, v, grads, s, split, wd_below, wd_above, rounded));
}

}  // namespace detail

// params, m, v: (n) updated in place; grads: (n). All four are slices of the same range.
template <class Exec>
void adamw_update(const Exec& exec, const Vec<Exec>& params, const Vec<Exec>& m, const Vec<Exec>& v,
                  const ConstVec<Exec>& grads, const AdamWStep& s, float weight_decay) {
  detail::adamw_launch<Exec, false>(exec, params, m, v, grads, s, static_cast<std::int64_t>(params.extent(0)),
                                    weight_decay, weight_decay, Bf16Vec<Exec>());
}

// Updates elements [begin, begin + n) of one layer's flat buffer in one launch; the four views
// start at element `begin`. Layer elements below `matrix_end` are matrices (always decayed);
// the rest are biases and norm gains, decayed only when `decay_vectors`. With `rounded` (n
// elements, else empty), the new values rounded to bf16 go there too.
template <class Exec>
void adamw_update_range(const Exec& exec, const Vec<Exec>& params, const Vec<Exec>& m, const Vec<Exec>& v,
                        const ConstVec<Exec>& grads, std::int64_t begin, std::int64_t matrix_end, const AdamWStep& s,
                        float weight_decay, bool decay_vectors, const Bf16Vec<Exec>& rounded = Bf16Vec<Exec>()) {
  const std::int64_t n = static_cast<std::int64_t>(params.extent(0));
  const std::int64_t split = std::min(std::max(matrix_end - begin, std::int64_t(0)), n);
  const float above = decay_vectors ? weight_decay : 0.0f;
  if (rounded.data() != nullptr) {
    detail::adamw_launch<Exec, true>(exec, params, m, v, grads, s, split, weight_decay, above, rounded);
  } else {
    detail::adamw_launch<Exec, false>(exec, params, m, v, grads, s, split, weight_decay, above, rounded);
  }
}

}  // namespace lamina
