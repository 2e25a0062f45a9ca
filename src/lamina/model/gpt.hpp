#pragma once
// GPT forward and backward, one piece per layer (embedding, block, head), so that
// schedules can run any layer range on any micro-batch. Each piece is a Kokkos
// profiling region; kernels are in lamina/kernels. Shapes are this rank's
// tensor-parallel shard; ShardCombine joins the shards where Megatron does.
//
//   x0 = wte[tokens] + wpe                      embedding
//   x_{l+1} = block_l(x_l)                      l = 0..L-1, pre-norm:
//       x2 = x + c_proj(attn(c_attn(ln_1(x))));  out = x2 + mlp(ln_2(x2))
//   loss_i = CE(ln_f(x_L) @ wte^T, target_i)    head (tied LM head; or lm_head^T, untied)
//
// The block is built from its parts (Dims, core/config.hpp): GPT-2's LayerNorm, learned
// positions, GELU MLP and biases, or Llama's RMSNorm, rotary positions applied to q and k
// after c_attn, SwiGLU MLP (mlp = down(silu(gate) * up), gate and up one product) and no
// biases; attention multi-head or grouped-query (kernels/qkv_layout.hpp).
#include <Kokkos_Core.hpp>
#include <optional>

#include "lamina/kernels/attention.hpp"
#include "lamina/kernels/cross_entropy.hpp"
#include "lamina/kernels/embedding.hpp"
#include "lamina/kernels/gelu.hpp"
#include "lamina/kernels/layernorm.hpp"
#include "lamina/kernels/linear.hpp"
#include "lamina/kernels/residual.hpp"
#include "lamina/kernels/rmsnorm.hpp"
#include "lamina/kernels/rotary.hpp"
#include "lamina/kernels/swiglu.hpp"
#include "lamina/model/gpt_activations.hpp"
#include "lamina/model/gpt_tensors.hpp"
#include "lamina/model/shard_combine.hpp"

namespace lamina {

namespace detail {

// A matrix seen as a flat vector (elementwise ops do not care about shape).
template <class V>
Kokkos::View<typename V::value_type*, Kokkos::LayoutRight, typename V::memory_space,
             Kokkos::MemoryTraits<Kokkos::Unmanaged>>
flat(const V& m) {
  using Flat = Kokkos::View<typename V::value_type*, Kokkos::LayoutRight, typename V::memory_space,
                            Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  return Flat(m.data(), m.size());
}

// Where a product whose epilogue writes `kept` computes: kept itself (fp32), or (bf16) the
// workspace's fp32 stage.
template <class Exec, class T>
Mat<Exec> product_out(const MatOf<Exec, T>& kept, const Workspace<Exec>& ws) {
  if constexpr (std::is_same<T, float>::value) {
    return kept;
  } else {
    return as_mat<Exec>(ws.stage.data(), static_cast<std::int64_t>(kept.extent(0)),
                        static_cast<std::int64_t>(kept.extent(1)));
  }
}

// Runs a combine step on a view once the kernels that wrote it are done.
template <class Exec, class V>
void combine(const Exec& exec, const std::function<void(float*, std::int64_t)>& op, const V& v) {
  if (!op) return;
  exec.fence();
  op(v.data(), static_cast<std::int64_t>(v.size()));
}

// Sequence parallelism: all (N, C) rows of a stream tensor stored as T, of which `part` holds
// this rank's (R, C), gathered over the tensor-parallel group into `into`; else part itself.
template <class Exec, class T>
MatOf<Exec, T> all_rows(const Exec& exec, const ShardCombine& tp, const MatOf<Exec, T>& part,
                        const MatOf<Exec, T>& into) {
  if (!tp.gather) return part;
  exec.fence();
  // bf16 values travel as float words (pairs: tp divides the heads, which divide C).
  tp.gather(reinterpret_cast<const float*>(part.data()), reinterpret_cast<float*>(into.data()),
            static_cast<std::int64_t>(part.size() * sizeof(T) / sizeof(float)));
  return into;
}

// Sequence parallelism: the sum over the tensor-parallel group of the (N, C) partial results
// `full`, of which this rank keeps its (R, C) rows, in the workspace's gathered_grad.
template <class Exec>
Mat<Exec> scatter_sum_rows(const Exec& exec, const ShardCombine& tp, const Mat<Exec>& full, const Workspace<Exec>& ws) {
  const std::int64_t R = static_cast<std::int64_t>(full.extent(0)) / tp.shards;
  const std::int64_t C = static_cast<std::int64_t>(full.extent(1));
  const Mat<Exec> share = as_mat<Exec>(ws.gathered_grad.data(), R, C);
  exec.fence();
  tp.scatter_sum(full.data(), share.data(), R * C);
  return share;
}

// A row-parallel product (the attention's projection, the MLP's second) of inp, summed over
// the tensor-parallel group, handed to `then` for the kernel that reads it: in fp32 into
// `product`; or, where a bf16 run sums in bf16 (parallel.tp_sums, tp.sum16), written in bf16
// into `room` (workspace memory nothing else holds until `then` is done) by the product
// itself where products round (a host's oneDNN), else by the pass that rounds `product`, and
// summed and read as bf16 (half the bytes, as Megatron reduces its GEMMs' bf16 outputs).
// Under sequence parallelism the sum is a reduce-scatter and `then` gets this rank's rows:
// fp32 in the workspace's gathered_grad, bf16 in its gathered (free between the gathers).
template <class Exec, class T, class InV, class Then>
void row_parallel_forward(const Exec& exec, const ShardCombine& tp, const Mat<Exec>& product, float* room,
                          const InV& inp, const MatRefArg<Exec>& weight, ProductMath math, const Workspace<Exec>& ws,
                          const Then& then) {
  if constexpr (!std::is_same<T, float>::value) {
    if (tp.sum16) {
      const Mat16<Exec> sum(reinterpret_cast<std::uint16_t*>(room), product.extent(0), product.extent(1));
      linear_forward(exec, sum, inp, weight, ConstVec<Exec>(), math, ws.widened, product);
      exec.fence();
      if (tp.scatter_sum16) {
        const Mat16<Exec> share(reinterpret_cast<std::uint16_t*>(ws.gathered.data()), sum.extent(0) / tp.shards,
                                sum.extent(1));
        tp.scatter_sum16(sum.data(), share.data(), static_cast<std::int64_t>(share.size()));
        then(ConstMat16<Exec>(share));
        return;
      }
      tp.sum16(sum.data(), static_cast<std::int64_t>(sum.size()));
      then(ConstMat16<Exec>(sum));
      return;
    }
  }
  linear_forward(exec, product, inp, weight, ConstVec<Exec>(), math, ws.widened);
  if (tp.scatter_sum) {
    then(ConstMat<Exec>(scatter_sum_rows(exec, tp, product, ws)));
    return;
  }
  combine(exec, tp.sum, product);
  then(ConstMat<Exec>(product));
}

// Where a bf16 run sums in bf16 (tp.sum16), the partial gradients of a norm's output (ws.dln,
// (N, C)) in bf16: in ws.scratch, where the column-parallel products write them when they can
// (partials_written16), else a pass rounds ws.dln (combine_gradients).
template <class Exec>
Mat16<Exec> rounded_partials(const Workspace<Exec>& ws) {
  return Mat16<Exec>(reinterpret_cast<std::uint16_t*>(ws.scratch.data()), ws.dln.extent(0), ws.dln.extent(1));
}

// Whether a column-parallel product with weight w writes its input gradient in bf16 into
// rounded_partials for a bf16 sum: the products write bf16 without a bias (cuBLAS; a host's
// oneDNN), as Megatron's backward GEMMs write the bf16 gradients it all-reduces.
template <class Exec, class T>
bool partials_written16(const ShardCombine& tp, ProductMath math, const MatRefArg<Exec>& w) {
  return !std::is_same<T, float>::value && tp.sum16 && rounds_input_gradient<Exec>(math, w);
}

// Where attention runs on a host's oneDNN (reading its output gradient in bf16) and the
// output projection's backward can write its input gradient in bf16, ws.datty's memory as
// that bf16 gradient: the projection writes it, attention reads it, no pass rounds it. Else
// empty.
template <class Exec, class T>
Mat16<Exec> attention_gradient16(const BlockActs<Exec, T>& s, const Workspace<Exec>& ws,
                                 const MatRefArg<Exec>& proj_w) {
  if (std::is_same<T, float>::value || !attention_on_host_bf16<Exec>(s.attention, s.products) ||
      !rounds_input_gradient<Exec>(s.products, proj_w)) {
    return Mat16<Exec>();
  }
  return Mat16<Exec>(reinterpret_cast<std::uint16_t*>(ws.datty.data()), ws.datty.extent(0), ws.datty.extent(1));
}

// The tensor-parallel sum of the (N, C) partial gradients g = ws.dln of a norm's output (the
// column-parallel products' input gradients), handed to `then` with the scratch the norm's
// backward may use: in fp32, g itself and ws.scratch; or where a bf16 run sums in bf16,
// rounded into ws.scratch (unless `written16`: the products wrote them there), summed there
// and read as bf16 (its scratch is then g's memory). Under sequence parallelism the sum is a
// reduce-scatter and `then` gets this rank's (R, C) rows: fp32 in ws.gathered_grad, or bf16
// in ws.gathered.
template <class Exec, class T, class Then>
void combine_gradients(const Exec& exec, const ShardCombine& tp, bool written16, const Workspace<Exec>& ws,
                       const Then& then) {
  const Mat<Exec>& g = ws.dln;
  if constexpr (!std::is_same<T, float>::value) {
    if (tp.sum16 && !written16) {
      const Mat16<Exec> rounded = rounded_partials(ws);
      to_bf16(exec, Bf16Vec<Exec>(rounded.data(), rounded.size()), ConstVec<Exec>(flat(g)));
    }
    if (tp.scatter_sum16) {
      const Mat16<Exec> rounded = rounded_partials(ws);
      exec.fence();
      const Mat16<Exec> share(reinterpret_cast<std::uint16_t*>(ws.gathered.data()), g.extent(0) / tp.shards,
                              g.extent(1));
      tp.scatter_sum16(rounded.data(), share.data(), static_cast<std::int64_t>(share.size()));
      then(ConstMat16<Exec>(share), as_mat<Exec>(g.data(), static_cast<std::int64_t>(share.extent(0)),
                                                 static_cast<std::int64_t>(share.extent(1))));
      return;
    }
  }
  if (tp.scatter_sum) {
    const Mat<Exec> share = scatter_sum_rows(exec, tp, g, ws);
    then(ConstMat<Exec>(share), as_mat<Exec>(ws.scratch.data(), share.extent(0), share.extent(1)));
    return;
  }
  if constexpr (!std::is_same<T, float>::value) {
    if (tp.sum16) {
      const Mat16<Exec> sum = rounded_partials(ws);
      exec.fence();
      tp.sum16(sum.data(), static_cast<std::int64_t>(sum.size()));
      then(ConstMat16<Exec>(sum), g);
      return;
    }
  }
  combine(exec, tp.sum, g);
  then(ConstMat<Exec>(g), ws.scratch);
}

// The words (floats) of a matrix stored as T, as the ring passes them.
template <class Exec, class T>
float* words(const MatOf<Exec, T>& m) {
  return reinterpret_cast<float*>(m.data());
}

// Every rank's keys and values around the ring, packed as stored: f(held buffer, its source
// rank) for each of the cp sources in turn, the pass of the next one in flight meanwhile.
template <class Exec, class T, class F>
void around_the_ring(const Exec& exec, const ContextRing& ring, const BlockActs<Exec, T>& s, const Dims& d,
                     const Workspace<Exec>& ws, F f) {
  const MatOf<Exec, T> kv[2] = {ws.template ring_kv_as<T>(0), ws.template ring_kv_as<T>(1)};
  const std::int64_t n = static_cast<std::int64_t>(ws.ring_kv[0].size());
  ring_pack_keys_values(exec, kv[0], s.qkv);
  for (int step = 0; step < ring.size; ++step) {
    const MatOf<Exec, T>& here = kv[step % 2];
    const bool more = step + 1 < ring.size;
    if (more) {
      exec.fence();  // `here` is written, and the kernels that read the other buffer are done
      ring.pass(words<Exec, T>(here), words<Exec, T>(kv[(step + 1) % 2]), n, kRingKeys);
    }
    f(here, (d.context.rank - step + ring.size) % ring.size);
    if (more) ring.wait();
  }
}

// Staged products under context parallelism: every rank's keys and values placed at their
// positions in heads' copies as they come around the ring.
template <class Exec, class T>
void gather_keys_values(const Exec& exec, const ContextRing& ring, const BlockActs<Exec, T>& s, const Dims& d,
                        const Workspace<Exec>& ws, const AttentionWorkspace<Exec>& heads) {
  around_the_ring(exec, ring, s, d, ws, [&](const MatOf<Exec, T>& here, int source) {
    ring_place_keys_values(exec, heads, here, d.context, source, s.products);
  });
}

// Context parallelism: attention of this rank's queries against every rank's keys and values
// (ring attention), each source's passed on around the ring while this rank computes with it;
// staged products meet them all at once, gathered.
template <class Exec, class T>
void context_attention_forward(const Exec& exec, const ContextRing& ring, const BlockActs<Exec, T>& s, const Dims& d,
                               const Workspace<Exec>& ws) {
  if (s.attention == AttentionProducts::staged) {
    gather_keys_values(exec, ring, s, d, ws, ws.heads);
    attention_forward(exec, s.atty, s.att, s.qkv, ws.heads, d.NH, s.attention, s.products, d.context);
    return;
  }
  ring_attention_begin(exec, ws.ring);
  around_the_ring(exec, ring, s, d, ws, [&](const MatOf<Exec, T>& here, int source) {
    ring_attention_forward(exec, ws.ring, s.qkv, here, d.NH, d.context, source);
  });
  ring_attention_end(exec, s.atty, s.att, ws.ring);
}

// Its backward pass into ws.dqkv: dq of this rank's queries against each source, and each
// source's dk, dv travelling on with its keys and values until they are back with it (staged
// products: the gradients of every position, each source's taken into its buffer as it
// passes).
template <class Exec, class T>
void context_attention_backward(const Exec& exec, const ContextRing& ring, const BlockActs<Exec, T>& s, const Dims& d,
                                const Workspace<Exec>& ws) {
  const std::int64_t g = static_cast<std::int64_t>(ws.ring_dkv[0].size());
  if (s.attention == AttentionProducts::staged) {
    gather_keys_values(exec, ring, s, d, ws, ws.dheads);
    attention_backward(exec, ws.dqkv, ws.datt, ws.datty, s.qkv, s.atty, s.att, ws.dheads, d.NH, s.attention,
                       s.products, d.context);
    Kokkos::deep_copy(exec, ws.ring_dkv[0], 0.0f);
    for (int step = 0; step < ring.size; ++step) {
      const int here = step % 2, next = 1 - here;
      ring_take_key_value_gradients(exec, ws.ring_dkv[here], ws.dheads.dk, ws.dheads.dv, d.context,
                                    (d.context.rank - step + ring.size) % ring.size);
      exec.fence();
      ring.pass(ws.ring_dkv[here].data(), ws.ring_dkv[next].data(), g, kRingGradients);
      ring.wait();
    }
    ring_unpack_key_value_gradients(exec, ws.dqkv, ws.ring_dkv[ring.size % 2]);
    return;
  }
  const MatOf<Exec, T> kv[2] = {ws.template ring_kv_as<T>(0), ws.template ring_kv_as<T>(1)};
  const std::int64_t n = static_cast<std::int64_t>(ws.ring_kv[0].size());
  Kokkos::deep_copy(exec, ws.dqkv, 0.0f);  // the q columns sum over the sources
  ring_pack_keys_values(exec, kv[0], s.qkv);
  Kokkos::deep_copy(exec, ws.ring_dkv[0], 0.0f);
  for (int step = 0; step < ring.size; ++step) {
    const int here = step % 2, next = 1 - here;
    exec.fence();
    if (step + 1 < ring.size) ring.pass(words<Exec, T>(kv[here]), words<Exec, T>(kv[next]), n, kRingKeys);
    ring_attention_backward(exec, ws.dqkv, ws.ring_dkv[here], ws.datty, s.qkv, kv[here], s.atty, s.att, d.NH,
                            d.context, (d.context.rank - step + ring.size) % ring.size);
    exec.fence();
    ring.pass(ws.ring_dkv[here].data(), ws.ring_dkv[next].data(), g, kRingGradients);
    ring.wait();
  }
  // The last pass brought back this rank's own keys' and values' gradients.
  ring_unpack_key_value_gradients(exec, ws.dqkv, ws.ring_dkv[ring.size % 2]);
}

}  // namespace detail

// out = wte[inputs] + wpe (learned positions; rotary ones turn q and k in each block
// instead); out: (R, C) the stream's rows on this rank, inputs: (N). The vocabulary-parallel
// lookups sum over the tensor-parallel group (under sequence parallelism: all N rows looked
// up in the workspace's gathered_grad, reduce-scattered), in fp32; a table no other rank
// shares is looked up in one pass into out as stored (fp32 or bf16).
template <class Exec, class OutV>
void embed_forward(const Exec& exec, const EmbeddingWeights<Exec>& w, const OutV& out, const Tokens<Exec>& inputs,
                   const Dims& d, const Workspace<Exec>& ws, const ShardCombine& tp) {
  Kokkos::Profiling::pushRegion("lamina::embed_forward");
  const bool learned = d.parts.position == PositionKind::learned;
  if (!tp.sum && !tp.scatter_sum) {
    embedding_forward(exec, out, inputs, w.wte, learned ? w.wpe : MatRef<Exec>(), d.context, d.first_row(),
                      d.vocab_begin);
  } else if constexpr (std::is_same<StoredType<OutV>, float>::value) {
    if (tp.scatter_sum) {
      token_embedding_forward(exec, ws.gathered_grad, inputs, w.wte, d.vocab_begin);
      exec.fence();
      tp.scatter_sum(ws.gathered_grad.data(), out.data(), static_cast<std::int64_t>(out.size()));
    } else {
      token_embedding_forward(exec, out, inputs, w.wte, d.vocab_begin);
      detail::combine(exec, tp.sum, out);
    }
    if (learned) position_embedding_forward(exec, out, w.wpe, d.context, d.first_row());
  } else {
    throw std::logic_error("lamina::embed_forward: the vocabulary shards are summed in fp32");
  }
  Kokkos::Profiling::popRegion();
}

// Gradients of the tables from dout = d loss / d(embedding output); runs: the inputs'
// positions grouped by token.
template <class Exec>
void embed_backward(const Exec& exec, const EmbeddingTensors<Exec>& g, const ConstMat<Exec>& dout,
                    const Tokens<Exec>& inputs, const TokenRuns<Exec>& runs, const Dims& d) {
  Kokkos::Profiling::pushRegion("lamina::embed_backward");
  token_embedding_backward(exec, g.wte, dout, inputs, runs, d.vocab_begin);
  if (d.parts.position == PositionKind::learned) position_embedding_backward(exec, g.wpe, dout, d.context);
  Kokkos::Profiling::popRegion();
}

// A norm of the block's kind: out = norm(x), its statistics into mean (LayerNorm) and rstd.
template <class Exec, class OutV, class StatV, class InV>
void block_norm_forward(const Exec& exec, const Dims& d, const OutV& out, const StatV& mean, const StatV& rstd,
                        const InV& x, const ConstVec<Exec>& weight, const ConstVec<Exec>& bias) {
  if (d.parts.norm == NormKind::layernorm) {
    layernorm_forward(exec, out, mean, rstd, x, weight, bias);
  } else {
    rmsnorm_forward(exec, out, rstd, x, weight, static_cast<float>(d.parts.norm_eps));
  }
}

// Its backward: dinp = dskip + the norm's input gradient of dout (fp32, or bf16 as the
// tensor-parallel shards summed it); dweight, dbias +=. scratch: (N, C) the norm's workspace;
// partials: for a device's column sums.
template <class Exec, class DV, class InV, class StatV>
void block_norm_backward(const Exec& exec, const Dims& d, const Mat<Exec>& dinp, const Vec<Exec>& dweight,
                         const Vec<Exec>& dbias, const DV& dout, const ConstMat<Exec>& dskip, const InV& x,
                         const ConstVec<Exec>& weight, const StatV& mean, const StatV& rstd, const Mat<Exec>& scratch,
                         const Vec<Exec>& partials) {
  if (d.parts.norm == NormKind::layernorm) {
    layernorm_backward(exec, dinp, dweight, dbias, dout, dskip, x, weight, mean, rstd, scratch, partials);
  } else {
    rmsnorm_backward(exec, dinp, dweight, dout, dskip, x, weight, rstd, scratch, partials);
  }
}

// A transformer block: x -> s.out, keeping in s what backward needs; x and s stored as T
// (float, or std::uint16_t in bf16 runs). d: the block's shape and parts on this rank.
template <class Exec, class T>
void block_forward(const Exec& exec, const BlockWeights<Exec>& w, const BlockActs<Exec, T>& s,
                   const MatOf<Exec, T>& x, const Dims& d, const Workspace<Exec>& ws, const ShardCombine& tp) {
  Kokkos::Profiling::pushRegion("lamina::block_forward");
  const bool layernorm = d.parts.norm == NormKind::layernorm;
  block_norm_forward(exec, d, s.ln1, s.ln1_mean, s.ln1_rstd, x, w.ln1_w, w.ln1_b);
  const MatOf<Exec, T> ln1 = detail::all_rows(exec, tp, s.ln1, ws.template gathered_as<T>());
  if constexpr (std::is_same<T, float>::value) {
    linear_forward(exec, s.qkv, ln1, w.qkv_w, w.qkv_b, s.products, ws.widened);
  } else {
    linear_forward(exec, s.qkv, ln1, w.qkv_w, w.qkv_b, s.products, ws.widened, detail::product_out<Exec>(s.qkv, ws));
  }
  // q and k rotated as kept: attention's backward reads them so.
  if (d.parts.position == PositionKind::rotary) rotary_apply(exec, s.qkv, d.NH + d.NKV, d.T, 0, ws.rotary, true);
  if (tp.ring.pass) {
    detail::context_attention_forward(exec, tp.ring, s, d, ws);
  } else {
    attention_forward(exec, s.atty, s.att, s.qkv, ws.heads, d.NH, s.attention, s.products);
  }
  // The projections' biases join the residual, the MLP's its activation (no pass of their own).
  detail::row_parallel_forward<Exec, T>(exec, tp, ws.attproj, ws.fcproj.data(), s.atty, w.proj_w, s.products,
                                        ws, [&](const auto& proj) {
                                          if (layernorm) {
                                            residual_layernorm_forward(exec, s.x2, s.ln2, s.ln2_mean, s.ln2_rstd, x,
                                                                       proj, w.proj_b, w.ln2_w, w.ln2_b);
                                          } else {
                                            residual_forward(exec, s.x2, x, proj, w.proj_b);
                                            block_norm_forward(exec, d, s.ln2, s.ln2_mean, s.ln2_rstd, s.x2, w.ln2_w,
                                                               w.ln2_b);
                                          }
                                        });
  // The MLP's first product. bf16 runs: GELU's layer by linear_gelu_forward (one product
  // where cuBLASLt applies bias and GELU as its epilogue); SwiGLU's, where products round, writes
  // the kept [gate | up], which the activation reads. Else the activation reads the fp32
  // product and adds the bias.
  const bool gelu = d.parts.mlp == MlpKind::gelu;
  const MatOf<Exec, T> ln2 = detail::all_rows(exec, tp, s.ln2, ws.template gathered_as<T>());
  const Mat<Exec> fc = detail::product_out<Exec>(s.fch, ws);
  bool done = false;
  if constexpr (!std::is_same<T, float>::value) {
    if (gelu) {
      linear_gelu_forward(exec, s.fch, s.fch_gelu, ln2, w.fc_w, w.fc_b, s.products, ws.widened, fc);
      done = true;
    } else if (w.fc_w.bf16() && rounding_products<Exec>(s.products, false)) {
      linear_forward(exec, s.fch, ln2, w.fc_w, ConstVec<Exec>(), s.products, ws.widened, Mat<Exec>());
      swiglu_forward(exec, s.fch, s.fch_gelu, s.fch);
      done = true;
    }
  }
  if (!done) {
    linear_forward(exec, fc, ln2, w.fc_w, ConstVec<Exec>(), s.products, ws.widened);
    if (gelu) {
      bias_gelu_forward(exec, s.fch, s.fch_gelu, fc, w.fc_b);
    } else {
      swiglu_forward(exec, s.fch, s.fch_gelu, fc);
    }
  }
  detail::row_parallel_forward<Exec, T>(
      exec, tp, ws.fcproj, ws.attproj.data(), s.fch_gelu, w.fcproj_w, s.products, ws,
      [&](const auto& proj) { residual_forward(exec, s.out, s.x2, proj, w.fcproj_b); });
  Kokkos::Profiling::popRegion();
}

// On entry dres holds d loss / d(block output); on exit d loss / d(its input x).
// Parameter gradients accumulate into g.
template <class Exec, class T>
void block_backward(const Exec& exec, const BlockTensors<Exec>& g, const BlockWeights<Exec>& w,
                    const BlockActs<Exec, T>& s, const MatOf<Exec, T>& x, const Mat<Exec>& dres, const Dims& d,
                    const Workspace<Exec>& ws, const ShardCombine& tp) {
  Kokkos::Profiling::pushRegion("lamina::block_backward");
  // Under sequence parallelism the row-parallel products' backward reads all rows of dres, and
  // the column-parallel ones' weight gradients all rows of the norms' outputs: gathered again
  // (Megatron's), so that a block saves only its own rows.
  const MatOf<Exec, T> all = ws.template gathered_as<T>();
  // MLP branch: out = x2 + c_proj(act(c_fc(ln_2(x2))))
  const Mat<Exec> dout = detail::all_rows<Exec, float>(exec, tp, dres, ws.gathered_grad);
  // The column-parallel products' input gradients: fp32 into ws.dln, or bf16 for a bf16 sum.
  const auto into_partials = [&](bool written16, const auto& backward) {
    if (written16) {
      backward(detail::rounded_partials(ws));
    } else {
      backward(ws.dln);
    }
  };
  const bool fc16 = detail::partials_written16<Exec, T>(tp, s.products, w.fc_w);
  if (d.parts.mlp == MlpKind::gelu) {
    linear_backward(exec, ws.dfch, g.fcproj_w, g.fcproj_b, dout, s.fch_gelu, w.fcproj_w, ws.column_partials, s.products,
                    ws.widened);
    into_partials(fc16, [&](const auto& dln) {
      linear_gelu_backward(exec, dln, g.fc_w, g.fc_b, ws.dfch, s.fch, detail::all_rows(exec, tp, s.ln2, all), w.fc_w,
                           ws.column_partials, s.products, ws.widened);
    });
  } else {
    linear_backward(exec, ws.dact, g.fcproj_w, g.fcproj_b, dout, s.fch_gelu, w.fcproj_w, ws.column_partials, s.products,
                    ws.widened);
    into_partials(fc16, [&](const auto& dln) {
      linear_swiglu_backward(exec, dln, g.fc_w, g.fc_b, ws.dfch, ws.dact, s.fch,
                             detail::all_rows(exec, tp, s.ln2, all), w.fc_w, ws.column_partials, s.products,
                             ws.widened);
    });
  }
  detail::combine_gradients<Exec, T>(exec, tp, fc16, ws, [&](const auto& dln, const Mat<Exec>& scratch) {
    block_norm_backward(exec, d, dres, g.ln2_w, g.ln2_b, dln, dres, s.x2, w.ln2_w, s.ln2_mean, s.ln2_rstd, scratch,
                        ws.column_partials);
  });
  // attention branch: x2 = x + c_proj(attn(rotary(c_attn(ln_1(x)))))
  const auto projection_backward = [&](const auto& dinp) {
    linear_backward(exec, dinp, g.proj_w, g.proj_b, detail::all_rows<Exec, float>(exec, tp, dres, ws.gathered_grad),
                    s.atty, w.proj_w, ws.column_partials, s.products, ws.widened);
  };
  const Mat16<Exec> dy16 = tp.ring.pass ? Mat16<Exec>() : detail::attention_gradient16<Exec, T>(s, ws, w.proj_w);
  if (tp.ring.pass) {
    projection_backward(ws.datty);
    detail::context_attention_backward(exec, tp.ring, s, d, ws);
  } else if (dy16.data() != nullptr) {
    projection_backward(dy16);
    if constexpr (!std::is_same<T, float>::value) {
      attention_backward(exec, ws.dqkv, ConstMat16<Exec>(dy16), s.qkv, s.atty, s.att, ws.dheads, d.NH,
                         s.attention, s.products);
    }
  } else {
    projection_backward(ws.datty);
    attention_backward(exec, ws.dqkv, ws.datt, ws.datty, s.qkv, s.atty, s.att, ws.dheads, d.NH, s.attention,
                       s.products);
  }
  if (d.parts.position == PositionKind::rotary) rotary_apply(exec, ws.dqkv, d.NH + d.NKV, d.T, 0, ws.rotary, false);
  // The QKV bias's gradient: dqkv's column sums, taken as the layer's bias gradient into a
  // zeroed workspace, then added but for the k part.
  if (d.parts.bias) Kokkos::deep_copy(exec, ws.qkv_bias_sums, 0.0f);
  const bool qkv16 = detail::partials_written16<Exec, T>(tp, s.products, w.qkv_w);
  into_partials(qkv16, [&](const auto& dln) {
    linear_backward(exec, dln, g.qkv_w, d.parts.bias ? ws.qkv_bias_sums : Vec<Exec>(), ws.dqkv,
                    detail::all_rows(exec, tp, s.ln1, all), w.qkv_w, ws.column_partials, s.products, ws.widened);
  });
  if (d.parts.bias) qkv_bias_backward(exec, g.qkv_b, ws.qkv_bias_sums, d.NH, d.hd);
  detail::combine_gradients<Exec, T>(exec, tp, qkv16, ws, [&](const auto& dln, const Mat<Exec>& scratch) {
    block_norm_backward(exec, d, dres, g.ln1_w, g.ln1_b, dln, dres, x, w.ln1_w, s.ln1_mean, s.ln1_rstd, scratch,
                        ws.column_partials);
  });
  Kokkos::Profiling::popRegion();
}

namespace detail {

// The head's rows in chunks of Dims::logit_rows (one chunk: all of them): f(first row, rows).
template <class F>
void for_each_logit_chunk(const Dims& d, F f) {
  const std::int64_t N = d.N(), chunk = d.logit_rows();
  for (std::int64_t r0 = 0; r0 < N; r0 += chunk) f(r0, std::min(chunk, N - r0));
}

// Rows r0 .. r0 + n of a matrix or vector (rows contiguous).
template <class V>
V row_chunk(const V& v, std::int64_t r0, std::int64_t n) {
  if constexpr (V::rank == 2) {
    return V(v.data() + r0 * static_cast<std::int64_t>(v.stride_0()), n, v.extent(1));
  } else {
    return V(v.data() + r0, n);
  }
}

// Whether a training step's head_forward writes the logits' gradient over the logits as it
// takes their statistics, for head_backward to read there: when the logits are one chunk of
// rows (backward finds them still there) and the vocabulary is not split over ranks (whose
// statistics are combined before any gradient).
inline bool logit_gradient_in_forward(const Dims& d, const ShardCombine& tp) {
  return d.logit_rows() >= d.N() && !tp.max;
}

// Whether the logits' gradient is rounded to bf16 where it is computed, for a bf16 engine's
// products to read as it is (in the first half of each row's memory).
template <class Exec>
bool bf16_logit_gradient(const Dims& d, const MatRef<Exec>& weight) {
  return d.products == ProductMath::bf16 && weight.bf16() && bf16_engine<Exec>();
}

// The LM head's weight: wte, or an untied lm_head.
template <class Exec>
MatRef<Exec> head_weight(const EmbeddingWeights<Exec>& e, const FinalWeights<Exec>& w) {
  return w.lm_head.rows() > 0 ? w.lm_head : e.wte;
}

// `f` of the final norm's output as a run stores it: fp32 (lnf) or bf16 (lnf16).
template <class Exec, class F>
void with_final_norm(const HeadActs<Exec>& h, const F& f) {
  if (h.lnf16.data() != nullptr) {
    f(h.lnf16);
  } else {
    f(h.lnf);
  }
}

}  // namespace detail

// Final norm (the block's kind), LM head (wte, or an untied lm_head) and per-position losses (h.losses) of x, the last
// block's output as stored. The logits of Dims::logit_rows rows at a time, each chunk's loss
// statistics taken (and summed over the vocabulary shards) before the next overwrites them.
// A training step passes its loss_scale (as head_backward's): where
// detail::logit_gradient_in_forward, the pass that takes the statistics also leaves the
// logits' gradient in their place; without one (generation) the logits stay.
template <class Exec, class XV>
void head_forward(const Exec& exec, const EmbeddingWeights<Exec>& e, const FinalWeights<Exec>& w,
                  const HeadActs<Exec>& h, const XV& x, const Tokens<Exec>& targets, const Dims& d,
                  const Workspace<Exec>& ws, const ShardCombine& tp, std::optional<float> loss_scale) {
  Kokkos::Profiling::pushRegion("lamina::head_forward");
  // Under sequence parallelism the norm's rows on this rank (as stored), gathered for the
  // head's product.
  detail::with_final_norm(h, [&](const auto& all) {
    using V = std::decay_t<decltype(all)>;
    const V lnf = tp.gather ? V(reinterpret_cast<typename V::pointer_type>(ws.gathered.data()), d.rows(), d.C) : all;
    block_norm_forward(exec, d, lnf, h.lnf_mean, h.lnf_rstd, x, w.w, w.b);
    detail::all_rows<Exec, typename V::value_type>(exec, tp, lnf, all);
  });
  const MatRef<Exec> weight = detail::head_weight(e, w);
  detail::for_each_logit_chunk(d, [&](std::int64_t r0, std::int64_t n) {
    using detail::row_chunk;
    const Mat<Exec> logits = row_chunk(h.logits, 0, n);
    const Vec<Exec> rowmax = row_chunk(h.rowmax, r0, n), sumexp = row_chunk(h.sumexp, r0, n),
                    target = row_chunk(h.target, r0, n);
    const Tokens<Exec> chunk_targets(targets.data() + r0, n);
    detail::with_final_norm(h, [&](const auto& lnf) {
      tied_head_forward(exec, logits, row_chunk(lnf, r0, n), weight, d.products, ws.widened);
    });
    if (loss_scale && detail::logit_gradient_in_forward(d, tp)) {
      cross_entropy_stats_and_gradient(exec, rowmax, sumexp, target, logits, chunk_targets, d.vocab_begin,
                                       *loss_scale, detail::bf16_logit_gradient(d, weight));
    } else {
      if (tp.max) {
        cross_entropy_row_max(exec, rowmax, logits);
        detail::combine(exec, tp.max, rowmax);
        cross_entropy_row_sumexp(exec, sumexp, logits, rowmax);
      } else {
        cross_entropy_row_stats(exec, rowmax, sumexp, logits);
      }
      cross_entropy_target_logit(exec, target, logits, chunk_targets, d.vocab_begin);
    }
    detail::combine(exec, tp.sum, sumexp);
    detail::combine(exec, tp.sum, target);
  });
  cross_entropy_forward(exec, h.losses, h.lse, h.rowmax, h.sumexp, h.target);
  Kokkos::Profiling::popRegion();
}

// loss_scale: d(objective)/d(loss_i), e.g. 1 / (positions in the global batch), as
// head_forward was given it. Leaves d objective / d(x) in dres. In chunks of rows as
// head_forward, each chunk's logits computed again where there are several (one chunk: the
// forward's are still there, or their gradient where head_forward wrote it).
template <class Exec, class XV>
void head_backward(const Exec& exec, const EmbeddingTensors<Exec>& ge, const FinalNormTensors<Exec>& g,
                   const EmbeddingWeights<Exec>& e, const FinalWeights<Exec>& w, const HeadActs<Exec>& h,
                   const XV& x, const Mat<Exec>& dres, const Tokens<Exec>& targets, const Dims& d,
                   const Workspace<Exec>& ws, float loss_scale, const ShardCombine& tp) {
  Kokkos::Profiling::pushRegion("lamina::head_backward");
  const MatRef<Exec> weight = detail::head_weight(e, w);
  const Mat<Exec> dweight = w.lm_head.rows() > 0 ? g.lm_head : ge.wte;
  const bool again = d.logit_rows() < d.N();
  const bool written = detail::logit_gradient_in_forward(d, tp);
  detail::for_each_logit_chunk(d, [&](std::int64_t r0, std::int64_t n) {
    using detail::row_chunk;
    const Mat<Exec> logits = row_chunk(h.logits, 0, n), dln = row_chunk(ws.dln, r0, n);
    const ConstVec<Exec> lse = row_chunk(h.lse, r0, n);
    const Tokens<Exec> chunk_targets(targets.data() + r0, n);
    detail::with_final_norm(h, [&](const auto& all) {
      const auto lnf = row_chunk(all, r0, n);
      if (again) tied_head_forward(exec, logits, lnf, weight, d.products, ws.widened);
      if (detail::bf16_logit_gradient(d, weight)) {
        // The logits' gradient rounded where it is computed, and read by both products as it is.
        if (!written) cross_entropy_backward_bf16(exec, logits, lse, chunk_targets, d.vocab_begin, loss_scale);
        head_backward_products_bf16(exec, reinterpret_cast<const std::uint16_t*>(logits.data()),
                                    2 * static_cast<std::int64_t>(logits.extent(1)), weight, lnf, dln, dweight,
                                    ws.widened);
      } else {
        if (!written) cross_entropy_backward(exec, logits, logits, lse, chunk_targets, d.vocab_begin, loss_scale);
        tied_head_backward(exec, dln, dweight, logits, lnf, weight, d.products, ws.widened);
      }
    });
  });
  detail::combine_gradients<Exec, float>(exec, tp, false, ws, [&](const auto& dln, const Mat<Exec>& scratch) {
    block_norm_backward(exec, d, dres, g.w, g.b, dln, ConstMat<Exec>(), x, w.w, h.lnf_mean, h.lnf_rstd, scratch,
                        ws.column_partials);
  });
  Kokkos::Profiling::popRegion();
}

// Block l of a range: its forward on the activations as the range stores them, its inner
// part at `inner`, its output into the range (`output` false: nowhere, a recomputation).
template <class Exec>
void range_block_forward(const Exec& exec, const BlockWeights<Exec>& w, const LayerRangeActs<Exec>& a,
                         std::int64_t l, const InnerActs& inner, bool output, const Workspace<Exec>& ws,
                         const ShardCombine& tp) {
  if (a.bf16()) {
    block_forward(exec, w, a.template block<std::uint16_t>(inner.b16, l, output),
                  a.block_input(l).template as<std::uint16_t>(), a.dims(), ws, tp);
  } else {
    block_forward(exec, w, a.template block<float>(inner.f32, l, output), a.block_input(l).template as<float>(),
                  a.dims(), ws, tp);
  }
}

// Its backward: on entry dres holds d loss / d(its output), on exit d loss / d(its input).
template <class Exec>
void range_block_backward(const Exec& exec, const BlockTensors<Exec>& g, const BlockWeights<Exec>& w,
                          const LayerRangeActs<Exec>& a, std::int64_t l, const InnerActs& inner, const Mat<Exec>& dres,
                          const Workspace<Exec>& ws, const ShardCombine& tp) {
  if (a.bf16()) {
    block_backward(exec, g, w, a.template block<std::uint16_t>(inner.b16, l, false),
                   a.block_input(l).template as<std::uint16_t>(), dres, a.dims(), ws, tp);
  } else {
    block_backward(exec, g, w, a.template block<float>(inner.f32, l, false), a.block_input(l).template as<float>(),
                   dres, a.dims(), ws, tp);
  }
}

// The embedding into the range's input as stored; where it is summed over tensor-parallel
// ranks, computed in fp32 and rounded into it in bf16 runs.
template <class Exec>
void range_embed_forward(const Exec& exec, const EmbeddingWeights<Exec>& w, const LayerRangeActs<Exec>& a,
                         const Workspace<Exec>& ws, const ShardCombine& tp) {
  if (!tp.sum && !tp.scatter_sum && a.input.bf16()) {
    embed_forward(exec, w, a.input.b16, a.inputs, a.dims(), ws, tp);
    return;
  }
  const Mat<Exec> out = target(a.input, ws.stage);
  embed_forward(exec, w, out, a.inputs, a.dims(), ws, tp);
  store(exec, a.input, out);
}

// The tables' gradients from the range's residual gradient (all rows of it, gathered under
// sequence parallelism).
template <class Exec>
void range_embed_backward(const Exec& exec, const EmbeddingTensors<Exec>& g, const LayerRangeActs<Exec>& a,
                          const Workspace<Exec>& ws, const ShardCombine& tp) {
  embed_backward(exec, g, detail::all_rows<Exec, float>(exec, tp, a.dres, ws.gathered_grad), a.inputs, a.token_runs(),
                 a.dims());
}

// The head on the range's output as stored.
template <class Exec>
void range_head_forward(const Exec& exec, const EmbeddingWeights<Exec>& e, const FinalWeights<Exec>& w,
                        const LayerRangeActs<Exec>& a, const Workspace<Exec>& ws, const ShardCombine& tp,
                        std::optional<float> loss_scale) {
  if (a.bf16()) {
    head_forward(exec, e, w, a.head, a.output().b16, a.targets, a.dims(), ws, tp, loss_scale);
  } else {
    head_forward(exec, e, w, a.head, a.output().f32, a.targets, a.dims(), ws, tp, loss_scale);
  }
}

template <class Exec>
void range_head_backward(const Exec& exec, const EmbeddingTensors<Exec>& ge, const FinalNormTensors<Exec>& g,
                         const EmbeddingWeights<Exec>& e, const FinalWeights<Exec>& w,
                         const LayerRangeActs<Exec>& a, const Mat<Exec>& dres, const Workspace<Exec>& ws,
                         float loss_scale, const ShardCombine& tp) {
  if (a.bf16()) {
    head_backward(exec, ge, g, e, w, a.head, a.output().b16, dres, a.targets, a.dims(), ws, loss_scale, tp);
  } else {
    head_backward(exec, ge, g, e, w, a.head, a.output().f32, dres, a.targets, a.dims(), ws, loss_scale, tp);
  }
}

template <class Exec>
struct SumLosses {
  Vec<Exec> losses;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, double& s) const { s += losses(i); }
};

// Sum of the per-position losses of the last forward pass, accumulated in double into
// `into` (device memory: the host reads it when it needs it, nothing waits here).
template <class Exec>
void sum_losses(const Exec& exec, const HeadActs<Exec>& h,
                const Kokkos::View<double, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>& into) {
  const Vec<Exec> losses = h.losses;
  Kokkos::parallel_reduce("lamina::sum_losses", Range<Exec>(exec, 0, static_cast<std::int64_t>(losses.extent(0))),
                          SumLosses<Exec>{losses}, into);
}

}  // namespace lamina
