#pragma once
// GPT-2 forward and backward, one piece per layer (embedding, block, head), so that
// schedules can run any layer range on any micro-batch. Each piece is a Kokkos
// profiling region; kernels are in lamina/kernels.
//
//   x0 = wte[tokens] + wpe                      embedding
//   x_{l+1} = block_l(x_l)                      l = 0..L-1, pre-LayerNorm:
//       x2 = x + c_proj(attn(c_attn(ln_1(x))));  out = x2 + mlp(ln_2(x2))
//   loss_i = CE(ln_f(x_L) @ wte^T, target_i)    head (tied LM head)
#include <Kokkos_Core.hpp>

#include "lamina/kernels/attention.hpp"
#include "lamina/kernels/cross_entropy.hpp"
#include "lamina/kernels/embedding.hpp"
#include "lamina/kernels/gelu.hpp"
#include "lamina/kernels/layernorm.hpp"
#include "lamina/kernels/linear.hpp"
#include "lamina/kernels/residual.hpp"
#include "lamina/model/gpt_activations.hpp"
#include "lamina/model/gpt_tensors.hpp"

namespace lamina {

namespace detail {
// A matrix seen as a flat vector (elementwise ops do not care about shape).
template <class V>
Kokkos::View<float*, Kokkos::LayoutRight, typename V::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>> flat(
    const V& m) {
  using Flat =
      Kokkos::View<float*, Kokkos::LayoutRight, typename V::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  return Flat(m.data(), m.size());
}
}  // namespace detail

template <class Exec>
void embed_forward(const Exec& exec, const GptTensors<Exec>& w, GptActivations<Exec>& a) {
  Kokkos::Profiling::pushRegion("lamina::embed_forward");
  embedding_forward(exec, a.embed_out, a.inputs, w.wte, w.wpe, a.dims().T);
  Kokkos::Profiling::popRegion();
}

// dres: (N, C) gradient of the embedding output
template <class Exec>
void embed_backward(const Exec& exec, const GptTensors<Exec>& g, GptActivations<Exec>& a) {
  Kokkos::Profiling::pushRegion("lamina::embed_backward");
  embedding_backward(exec, g.wte, g.wpe, a.ws.dres, a.inputs, a.dims().T);
  Kokkos::Profiling::popRegion();
}

// Block l of the stack: reads its input (embedding output or block l-1's output).
template <class Exec>
const Mat<Exec>& block_input(const GptActivations<Exec>& a, std::int64_t l) {
  return l == 0 ? a.embed_out : a.block[l - 1].out;
}

template <class Exec>
void block_forward(const Exec& exec, const BlockTensors<Exec>& w, GptActivations<Exec>& a, std::int64_t l) {
  Kokkos::Profiling::pushRegion("lamina::block_forward");
  BlockActs<Exec>& s = a.block[l];
  Workspace<Exec>& ws = a.ws;
  const Mat<Exec>& x = block_input(a, l);
  layernorm_forward(exec, s.ln1, s.ln1_mean, s.ln1_rstd, x, w.ln1_w, w.ln1_b);
  linear_forward(exec, ws.qkv, s.ln1, w.qkv_w, w.qkv_b);
  attention_forward(exec, s.atty, s.q, s.k, s.v, s.att, ws.y, ws.qkv, a.dims().NH);
  linear_forward(exec, ws.attproj, s.atty, w.proj_w, w.proj_b);
  residual_forward(exec, detail::flat(s.x2), detail::flat(x), detail::flat(ws.attproj));
  layernorm_forward(exec, s.ln2, s.ln2_mean, s.ln2_rstd, s.x2, w.ln2_w, w.ln2_b);
  linear_forward(exec, s.fch, s.ln2, w.fc_w, w.fc_b);
  gelu_forward(exec, detail::flat(s.fch_gelu), detail::flat(s.fch));
  linear_forward(exec, ws.fcproj, s.fch_gelu, w.fcproj_w, w.fcproj_b);
  residual_forward(exec, detail::flat(s.out), detail::flat(s.x2), detail::flat(ws.fcproj));
  Kokkos::Profiling::popRegion();
}

// On entry a.ws.dres holds d loss / d(block output); on exit d loss / d(block input).
// Parameter gradients accumulate into g.
template <class Exec>
void block_backward(const Exec& exec, const BlockTensors<Exec>& g, const BlockTensors<Exec>& w,
                    GptActivations<Exec>& a, std::int64_t l) {
  Kokkos::Profiling::pushRegion("lamina::block_backward");
  BlockActs<Exec>& s = a.block[l];
  Workspace<Exec>& ws = a.ws;
  const Mat<Exec>& x = block_input(a, l);
  // MLP branch: out = x2 + c_proj(gelu(c_fc(ln_2(x2))))
  linear_backward(exec, ws.dfch, g.fcproj_w, g.fcproj_b, ws.dres, s.fch_gelu, w.fcproj_w, ws.ones);
  gelu_backward(exec, detail::flat(ws.dfch), detail::flat(s.fch), detail::flat(ws.dfch));
  linear_backward(exec, ws.dln, g.fc_w, g.fc_b, ws.dfch, s.ln2, w.fc_w, ws.ones);
  layernorm_backward(exec, ws.dres, g.ln2_w, g.ln2_b, ws.dln, ws.dres, s.x2, w.ln2_w, s.ln2_mean, s.ln2_rstd,
                     ws.scratch, ws.ones);
  // attention branch: x2 = x + c_proj(attn(c_attn(ln_1(x))))
  linear_backward(exec, ws.datty, g.proj_w, g.proj_b, ws.dres, s.atty, w.proj_w, ws.ones);
  attention_backward(exec, ws.dqkv, ws.dq, ws.dk, ws.dv, ws.datt, ws.dy, ws.datty, s.q, s.k, s.v, s.att,
                     a.dims().NH);
  linear_backward(exec, ws.dln, g.qkv_w, Vec<Exec>(), ws.dqkv, s.ln1, w.qkv_w, ws.ones);
  qkv_bias_backward(exec, g.qkv_b, ws.dqkv, ws.qkv_bias_sums, ws.ones);
  layernorm_backward(exec, ws.dres, g.ln1_w, g.ln1_b, ws.dln, ws.dres, x, w.ln1_w, s.ln1_mean, s.ln1_rstd,
                     ws.scratch, ws.ones);
  Kokkos::Profiling::popRegion();
}

// Final norm, tied LM head and per-position losses (a.head.losses).
template <class Exec>
void head_forward(const Exec& exec, const GptTensors<Exec>& w, GptActivations<Exec>& a) {
  Kokkos::Profiling::pushRegion("lamina::head_forward");
  HeadActs<Exec>& h = a.head;
  const Mat<Exec>& x = block_input(a, static_cast<std::int64_t>(a.block.size()));
  layernorm_forward(exec, h.lnf, h.lnf_mean, h.lnf_rstd, x, w.lnf_w, w.lnf_b);
  tied_head_forward(exec, h.logits, h.lnf, w.wte);
  cross_entropy_forward(exec, h.losses, h.lse, h.logits, a.targets);
  Kokkos::Profiling::popRegion();
}

// loss_scale: d(objective)/d(loss_i), e.g. 1 / (positions in the global batch).
// Leaves d objective / d(last block output) in a.ws.dres.
template <class Exec>
void head_backward(const Exec& exec, const GptTensors<Exec>& g, const GptTensors<Exec>& w, GptActivations<Exec>& a,
                   float loss_scale) {
  Kokkos::Profiling::pushRegion("lamina::head_backward");
  HeadActs<Exec>& h = a.head;
  const Mat<Exec>& x = block_input(a, static_cast<std::int64_t>(a.block.size()));
  cross_entropy_backward(exec, h.logits, h.logits, h.lse, a.targets, loss_scale);
  tied_head_backward(exec, a.ws.dln, g.wte, h.logits, h.lnf, w.wte);
  layernorm_backward(exec, a.ws.dres, g.lnf_w, g.lnf_b, a.ws.dln, ConstMat<Exec>(), x, w.lnf_w, h.lnf_mean,
                     h.lnf_rstd, a.ws.scratch, a.ws.ones);
  Kokkos::Profiling::popRegion();
}

// The whole model on the micro-batch in a.inputs / a.targets.
template <class Exec>
void gpt_forward(const Exec& exec, const GptTensors<Exec>& w, GptActivations<Exec>& a) {
  embed_forward(exec, w, a);
  for (std::size_t l = 0; l < a.block.size(); ++l) block_forward(exec, w.blocks[l], a, static_cast<std::int64_t>(l));
  head_forward(exec, w, a);
}

template <class Exec>
void gpt_backward(const Exec& exec, const GptTensors<Exec>& g, const GptTensors<Exec>& w, GptActivations<Exec>& a,
                  float loss_scale) {
  head_backward(exec, g, w, a, loss_scale);
  for (std::size_t l = a.block.size(); l-- > 0;) block_backward(exec, g.blocks[l], w.blocks[l], a, static_cast<std::int64_t>(l));
  embed_backward(exec, g, a);
}

// Sum of the per-position losses of the last forward pass, accumulated in double.
template <class Exec>
double sum_losses(const Exec& exec, const GptActivations<Exec>& a) {
  const Vec<Exec> losses = a.head.losses;
  double total = 0.0;
  Kokkos::parallel_reduce(
      "lamina::sum_losses", Range<Exec>(exec, 0, static_cast<std::int64_t>(losses.extent(0))),
      KOKKOS_LAMBDA(std::int64_t i, double& s) { s += losses(i); }, total);
  return total;
}

}  // namespace lamina
