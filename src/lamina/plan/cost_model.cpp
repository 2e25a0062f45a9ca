#include "lamina/plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <set>

#include "lamina/model/gpt_activations.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/parallel/grad_reducer.hpp"
#include "lamina/parallel/shard.hpp"

namespace lamina {

namespace {

constexpr double kAdamWBytes = 28.0;  // per parameter: read p, g, m, v; write p, m, v (fp32)
constexpr double kStateBytes = 12.0;  // fp32 master, m, v: what a device subgroup moves each way

}  // namespace

CostModel::CostModel(const ModelConfig& model, const Plan& plan, const MachineSpec& machine,
                     const std::vector<MeasuredCosts>& measured)
    : CostModel(model, plan, machine, measured, ParamLayout::of(model, plan.layout.tp, 0)) {}

CostModel::CostModel(const ModelConfig& model, const Plan& plan, const MachineSpec& machine,
                     const std::vector<MeasuredCosts>& measured, const ParamLayout& layout)
    : model_(model), plan_(plan), machine_(machine), bf16_(plan.precision == Precision::bf16) {
  const ParallelLayout& o = plan.layout;
  const auto& layers = layout.layers();
  for (std::size_t i = 0; i < layers.size(); ++i) {
    const LayerSpec& l = layers[i];
    numel_.push_back(static_cast<double>(l.numel));
    if (i > 1 && i + 1 < layers.size()) {  // the blocks are alike: block 0's sums
      replica_sums_.push_back(replica_sums_[1]);
      norm_sums_.push_back(norm_sums_[1]);
      continue;
    }
    replica_sums_.push_back(static_cast<double>(replica_sum_elements(l)));
    double norms = 0.0;
    for (const TensorSpec& t : l.tensors) norms += t.norm ? static_cast<double>(t.numel()) : 0.0;
    norm_sums_.push_back(norms);
  }
  // The attention a build for the machine runs (a device's staged unless the deck says fused).
  const Dims d =
      Dims::on_machine(model, o.micro_batch_size, o.tp, machine.device_is_host, o.sequence_parallel, o.cp);
  inner_ = static_cast<double>(activation_sizes(d).inner);

  // Roofline of one micro-batch (Narayanan et al. 2021 count the same GEMMs: 24 N C^2 in
  // a GPT-2 block's forward, 4 N T C in its attention, 2 N C V in the LM head; backward
  // twice). A block's products read its weights once each per token: 2 N x those weights.
  const double N = static_cast<double>(d.N()), C = static_cast<double>(d.C), T = static_cast<double>(d.T);
  // The keys each query meets: its whole sequence, also where context parallelism holds a
  // cp-th of the queries (T) on a rank.
  const double keys = static_cast<double>(d.context.T);
  // The residual stream's rows on this rank: its norms and residual adds run on 1/tp of them
  // under sequence parallelism.
  const double R = static_cast<double>(d.rows());
  const double tp = o.tp, V = static_cast<double>(d.V), heads = static_cast<double>(d.NH);
  const double weights = static_cast<double>(C * (d.qkv_width() + d.A() + d.fc_width()) + d.F * d.C);
  // Fused attention keeps the (T, T) scores out of memory, and its backward pass computes
  // them again: one product more on a host BLAS (2.5 times the forward's products, as
  // FlashAttention-2), three in the device kernels, which recompute the scores and their
  // gradient for dk, dv and again for dq instead of accumulating dq atomically. Those
  // device kernels are lamina's own and compute in fp32 without tensor cores; BLAS products
  // run at the precision's rate. Context parallelism's ring runs them on every machine.
  const bool fused = d.attention == AttentionProducts::fused;
  const bool own_kernels = fused && (!d.host_attention || d.context_parallel());
  const double gemm = machine.peak_flops(bf16_) * machine.gemm_efficiency;
  const double attention = machine.peak_flops(bf16_ && !own_kernels) * machine.attention_efficiency;
  const double bandwidth = machine.memory_bandwidth * machine.elementwise_efficiency;
  const double attention_backward = !fused ? 2.0 : own_kernels ? 3.5 : 2.5;
  // Element-wise passes of a block's forward, in bytes moved: what is stored (the residual
  // stream and the saved activations) in its storage type, `s` bytes (bf16 runs: 2, read and
  // written as they are), products' outputs and softmax rows in fp32. The first layer norm
  // (read x, write y), two residual adds (read the stream and a projection's output, write the
  // stream), the first of them with the second layer norm in the same pass (which writes y
  // from the row still in cache), the q/k/v scatter and attention gather, the softmax over the
  // (T, T) scores unless fused (read and write them in fp32, write the saved probabilities;
  // staged products on a bf16 engine write them in bf16, which the softmax turns into the
  // saved probabilities in place: three passes of s bytes),
  // the MLP's bias and GELU (read the product, write the pre-activation and the activation:
  // in place in fp32).
  // A Llama block's parts: RMSNorm moves what LayerNorm does, but the second norm runs
  // after the residual add, a pass of its own (read the stream, write y); rotary positions
  // read and write q and k in place; SwiGLU reads the [gate | up] product (2F, fp32) and
  // writes it as stored for backward and the activation (F). The q/k/v scatter moves the
  // key/value heads there are.
  const double s = bf16_ ? 2.0 : 4.0;
  // The score matrices are (T, keys) per sequence and head: staged products under context
  // parallelism compute a rank's queries against every position's keys, placed in staged
  // copies as they arrive around the ring (2 s bytes each way per source).
  const double A = static_cast<double>(d.A()), F = static_cast<double>(d.F),
               score_count = static_cast<double>(d.B) * heads * T * keys;
  const double KV = static_cast<double>(d.NKV * d.hd);
  const bool keys_gathered = d.context_parallel() && d.attention == AttentionProducts::staged;
  const double kv_copies = keys_gathered ? o.cp : 1.0;
  // A bf16 engine writes a product's output in bf16 with its bias as its epilogue
  // (kernels/gemm.hpp, rounding_products: a host's oneDNN, a device's cuBLASLt). The activation
  // then reads the kept pre-activation (SwiGLU: [gate | up]) as stored, but for a device's GELU,
  // which the first MLP product's epilogue applies too (gelu_epilogue; rows a multiple of 8
  // long): it writes the pre-activation beside its output, and no pass of GELU's own runs.
  const bool engine = bf16_ && machine.bf16_products();
  // Attention on a host's engine takes the softmax by row blocks whose products stop at the
  // block's last row: the rows read and write their fp32 scores only up to the diagonal (half
  // the (T, T) scores under the mask) and round the probabilities only as far (in place into
  // the saved ones; fused into the block's copy, a conversion below, and in memory, not in a
  // device kernel's registers).
  const bool host_rows = engine && !own_kernels && d.host_attention && d.attention != AttentionProducts::staged;
  const bool staged_engine = engine && d.attention == AttentionProducts::staged;
  const double half_scores = score_count / 2;
  const double scores = host_rows       ? (8 + (fused ? 0.0 : s)) * half_scores
                        : fused         ? 0.0
                        : staged_engine ? 3 * s * score_count
                                        : (8 + s) * score_count;
  const bool layernorm = d.parts.norm == NormKind::layernorm, swiglu = d.parts.mlp == MlpKind::swiglu;
  // Tensor parallelism with bf16 sums (parallel.tp_sums): the residual adds read the
  // row-parallel products' sums (the branch) as summed, in bf16.
  const bool sum16 = o.tp > 1 && tp_sum_bytes() < 4.0;
  const double branch = sum16 ? 2.0 : 4.0;
  const double norms = layernorm ? 2 * s * R * C + (3 * s + branch) * R * C
                                 : 2 * s * R * C + (2 * s + branch) * R * C + 2 * s * R * C;
  const double rotary = d.parts.position == PositionKind::rotary ? 2 * s * N * (A + KV) : 0.0;
  const bool gelu_epilogue = engine && !machine.device_is_host && !swiglu && d.F % 8 == 0;
  const double mlp = gelu_epilogue ? s * N * F
                     : engine      ? (swiglu ? 3 * s * N * F : 2 * s * N * F)
                                   : (swiglu ? (8 + 3 * s) * N * F : (4 + 2 * s) * N * F);
  const double ew_forward =
      norms + (2 * s + branch) * R * C + 2 * s * N * (A + 2 * KV * kv_copies) + rotary + scores + mlp;
  // And of its backward, whose gradients are fp32: each norm's kernel reads the output's
  // gradient, the skip's and the input, writes the input's gradient and the gain's per-row
  // terms, which a column sum reads (with LayerNorm's bias gradient, the output's); the biases'
  // gradients are column sums of the products' output gradients; GELU reads its gradient and
  // pre-activation and writes in place (a bf16 engine's rounding pass does it: below), SwiGLU reads the activation's gradient and [gate | up]
  // and writes theirs; rotary positions turn dq and dk back in place; attention copies q, k, v
  // again, reads its probabilities and the product's dP (written fp32), writes the score
  // gradients (fp32; staged products on an engine write dP in bf16, and the score gradients
  // replace it in place: s bytes each way) and merges dq, dk, dv into one
  // gradient (staged under context parallelism: every position's keys and values placed again,
  // and each source's gradients taken from every position's into its travelling buffer, 12
  // bytes). A host's engine reads them up to the diagonal (fused: computes the probabilities
  // again in place in fp32) and writes no fp32 score gradients.
  // A device's norm backward writes per-row terms for column sums, which read them and (a
  // layer norm's bias) the output's gradient again. On a host rank of one thread (a machine
  // file's `cores` per device at most 1, or not given) it adds the gain's and bias's terms
  // into their sums row by row (kernels/norm_backward.hpp): nothing read twice; on several, a
  // second pass reads the output's gradient and the input again for the sums.
  const bool one_thread = machine.device_is_host && machine.cores_per_device <= 1;
  // With bf16 sums the norms read their output's gradient as summed, in bf16.
  const double dnorm = sum16 ? 2.0 : 4.0;
  const double norm_backward = one_thread               ? 8 + dnorm + s
                               : machine.device_is_host ? 8 + 2 * (dnorm + s)
                               : layernorm              ? 16 + 2 * dnorm + s
                                                        : 16 + dnorm + s;
  const double norms_backward = 2 * norm_backward * R * C;
  // (On a bf16 engine the pass that rounds each product's output gradient sums its bias
  // gradient too: no pass of their own.)
  const double biases = d.parts.bias && !engine ? 4 * N * (2 * C + F + A + 2 * KV) : 0.0;
  // On a bf16 engine the pass that rounds the MLP's output gradient for its first layer's
  // products applies GELU's derivative as it reads (kernels/linear.hpp, linear_gelu_backward):
  // GELU moves no bytes of its own.
  const bool gelu_rides = engine;
  // With a bf16 engine (and no bias) SwiGLU's backward writes [dgate | dup] in bf16 as the
  // products read it (linear_swiglu_backward): 2 bytes each, and no pass rounds it.
  const bool swiglu_bf16 = swiglu && engine && !d.parts.bias;
  const double mlp_backward = swiglu       ? (swiglu_bf16 ? 8 + 2 * s : 12 + 2 * s) * N * F
                              : gelu_rides ? 0.0
                                           : (8 + s) * N * F;
  const double scores_backward = host_rows       ? (fused ? 12.0 : 4 + s) * half_scores
                                 : fused         ? 0.0
                                 : staged_engine ? 4 * s * score_count
                                                 : (12 + s) * score_count;
  const double rotary_backward = rotary > 0 ? 8 * N * (A + KV) : 0.0;
  const double qkv_backward =
      (2 * s + 8) * N * A + (keys_gathered ? (2 * s + 12) * o.cp * N * 2 * KV + 8 * N * 2 * KV : (2 * s + 8) * N * 2 * KV);
  const double ew_backward = norms_backward + biases + mlp_backward + rotary_backward + qkv_backward + scores_backward;
  // Tensor parallelism: two all-reduces of the (N, C) residual stream per pass (Megatron), in
  // fp32, or in bf16 (parallel.tp_sums): the products write their partial results (forward)
  // and partial input gradients (backward) in bf16 where they round (a bf16 engine: neither
  // has a bias), else a pass rounds them (read 4, write 2 bytes). Under sequence parallelism each all-reduce
  // is an all-gather and a reduce-scatter (half the bytes each): forward, the norms' outputs
  // gathered as stored and the row-parallel results reduce-scattered at the sums' precision;
  // backward, the residual gradient gathered in fp32, the norms' input gradients
  // reduce-scattered at the sums' precision, and the norms' outputs gathered once more for
  // the weight gradients.
  const double ring = (tp - 1) / tp * N * C;  // bytes per element of a gather or reduce-scatter
  const double all_reduce = collective(2.0 * ring * tp_sum_bytes(), 2 * (o.tp - 1), o.tp);
  const double gathered = collective(ring * s, o.tp - 1, o.tp), fp32_half = collective(ring * 4, o.tp - 1, o.tp);
  const double scattered = collective(ring * tp_sum_bytes(), o.tp - 1, o.tp);
  const bool sp = d.sequence_parallel();
  const double tp_comm = o.tp == 1 ? 0.0 : sp ? 2.0 * (gathered + scattered) : 2.0 * all_reduce;
  const double tp_comm_backward = o.tp == 1 ? 0.0 : sp ? 2.0 * (fp32_half + scattered + gathered) : 2.0 * all_reduce;
  const double sums_rounded = sum16 && !engine ? 2 * 6 * N * C : 0.0;  // per pass
  // What bf16 runs still convert, 6 bytes per element (the fp32 side and the bf16 one). A
  // bf16 engine reads stored activations and weights as they are; it rounds the fp32
  // operands: each product's output gradient dY in backward (once for both of its products),
  // and at the head the logits' gradient (the final norm writes its output in bf16). The QKV
  // projection's output is written in bf16 with its bias by an engine's product, else rounded
  // into storage with its bias in a pass of its own. Attention on a host's oneDNN reads q, k, v as
  // stored, writes its output rounded as its products sum it, reads dy in bf16 as the output
  // projection's backward writes it (context parallelism's ring: a pass rounds it), rounds a row block's
  // score gradients (and, fused, its recomputed probabilities) in bf16 beside fp32 (2 bytes
  // each, half of the (T, T) scores under the mask); a device's fused kernels read and write
  // the storage as they are; staged products on an engine read q, k, v and the saved
  // probabilities as stored and round the output and dy (their products write the scores, dP
  // and the score gradients in bf16: no conversion); elsewhere it runs on fp32 copies of q, k, v, its output and what
  // it saves, widened and rounded each pass. Without an engine, the
  // host BLAS widens the weights (each matrix once per forward and once for the input
  // gradients) and the activations the products read.
  double convert_forward = 0.0, convert_backward = 0.0, convert_head = 0.0, convert_head_backward = 0.0;
  if (bf16_) {
    const double saved = static_cast<double>(d.B) * heads * T * static_cast<double>(d.saved_attention_columns());
    const double copies = own_kernels ? 0.0 : 6 * (4 * N * A + saved);
    const double attention_forward = host_rows       ? (fused ? 2 * half_scores : 0.0)
                                     : staged_engine ? 6 * N * A
                                                     : copies;
    const double ring_dy = d.context_parallel() ? 6 * N * A : 0.0;
    const double attention_backward = host_rows       ? ring_dy + (fused ? 4 : 2) * half_scores
                                      : staged_engine ? 6 * N * A
                                                      : copies;
    const double read_activations = 6 * N * (2 * C + A + F);  // ln1, atty, ln2, gelu widened
    const double qkv_rounded = engine ? 0.0 : 6 * N * (A + 2 * KV);
    convert_forward = qkv_rounded + attention_forward + (engine ? 0.0 : 6 * weights + read_activations) + sums_rounded;
    // Each product's output gradient rounded: the two projections' (dres), the MLP's first
    // (GELU's, or SwiGLU's [dgate | dup] unless written in bf16) and the QKV projection's.
    const double fc_dy = swiglu ? (swiglu_bf16 ? 0.0 : 2 * F) : F;
    convert_backward = attention_backward +
                       (engine ? 6 * N * (2 * C + fc_dy + A + 2 * KV) : 6 * weights + read_activations) + sums_rounded;
    // Without an engine the head's weight and the final norm's bf16 output are widened for
    // its products in each pass; an engine reads both as they are, and the logits' gradient
    // is rounded where it is computed.
    convert_head = engine ? 0.0 : 6 * (V * C + N * C);
    convert_head_backward = engine ? 0.0 : 6 * (V * C + N * C);
  }
  const double attention_forward_s = 4 * N * keys * A / attention;
  const double attention_backward_s = attention_backward * attention_forward_s;
  // Context parallelism's ring: forward, cp - 1 passes of the rank's keys and values (N x 2 KV,
  // as stored), each beside the attention on the block at hand (a cp-th of the rank's); backward,
  // the keys and values again beside the compute, and after it each source's fp32 gradients
  // (cp passes, not overlapped). What the attention does not hide is exposed. Staged products
  // wait for every position's keys: the passes are exposed whole.
  double ring_forward = 0.0, ring_backward = 0.0;
  if (d.context_parallel()) {
    const double cp = o.cp, extent = o.cp * o.tp;
    const double pass = collective(N * 2 * KV * s, 1, o.cp * o.tp), gradients = collective(N * 2 * KV * 4, 1, extent);
    const double hidden_forward = keys_gathered ? 0.0 : attention_forward_s / cp;
    const double hidden_backward = keys_gathered ? 0.0 : attention_backward_s / cp;
    ring_forward = (cp - 1) * std::max(0.0, pass - hidden_forward);
    ring_backward = (cp - 1) * std::max(0.0, pass - hidden_backward) + cp * gradients;
  }
  forward_parts_ = {2 * N * weights / gemm, attention_forward_s, ew_forward / bandwidth, convert_forward / bandwidth,
                    tp_comm, ring_forward};
  backward_parts_ = {2 * 2 * N * weights / gemm, attention_backward_s, ew_backward / bandwidth,
                     convert_backward / bandwidth, tp_comm_backward, ring_backward};
  auto sum = [](const Parts& p) { return p.gemm + p.attention + p.elementwise + p.conversions + p.tp + p.cp; };
  block_forward_ = sum(forward_parts_);
  block_backward_ = sum(backward_parts_);
  // The embedding's and the head's sums over the vocabulary shards: all-reduces, or under
  // sequence parallelism a reduce-scatter (the embedding's forward, the head's backward) and
  // an all-gather (the stream's gradient into the embedding's backward, in fp32; the final
  // norm's output into the head's product, as stored).
  const double embed_tp = o.tp == 1 ? 0.0 : sp ? fp32_half : collective(2.0 * ring * 4.0, 2 * (o.tp - 1), o.tp);
  const double head_gather = o.tp > 1 && sp ? gathered : embed_tp;
  // Forward, a table no other rank shares is looked up in one pass into the stream as stored
  // (the token's row and the position's read, the sum written); the vocabulary shards' lookups
  // are summed in fp32 (written, then the positions added: read and written again), and a
  // bf16 stream rounded from them.
  const double lookup = d.parts.position == PositionKind::learned ? 3 * s : 2 * s;
  embed_forward_ = (o.tp == 1 ? lookup : 3 * 4 + (bf16_ ? 6 : 0)) * N * C / bandwidth + embed_tp;
  embed_backward_ = 3 * 4 * N * C / bandwidth + (sp ? fp32_half : 0.0);
  const double logits = 4.0 * N * V;  // bytes of this rank's logits
  // Their gradient: fp32 over them, or (a bf16 engine) rounded to bf16 as it is written.
  const double gradient = bf16_ && machine.bf16_products() ? logits / 2 : logits;
  // Forward the product writes the logits and their statistics read them: once where the
  // vocabulary is not split over ranks, twice where it is (the group's maximum between). In
  // one chunk of rows an unsplit vocabulary's pass also writes the gradient, which backward's
  // products read; otherwise backward reads the logits and writes the gradient first.
  const bool split = o.tp > 1, chunked = d.logit_rows() < d.N(), in_forward = !split && !chunked;
  head_forward_ = 2 * N * C * V / gemm +
                  ((split ? 3 : 2) * logits + (in_forward ? gradient : 0.0) + 4 * 4 * N * C + convert_head) / bandwidth +
                  head_gather;
  head_backward_ = 4 * N * C * V / gemm +
                   ((in_forward ? 0.0 : logits + gradient) + gradient + 4 * 4 * N * C + convert_head_backward) /
                       bandwidth +
                   embed_tp;
  // In chunks of rows (model.loss_chunk), backward computes the logits again, chunk by chunk.
  if (chunked) head_backward_ += 2 * N * C * V / gemm + logits / bandwidth;
  for (const MeasuredCosts& m : measured) {
    if (m.micro_batch_size != o.micro_batch_size || m.tp != o.tp || m.sequence_parallel != sp || m.cp != o.cp) continue;
    forward_parts_ = backward_parts_ = Parts{};
    block_forward_ = m.block_forward;
    block_backward_ = m.block_backward;
    embed_forward_ = m.embed_forward;
    embed_backward_ = m.embed_backward;
    head_forward_ = m.head_forward;
    head_backward_ = m.head_backward;
  }
}

void CostModel::set_rank_optimizers(const RankOptimizers& optimizers) {
  subgroups_.clear();
  host_elements_.clear();
  for (const auto& [l, spec] : optimizers.layers) {
    std::int64_t host = 0;
    for (std::size_t g = 0; g < spec.subgroups.size(); ++g) {
      const std::int64_t n = spec.subgroups[g].end - spec.subgroups[g].begin;
      subgroups_[l].push_back(n);
      const bool on_host = spec.placement == OptimizerPlacement::host ||
                           (spec.placement == OptimizerPlacement::dynamic && spec.sites[g] == UpdateSite::host);
      if (on_host) host += n;
    }
    host_elements_[l] = host;
  }
}

double CostModel::collective(double bytes_per_rank, int steps, int extent) const {
  const bool inside = extent <= machine_.devices_per_node;
  const double bw = inside ? machine_.intra_bandwidth : machine_.inter_bandwidth;
  const double latency = inside ? machine_.intra_latency : machine_.inter_latency;
  return (bw > 0 ? bytes_per_rank / bw : 0.0) + steps * latency;
}

double CostModel::layer_numel(int layer) const { return numel_[static_cast<std::size_t>(layer)]; }

double CostModel::stream_rows() const {
  return static_cast<double>(plan_.layout.micro_batch_size) * static_cast<double>(model_.seq_len) / plan_.layout.cp;
}

double CostModel::gather(int layer) const {
  const ParallelLayout& o = plan_.layout;
  const LayerShard s = LayerShard::of(static_cast<std::int64_t>(layer_numel(layer)), o.replicas(), bf16_);
  const double padded = static_cast<double>(s.padded), shard = static_cast<double>(s.shard);
  const bool host = plan_.layer(layer).params == MemTier::host;
  double t = 0.0;
  if (o.zero == 3) {
    if (host) t += shard * param_bytes() / machine_.h2d;
    const double dp = o.replicas();
    t += collective((dp - 1) / dp * padded * param_bytes(), o.replicas() - 1, o.replicas() * o.tp);
  } else if (host) {
    t += padded * param_bytes() / machine_.h2d;
  }
  return t;
}

double CostModel::host_link(bool to_host) const {
  const double link = to_host ? machine_.d2h : machine_.h2d;
  // Every device of the node copies through the host's memory at once.
  const double share = machine_.host_bandwidth / std::max(1, machine_.devices_per_node);
  return machine_.host_bandwidth > 0 ? std::min(link, share) : link;
}

double CostModel::activation_copy(bool to_host) const {
  const double bytes = inner_ * (bf16_ ? 2.0 : 4.0);
  return bytes / host_link(to_host);
}

double CostModel::checkpoint_copy(bool to_host) const {
  const double bytes = (bf16_ ? 2.0 : 4.0) * stream_rows() * static_cast<double>(model_.d_model);
  return bytes / host_link(to_host);
}

double CostModel::replica_sum_bytes(int layer) const {
  const double tp = plan_.layout.tp;
  return 2.0 * (tp - 1) / tp * 4.0 * replica_sums_[static_cast<std::size_t>(layer)];
}

double CostModel::norm_sum_bytes(int layer) const {
  const double tp = plan_.layout.tp;
  return 2.0 * (tp - 1) / tp * 4.0 * norm_sums_[static_cast<std::size_t>(layer)];
}

double CostModel::reduce(int layer) const {
  const ParallelLayout& o = plan_.layout;
  // Replicated K/V heads' copies are added over the tensor-parallel group first, and under
  // sequence parallelism the norms' gradients of each rank's rows.
  double replicas = replica_sums_[static_cast<std::size_t>(layer)] > 0
                        ? collective(replica_sum_bytes(layer), 2 * (o.tp - 1), o.tp)
                        : 0.0;
  if (o.sequence_parallel && o.tp > 1 && norm_sums_[static_cast<std::size_t>(layer)] > 0) {
    replicas += collective(norm_sum_bytes(layer), 2 * (o.tp - 1), o.tp);
  }
  // Over the data group: the dp x cp ranks of a replica.
  const int group = o.replicas();
  if (group == 1) return replicas;
  const double dp = group;
  const double bytes =
      4.0 * static_cast<double>(LayerShard::of(static_cast<std::int64_t>(layer_numel(layer)), group, bf16_).padded);
  // ZeRO-0 all-reduces; ZeRO-1+ reduce-scatters (half the volume).
  return replicas + (o.zero == 0 ? collective(2 * (dp - 1) / dp * bytes, 2 * (group - 1), group * o.tp)
                                 : collective((dp - 1) / dp * bytes, group - 1, group * o.tp));
}

double CostModel::flush(int layer) const {
  const auto it = host_elements_.find(layer);
  const double n = it != host_elements_.end()
                       ? static_cast<double>(it->second)
                       : static_cast<double>(LayerShard::of(static_cast<std::int64_t>(layer_numel(layer)),
                                                            plan_.layout.replicas(), bf16_)
                                                 .owned_size(plan_.layout.zero));
  return 4.0 * n / machine_.d2h;
}

double CostModel::update(std::int64_t n, UpdateSite site, bool host_resident, bool rounds) const {
  const double p = static_cast<double>(n);
  if (site == UpdateSite::host) {
    const double rate = machine_.host_adamw_rate / std::max(1, machine_.devices_per_node);
    return rate > 0 ? p / rate : 0.0;
  }
  const double bytes = kAdamWBytes + (rounds ? 2.0 : 0.0);  // a measured rate is fp32 AdamW's
  double t = machine_.device_adamw_rate > 0 ? p / machine_.device_adamw_rate * bytes / kAdamWBytes
                                            : p * bytes / (machine_.memory_bandwidth * machine_.adamw_efficiency);
  if (host_resident) t += kStateBytes * p / machine_.h2d + kStateBytes * p / machine_.d2h;
  return t;
}

double CostModel::publish(int layer) const {
  const ParallelLayout& o = plan_.layout;
  const LayerShard s = LayerShard::of(static_cast<std::int64_t>(layer_numel(layer)), o.replicas(), bf16_);
  const double owned = static_cast<double>(s.owned_size(o.zero));
  const LayerPolicy& p = plan_.layer(layer);
  if (p.params == MemTier::host) return 0.0;  // the host parameters are the master weights (or rounded there)
  const auto it = host_elements_.find(layer);
  const double host = it != host_elements_.end() ? static_cast<double>(it->second) : owned;
  return host * param_bytes() / machine_.h2d;
}

double CostModel::share(int layer) const {
  const ParallelLayout& o = plan_.layout;
  if (o.replicas() == 1) return 0.0;
  const double dp = o.replicas();
  const LayerShard s = LayerShard::of(static_cast<std::int64_t>(layer_numel(layer)), o.replicas(), bf16_);
  return collective((dp - 1) / dp * static_cast<double>(s.padded) * param_bytes(), o.replicas() - 1,
                    o.replicas() * o.tp);
}

double CostModel::p2p(bool activation) const {
  // Each tensor-parallel rank sends its 1/tp share of the residual stream (activations as
  // stored, bf16 in bf16 runs; their gradients in fp32); the receivers all-gather the shares
  // over their group.
  const ParallelLayout& o = plan_.layout;
  const double bytes = (activation ? param_bytes() : 4.0) * stream_rows() * static_cast<double>(model_.d_model);
  const double tp = o.tp;
  const double gather = o.tp > 1 ? collective((tp - 1) / tp * bytes, o.tp - 1, o.tp) : 0.0;
  return collective(bytes / tp, 1, o.replicas() * o.tp * 2) + gather;
}

double CostModel::sync() const {
  const ParallelLayout& o = plan_.layout;
  if (o.pp == 1 || !model_.tie_embeddings) return 0.0;
  const LayerShard s = LayerShard::of(static_cast<std::int64_t>(layer_numel(0)), o.replicas(), bf16_);
  return collective(4.0 * static_cast<double>(s.owned_size(o.zero)), 2, o.replicas() * o.tp * o.pp);
}

double CostModel::price(const Instruction& i) const {
  const int final_layer = static_cast<int>(numel_.size()) - 1;
  const bool block = i.layer > 0 && i.layer < final_layer;
  switch (i.op) {
    case Op::forward: return block ? block_forward_ : i.layer == 0 ? embed_forward_ : head_forward_;
    case Op::backward: return block ? block_backward_ : i.layer == 0 ? embed_backward_ : head_backward_;
    case Op::recompute: return block_forward_;
    case Op::send_activation: return p2p(true);
    case Op::send_gradient: return p2p(false);
    case Op::recv_activation:
    case Op::recv_gradient: return 0.0;
    case Op::gather_params:
    case Op::prefetch_params: return gather(i.layer);
    case Op::release_params: return 0.0;
    case Op::offload_activations: return activation_copy(true);
    case Op::prefetch_activations:
    case Op::reload_activations: return activation_copy(false);
    case Op::offload_checkpoint: return checkpoint_copy(true);
    case Op::prefetch_checkpoint: return checkpoint_copy(false);
    case Op::reduce_grads: return reduce(i.layer);
    case Op::sync_grads: return sync();
    case Op::flush_grads: return flush(i.layer);
    case Op::optimizer_update: {
      const auto it = subgroups_.find(i.layer);
      const std::int64_t n = it != subgroups_.end() && i.subgroup < static_cast<int>(it->second.size())
                                 ? it->second[static_cast<std::size_t>(i.subgroup)]
                                 : 0;
      const LayerPolicy& p = plan_.layer(i.layer);
      return update(n, i.site, p.optimizer != OptimizerPlacement::device,
                    bf16_ && i.site == UpdateSite::device && p.params == MemTier::device);
    }
    case Op::publish_params: return publish(i.layer);
    case Op::share_params: return share(i.layer);
  }
  return 0.0;
}

std::map<std::string, double> CostModel::traffic(const std::vector<Instruction>& step,
                                                 const std::vector<Instruction>& update) const {
  const ParallelLayout& o = plan_.layout;
  const double dp = o.replicas(), tp = o.tp;
  const double NC = stream_rows() * static_cast<double>(model_.d_model);
  const double tp_allreduce = o.tp > 1 ? 2.0 * (tp - 1) / tp * 4.0 * NC : 0.0;
  // Sequence parallelism: a gather or reduce-scatter of the stream moves half an all-reduce's
  // bytes; a block gathers its norms' outputs as stored (twice forward, twice more backward),
  // reduce-scatters its partial results at the sums' precision (twice each way) and gathers
  // the residual gradient in fp32; pipeline messages are each rank's rows as they are.
  const bool sp = o.sequence_parallel && o.tp > 1;
  const double half = tp_allreduce / 2, stored_half = half * param_bytes() / 4.0;
  const double summed_half = half * tp_sum_bytes() / 4.0;
  const int final_layer = static_cast<int>(numel_.size()) - 1;
  std::map<std::string, double> bytes{{"dp", 0.0}, {"tp", 0.0}, {"pp", 0.0}};
  // Context parallelism: per block pass, the ring's cp - 1 passes of the keys and values (as
  // stored) and, backward, cp of their fp32 gradients.
  const double cp = o.cp;
  const double kv_heads = static_cast<double>(std::max<std::int64_t>(1, model_.key_value_heads() / o.tp));
  const double kv = 2.0 * kv_heads * static_cast<double>(model_.d_model / model_.heads) * stream_rows();
  if (o.cp > 1) bytes["cp"] = 0.0;
  std::set<int> prefetched;
  auto shard = [&](int layer) {
    return LayerShard::of(static_cast<std::int64_t>(layer_numel(layer)), o.replicas(), bf16_);
  };
  for (const Instruction& i : step) {
    const bool block = i.layer > 0 && i.layer < final_layer;
    switch (i.op) {
      case Op::forward:
      case Op::recompute:
        bytes["tp"] += !sp ? (block ? 2.0 * tp_sum_bytes() / 4.0 * tp_allreduce : tp_allreduce)
                           : (block ? 2 * (stored_half + summed_half) : half);
        if (block && o.cp > 1) bytes["cp"] += (cp - 1) * kv * param_bytes();
        break;
      case Op::backward:
        bytes["tp"] += !sp ? (block ? 2.0 * tp_sum_bytes() / 4.0 * tp_allreduce : tp_allreduce)
                           : (block ? 2 * (half + summed_half + stored_half) : half);
        if (block && o.cp > 1) bytes["cp"] += (cp - 1) * kv * param_bytes() + cp * kv * 4.0;
        break;
      case Op::send_activation: bytes["pp"] += param_bytes() * NC / tp; break;
      case Op::send_gradient: bytes["pp"] += 4.0 * NC / tp; break;
      case Op::recv_activation:
        if (!sp) bytes["tp"] += (tp - 1) / tp * param_bytes() * NC;
        break;
      case Op::recv_gradient:
        if (!sp) bytes["tp"] += (tp - 1) / tp * 4.0 * NC;
        break;
      case Op::prefetch_params:
        prefetched.insert(i.layer);
        if (o.zero == 3) bytes["dp"] += (dp - 1) / dp * static_cast<double>(shard(i.layer).padded) * param_bytes();
        break;
      case Op::gather_params:
        if (prefetched.erase(i.layer)) break;  // takes the prefetch over
        if (o.zero == 3) bytes["dp"] += (dp - 1) / dp * static_cast<double>(shard(i.layer).padded) * param_bytes();
        break;
      case Op::reduce_grads:
        bytes["tp"] += replica_sum_bytes(i.layer) + (sp ? norm_sum_bytes(i.layer) : 0.0);
        bytes["dp"] += (o.zero == 0 ? 2.0 : 1.0) * (dp - 1) / dp * 4.0 * static_cast<double>(shard(i.layer).padded);
        break;
      case Op::sync_grads:
        if (o.pp > 1 && model_.tie_embeddings) bytes["pp"] += 4.0 * static_cast<double>(shard(0).owned_size(o.zero));
        break;
      default: break;
    }
  }
  for (const Instruction& i : update) {
    if (i.op == Op::share_params) {
      bytes["dp"] += (dp - 1) / dp * static_cast<double>(shard(i.layer).padded) * param_bytes();
    }
  }
  return bytes;
}

Pricer CostModel::pricer() const {
  return [this](const Instruction& i, int) { return price(i); };
}

}  // namespace lamina
