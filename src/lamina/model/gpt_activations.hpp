#pragma once
// What a GPT-2 forward pass keeps for backward, and the scratch space one layer at a
// time uses. The saved activations of a range of layers for one micro-batch are one flat
// buffer (LayerRangeActs), so that a pipeline keeps one per micro-batch in flight and a
// layer's activations can be dropped, recomputed or moved as a unit. Sizes come from
// activation_sizes() and LayerRangeActs::bytes(), which the memory estimate shares, so
// predicted and allocated bytes cannot drift apart. All shapes are this rank's
// tensor-parallel shard. In bf16 runs the residual stream and the saved activations are
// stored as bf16 (Megatron's mixed precision): the kernels read and write them as they are,
// with fp32 arithmetic, and products write fp32 into the workspace (their epilogues round
// what is kept). Gradients are fp32.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "lamina/core/buffer.hpp"
#include "lamina/core/config.hpp"
#include "lamina/core/error.hpp"
#include "lamina/kernels/attention.hpp"
#include "lamina/kernels/common.hpp"
#include "lamina/kernels/embedding.hpp"
#include "lamina/kernels/ring_attention.hpp"
#include "lamina/kernels/rotary.hpp"
#include "lamina/model/activation_policy.hpp"

namespace lamina {

struct Dims {
  std::int64_t B = 0, T = 0, C = 0;  // micro-batch sequences, positions, model width
  std::int64_t NH = 0, hd = 0;       // attention heads on this rank, head width
  std::int64_t NKV = 0;              // key/value heads on this rank (grouped-query attention: < NH)
  std::int64_t F = 0;                // MLP hidden width on this rank (ffn_hidden / tp; GPT-2: 4C / tp)
  std::int64_t V = 0;                // vocabulary rows on this rank (V / tp)
  std::int64_t vocab_begin = 0;      // first token id of this rank's vocabulary rows
  std::int64_t loss_chunk = 0;       // rows of the head's logits at a time (ModelConfig::loss_chunk; 0: all)
  // how attention runs (it decides what a block saves): what the build's default
  // execution space runs fastest
  AttentionProducts attention = kAttentionProducts<Kokkos::DefaultExecutionSpace>;
  // whether the execution space that runs the block has a host BLAS for attention (in_place
  // possible; fused keeps the probabilities it recomputes in the workspace) or runs it as a
  // device does: of() sets it for the space it is asked for
  bool host_attention = kAttentionInPlace<Kokkos::DefaultExecutionSpace>;
  // how the BLAS products (projections, head, staged attention) read their operands (the
  // run's precision decides: product_math)
  ProductMath products = ProductMath::fp32;
  // parameters, the residual stream and saved activations stored as bf16 (bf16 runs)
  bool bf16 = false;
  BlockParts parts;  // the block's parts (core/config.hpp): GPT-2's by default
  // Sequence parallelism (parallel.sequence_parallel): the residual stream's rows split into
  // seq_shards contiguous shares over the tensor-parallel group, this rank's the seq_shard-th.
  std::int64_t seq_shards = 1, seq_shard = 0;
  // Context parallelism (parallel.cp): the model's sequences over the context-parallel group
  // (kernels/context_chunks.hpp); T is then this rank's rows of a sequence, context.rows().
  ContextChunks context;
  bool context_parallel() const { return context.cp > 1; }
  std::int64_t N() const { return B * T; }  // a micro-batch's rows: what products and attention take
  // Rows of the residual stream, its norms and their statistics on this rank, and its first.
  std::int64_t rows() const { return N() / seq_shards; }
  std::int64_t first_row() const { return seq_shard * rows(); }
  bool sequence_parallel() const { return seq_shards > 1; }
  // The rotary table's floats in the workspace (rotary positions only).
  std::int64_t rotary_floats() const { return parts.position == PositionKind::rotary ? T * hd : 0; }
  // The QKV projection's output [q | k | v] (kernels/qkv_layout.hpp), the MLP's first
  // product's ([gate | up] for SwiGLU), and what its backward pass takes (SwiGLU: the
  // activation's gradient beside them).
  std::int64_t qkv_width() const { return (NH + 2 * NKV) * hd; }
  std::int64_t fc_width() const { return parts.mlp == MlpKind::swiglu ? 2 * F : F; }
  std::int64_t fc_grad_width() const { return parts.mlp == MlpKind::swiglu ? 3 * F : F; }
  // Saved statistics per norm and row: LayerNorm's mean and rstd, RMSNorm's rstd.
  std::int64_t norm_stats() const { return parts.norm == NormKind::layernorm ? 2 : 1; }
  // A block's norm gains and biases (the part of its parameters past its matrices).
  std::int64_t block_vectors() const {
    return 2 * norm_stats() * C + (parts.bias ? qkv_width() + C + F + C : 0);
  }
  // Columns per score row of what a block saves for attention's backward pass; of that
  // pass's score gradients, and of the probabilities fused products recompute, one layer at
  // a time, on a host BLAS (a device's fused products keep both in team scratch).
  // (Context parallelism: a rank's T queries meet the keys of every position, keys(); its
  // fused ring runs a device's fused kernels on any space, which keep no score gradients.)
  std::int64_t saved_attention_columns() const { return lamina::saved_attention_columns(attention, keys()); }
  // (Attention on a host's oneDNN in bf16 keeps a block's score gradients in its own scratch.)
  std::int64_t score_gradient_columns() const {
    const bool onednn = bf16 && products == ProductMath::bf16 && host_attention &&
                        attention != AttentionProducts::staged;
    const bool kept = attention == AttentionProducts::staged ||
                      (!context_parallel() && !onednn && (attention != AttentionProducts::fused || host_attention));
    return kept ? keys() : 0;
  }
  std::int64_t recomputed_probability_columns() const {
    return !context_parallel() && attention == AttentionProducts::fused && host_attention ? T : 0;
  }
  std::int64_t A() const { return NH * hd; }  // attention width on this rank (C / tp)
  std::int64_t keys() const { return context.T; }  // the keys a query meets: its sequence's positions
  // Rows of the head's logits at a time (a loss_chunk, or all N).
  std::int64_t logit_rows() const { return loss_chunk > 0 ? std::min(N(), loss_chunk) : N(); }
  // The dims of a run on Exec (a run's: the build's default space): refuses what it cannot run.
  template <class Exec = Kokkos::DefaultExecutionSpace>
  static Dims of(const ModelConfig& m, std::int64_t micro_batch, int tp_size = 1, int tp_rank = 0,
                 bool sequence_parallel = false, int cp_size = 1, int cp_rank = 0) {
    Dims d = shape(m, micro_batch, tp_size, tp_rank, sequence_parallel, cp_size, cp_rank);
    d.host_attention = kAttentionInPlace<Exec>;
    d.attention = m.attention.value_or(d.context_parallel() ? AttentionProducts::fused : kAttentionProducts<Exec>);
    if (d.attention == AttentionProducts::in_place && !d.host_attention) {
      throw InputError(std::string("model.attention = \"in_place\" needs host execution and OpenBLAS; this build "
                                   "runs on ") +
                       Exec::name() + ": choose \"fused\" or \"staged\"");
    }
    return d;
  }
  // The dims of a run on a machine that need not be this build's (planning): a host as this
  // build's host space runs it, a device as a device build does (no host BLAS for attention).
  static Dims on_machine(const ModelConfig& m, std::int64_t micro_batch, int tp_size, bool host,
                         bool sequence_parallel = false, int cp_size = 1) {
    if (host) return of<Kokkos::DefaultHostExecutionSpace>(m, micro_batch, tp_size, 0, sequence_parallel, cp_size);
    Dims d = shape(m, micro_batch, tp_size, 0, sequence_parallel, cp_size);
    d.host_attention = false;
    d.attention = m.attention.value_or(d.context_parallel() ? AttentionProducts::fused : kDeviceAttentionProducts);
    if (d.attention == AttentionProducts::in_place) {
      throw InputError("model.attention = \"in_place\" needs host execution and OpenBLAS; the machine planned "
                       "for runs on a device: choose \"fused\" or \"staged\"");
    }
    return d;
  }
  // The dims alone.
  static Dims shape(const ModelConfig& m, std::int64_t micro_batch, int tp_size = 1, int tp_rank = 0,
                    bool sequence_parallel = false, int cp_size = 1, int cp_rank = 0) {
    Dims d;
    d.B = micro_batch;
    d.context = {m.seq_len, cp_size, cp_rank};
    d.T = d.context.rows();
    d.C = m.d_model;
    d.NH = m.heads / tp_size;
    d.hd = m.d_model / m.heads;
    // Megatron's split where tp exceeds the key/value heads: each rank holds one, replicated.
    const std::int64_t kv = m.key_value_heads();
    d.NKV = std::max<std::int64_t>(1, kv / tp_size);
    d.F = m.mlp_hidden() / tp_size;
    d.parts = m.parts;
    d.V = m.vocab_size / tp_size;
    d.vocab_begin = tp_rank * d.V;
    d.loss_chunk = m.loss_chunk;
    d.attention = m.attention.value_or(d.attention);
    if (d.context_parallel()) {
      if (m.attention == AttentionProducts::in_place) {
        throw InputError("context parallelism (parallel.cp) runs attention as ring attention on the fused kernels or "
                         "on staged products; model.attention = \"in_place\" reads keys and values in the rank's own "
                         "rows, and the ring brings the other ranks' in buffers: set it to \"fused\" or \"staged\" "
                         "(the same products on copies), or leave it out");
      }
      if (m.seq_len % (2 * cp_size) != 0) {
        throw InputError("context parallelism cuts each sequence into 2 cp = " + std::to_string(2 * cp_size) +
                         " chunks, which model.seq_len = " + std::to_string(m.seq_len) + " does not split into");
      }
      d.attention = m.attention.value_or(AttentionProducts::fused);
    }
    if (sequence_parallel) {
      d.seq_shards = tp_size;
      d.seq_shard = tp_rank;
    }
    return d;
  }
};

// Elements (floats unless noted) of the buffers of a micro-batch of B sequences.
struct ActivationSizes {
  std::int64_t embed = 0;      // embedding output
  std::int64_t block = 0;      // saved by one transformer block (its output and its inner activations)
  std::int64_t inner = 0;      // the part of `block` that recomputation drops and offloading moves
  std::int64_t head = 0;       // final norm, logits, loss statistics
  std::int64_t boundary = 0;   // a layer range's received input, or its output gradient
  std::int64_t tokens = 0;     // int32 inputs + targets, and the inputs' positions by token (order, run starts)
  std::int64_t workspace = 0;  // scratch shared by all layers (forward and backward overlap), all of it
  std::int64_t column_partials = 0;  // a device's column sums' partial sums (kernels/gemm.hpp)
  std::int64_t sequence = 0;  // sequence parallelism: its gathered rows (Workspace::gathered_grad, gathered)
  std::int64_t context = 0;   // context parallelism: the ring's buffers (Workspace::ring_kv, ring, ring_dkv)
  // of the workspace, in bf16 runs: attention's fp32 copies where it cannot read bf16 as it is
  // (attention_copies), a layer's norm gains and biases widened (param_vectors), and the
  // products' conversions
  std::int64_t attention_copies = 0, param_vectors = 0, product_scratch = 0;
  // of the shared workspace, in bf16 runs: the fp32 output of a product whose epilogue
  // rounds it into storage (the QKV projection, the MLP's first, the embedding's sum)
  std::int64_t product_out = 0;
  // of the workspace, with rotary positions: the rotary table, at its end
  std::int64_t rotary = 0;
};
ActivationSizes activation_sizes(const Dims& d);

// T: how they are stored, float, or std::uint16_t (bf16 runs).
template <class Exec, class T = float>
struct BlockActs {
  // R: the rows of the stream on this rank (Dims::rows(): N, or N / tp under sequence parallelism)
  MatOf<Exec, T> ln1;                 // (R, C)
  VecOf<Exec, T> ln1_mean, ln1_rstd;  // (R); RMSNorm: no mean (empty)
  MatOf<Exec, T> qkv;                 // (N, qkv_width) output of the QKV projection: [q | k | v], rotated (rotary)
  MatsOf<Exec, T> att;                // (B*NH, T, T) softmax probabilities; fused: (B*NH, T, 2) log-sum-exps
  AttentionProducts attention = kAttentionProducts<Exec>;  // how attention ran
  ProductMath products = ProductMath::fp32;                 // how its BLAS products ran
  MatOf<Exec, T> atty;                // (N, A) attention output before projection
  MatOf<Exec, T> x2;                  // (R, C) residual after attention
  MatOf<Exec, T> ln2;                 // (R, C)
  VecOf<Exec, T> ln2_mean, ln2_rstd;  // (R); RMSNorm: no mean (empty)
  MatOf<Exec, T> fch;                 // (N, fc_width) the MLP's first product (SwiGLU: [gate | up])
  MatOf<Exec, T> fch_gelu;            // (N, F) its activation
  MatOf<Exec, T> out;                 // (R, C) block output: residual after the MLP
};

template <class Exec>
struct HeadActs {
  // (N, C) the final norm's output, all rows (gathered under sequence parallelism): fp32 runs
  // lnf, bf16 runs lnf16 (the other empty)
  Mat<Exec> lnf;
  Mat16<Exec> lnf16;
  Vec<Exec> lnf_mean, lnf_rstd;     // (R) the stream's rows on this rank
  // (logit_rows, V): a chunk of rows at a time; then their gradient, for backward's products
  Mat<Exec> logits;
  Vec<Exec> rowmax, sumexp, target; // (N) loss statistics, combined over tensor-parallel ranks
  Vec<Exec> losses, lse;            // (N)
};

template <class Exec>
struct Workspace {
  // bf16 runs (empty otherwise)
  Vec<Exec> stage;       // a product's fp32 output before its epilogue rounds it (product_out)
  Vec<Exec> vectors;     // a layer's norm gains and biases, widened
  Vec<Exec> widened;     // products' conversions of bf16 weights or operands (gemm.hpp, attention.hpp)
  // forward
  AttentionWorkspace<Exec> heads;  // q, y (B*NH, T, hd), k, v (B*NKV, T, hd) for staged attention products; probs
  Mat<Exec> attproj, fcproj;   // (N, C)
  // backward (same memory as forward)
  Mat<Exec> dln;               // (N, C) gradient of a norm's output
  Mat<Exec> dfch;              // (N, fc_width) gradient of the MLP's first product (GELU: of its
                               // activation, made the product's in place, see linear_gelu_backward)
  Mat<Exec> dact;              // (N, F) SwiGLU: its activation's
  Mat<Exec> dqkv;              // (N, qkv_width)
  AttentionWorkspace<Exec> dheads; // q, k, v (in dqkv's memory), dy (as y), dq, dk, dv; probs
  Mats<Exec> datt;             // (B*NH, T, T); fused on a device: (B*NH, T, 0)
  Mat<Exec> datty;            // (N, A)
  Mat<Exec> scratch;          // (N, C)
  Vec<Exec> qkv_bias_sums;    // (qkv_width) with biases
  Vec<Exec> column_partials;  // column_partials(N, widest column sum)
  RotaryTable<Exec> rotary;   // rotary positions: cos and sin of every position
  // sequence parallelism (empty otherwise), memory of their own: the residual gradient
  // gathered (N, C), or a reduce-scatter's (rows, C) share of a partial result; and a norm's
  // output gathered for the products that read all rows, (N, C) values as stored (fp32, or
  // bf16 pairs: gathered_as<T>)
  Mat<Exec> gathered_grad;
  Vec<Exec> gathered;
  template <class T>
  MatOf<Exec, T> gathered_as() const {
    return as_mat_of<Exec>(reinterpret_cast<T*>(gathered.data()), gathered_grad.extent(0), gathered_grad.extent(1));
  }
  // context parallelism (empty otherwise), memory of their own: the keys and values in flight
  // around the ring, two buffers of (N, 2 NKV hd) values as stored (ring_kv_as<T>); forward,
  // the running results of the rank's queries; backward, in their memory, the travelling key and
  // value gradients, two buffers of (N, 2 NKV hd)
  Mat<Exec> ring_kv[2];  // the values' words: (N, 2 NKV hd) floats, or (N, NKV hd) bf16 pairs
  RingAttentionState<Exec> ring;
  Mat<Exec> ring_dkv[2];
  template <class T>
  MatOf<Exec, T> ring_kv_as(int i) const {
    return as_mat_of<Exec>(reinterpret_cast<T*>(ring_kv[i].data()), ring_dkv[i].extent(0), ring_dkv[i].extent(1));
  }
};

// The scratch space of one rank, allocated once.
template <class Exec>
class WorkspaceBuffers {
 public:
  using Mem = typename Exec::memory_space;
  WorkspaceBuffers(MemoryTracker& tracker, const Dims& d) {
    const ActivationSizes s = activation_sizes(d);
    const std::int64_t N = d.N(), C = d.C, A = d.A(), W = d.qkv_width(), K = W - A, F = d.F, BNH = d.B * d.NH,
                       BKV = d.B * d.NKV, T = d.T, hd = d.hd;
    buf_ = Buffer<float, Mem>(tracker, MemCategory::workspace, "lamina::workspace", s.workspace);
    float* p = buf_.data();
    ws.heads.q = as_mats<Exec>(p, BNH, T, hd);
    ws.heads.k = as_mats<Exec>(p += N * A, BKV, T, hd);
    ws.heads.v = as_mats<Exec>(p += N * K / 2, BKV, T, hd);
    ws.heads.y = as_mats<Exec>(p += N * K / 2, BNH, T, hd);
    ws.attproj = as_mat<Exec>(p += N * A, N, C);
    ws.fcproj = as_mat<Exec>(p += N * C, N, C);
    p = buf_.data();
    ws.dln = as_mat<Exec>(p, N, C);
    ws.dfch = as_mat<Exec>(p += N * C, N, d.fc_width());
    if (d.parts.mlp == MlpKind::swiglu) ws.dact = as_mat<Exec>(p + N * d.fc_width(), N, F);
    ws.dqkv = as_mat<Exec>(p += N * d.fc_grad_width(), N, W);
    ws.dheads.q = as_mats<Exec>(p, BNH, T, hd);
    ws.dheads.k = as_mats<Exec>(p += N * A, BKV, T, hd);
    ws.dheads.v = as_mats<Exec>(p += N * K / 2, BKV, T, hd);
    ws.dheads.dq = as_mats<Exec>(p += N * K / 2, BNH, T, hd);
    ws.dheads.dk = as_mats<Exec>(p += N * A, BKV, T, hd);
    ws.dheads.dv = as_mats<Exec>(p += N * K / 2, BKV, T, hd);
    ws.dheads.y = as_mats<Exec>(p += N * K / 2, BNH, T, hd);
    ws.datt = as_mats<Exec>(p += N * A, BNH, T, d.score_gradient_columns());
    // The forward pass uses them too, while nothing else in the workspace is live.
    ws.dheads.probs = ws.heads.probs =
        as_mats<Exec>(p += BNH * T * d.score_gradient_columns(), BNH, T, d.recomputed_probability_columns());
    ws.datty = as_mat<Exec>(p += BNH * T * d.recomputed_probability_columns(), N, A);
    ws.scratch = as_mat<Exec>(p += N * A, N, C);
    if (d.parts.bias) ws.qkv_bias_sums = as_vec<Exec>(p += N * C, W);
    // A product's output lives until its epilogue, while nothing else in the workspace does.
    ws.stage = as_vec<Exec>(buf_.data(), s.product_out);
    // The bf16 conversions after the shared part, which they outlive within a layer, and
    // the rotary table last, which lives as long as the run.
    p = buf_.data() + s.workspace - s.rotary - s.attention_copies - s.param_vectors - s.product_scratch;
    if (s.attention_copies > 0) {
      const ProductMath math = product_math<Exec>(Precision::bf16);
      place_attention_copies(ws.heads, p, d.attention, math, d.B, T, d.NH, hd, d.NKV, d.keys());
      place_attention_copies(ws.dheads, p, d.attention, math, d.B, T, d.NH, hd, d.NKV, d.keys());
    }
    ws.vectors = as_vec<Exec>(p += s.attention_copies, s.param_vectors);
    ws.widened = as_vec<Exec>(p += s.param_vectors, s.product_scratch);
    ws.heads.narrowed = ws.dheads.narrowed = ws.widened;  // between products, never during one
    if (s.rotary > 0) {
      ws.rotary = RotaryTable<Exec>(p + s.product_scratch, T,
                                    rotary_inverse_frequencies(hd, d.parts.rope_theta, d.parts.rope_scaling),
                                    d.context);
    }
    partials_ = Buffer<float, Mem>(tracker, MemCategory::workspace, "lamina::column_partials", s.column_partials);
    ws.column_partials = partials_.view();
    if (s.sequence > 0) {
      sequence_ = Buffer<float, Mem>(tracker, MemCategory::workspace, "lamina::sequence_gathers", s.sequence);
      ws.gathered_grad = as_mat<Exec>(sequence_.data(), N, C);
      ws.gathered = as_vec<Exec>(sequence_.data() + N * C, s.sequence - N * C);
    }
    if (s.context > 0) {
      context_ = Buffer<float, Mem>(tracker, MemCategory::workspace, "lamina::context_ring", s.context);
      const std::int64_t words = d.bf16 ? K / 2 : K;
      p = context_.data();
      for (Mat<Exec>& kv : ws.ring_kv) {
        kv = as_mat<Exec>(p, N, words);
        p += N * words;
      }
      if (d.attention == AttentionProducts::staged) {
        // Staged products: the keys and values of every position, and their gradients.
        const std::int64_t every = BKV * d.keys() * hd;
        ws.heads.k = ws.dheads.k = as_mats<Exec>(p, BKV, d.keys(), hd);
        ws.heads.v = ws.dheads.v = as_mats<Exec>(p + every, BKV, d.keys(), hd);
        ws.dheads.dk = as_mats<Exec>(p + 2 * every, BKV, d.keys(), hd);
        ws.dheads.dv = as_mats<Exec>(p + 3 * every, BKV, d.keys(), hd);
        p += 4 * every;
      } else {
        ws.ring = {as_mat<Exec>(p, N, A), as_mats<Exec>(p + N * A, BNH, T, 1)};
      }
      ws.ring_dkv[0] = as_mat<Exec>(p, N, K);
      ws.ring_dkv[1] = as_mat<Exec>(p + N * K, N, K);
    }
  }
  Workspace<Exec> ws;

 private:
  Buffer<float, Mem> buf_, partials_, sequence_, context_;
};

// A block's inner activations laid out in `inner` (activation_sizes().inner values of T),
// with its output in `out`.
template <class Exec, class T>
BlockActs<Exec, T> bind_block_acts(T* inner, const MatOf<Exec, T>& out, const Dims& d) {
  const std::int64_t N = d.N(), R = d.rows(), C = d.C, A = d.A(), W = d.qkv_width(), F = d.F, F1 = d.fc_width(),
                     BNH = d.B * d.NH;
  const std::int64_t means = d.parts.norm == NormKind::layernorm ? R : 0;
  T* p = inner;
  auto take = [&p](std::int64_t n) {
    T* q = p;
    p += n;
    return q;
  };
  BlockActs<Exec, T> a;
  a.ln1 = as_mat_of<Exec>(take(R * C), R, C);
  a.ln1_mean = as_vec_of<Exec>(take(means), means);
  a.ln1_rstd = as_vec_of<Exec>(take(R), R);
  a.qkv = as_mat_of<Exec>(take(N * W), N, W);
  a.att = as_mats_of<Exec>(take(BNH * d.T * d.saved_attention_columns()), BNH, d.T, d.saved_attention_columns());
  a.attention = d.attention;
  a.products = d.products;
  a.atty = as_mat_of<Exec>(take(N * A), N, A);
  a.x2 = as_mat_of<Exec>(take(R * C), R, C);
  a.ln2 = as_mat_of<Exec>(take(R * C), R, C);
  a.ln2_mean = as_vec_of<Exec>(take(means), means);
  a.ln2_rstd = as_vec_of<Exec>(take(R), R);
  a.fch = as_mat_of<Exec>(take(N * F1), N, F1);
  a.fch_gelu = as_mat_of<Exec>(take(N * F), N, F);
  a.out = out;
  return a;
}

// One boundary of the residual stream (a range's input, a block's output): (R, C) values,
// fp32, or bf16 in bf16 runs.
template <class Exec>
struct Residual {
  Mat<Exec> f32;
  Mat16<Exec> b16;
  bool bf16() const { return b16.data() != nullptr; }
  // The storage as a view of its type T (float or std::uint16_t).
  template <class T>
  MatOf<Exec, T> as() const {
    if constexpr (std::is_same<T, float>::value) {
      return f32;
    } else {
      return b16;
    }
  }
  // The storage as a message of float words (bf16 pairs; boundaries have an even length).
  float* words() const { return bf16() ? reinterpret_cast<float*>(b16.data()) : f32.data(); }
  std::int64_t word_count() const {
    return bf16() ? (static_cast<std::int64_t>(b16.size()) + 1) / 2 : static_cast<std::int64_t>(f32.size());
  }
};

// Where a boundary is computed in fp32 (the embedding's output, summed over tensor-parallel
// ranks in fp32): its storage, or (bf16) `into`, then rounded into it by store().
template <class Exec>
Mat<Exec> target(const Residual<Exec>& r, const Vec<Exec>& into) {
  return r.bf16() ? as_mat<Exec>(into.data(), static_cast<std::int64_t>(r.b16.extent(0)),
                                 static_cast<std::int64_t>(r.b16.extent(1)))
                  : r.f32;
}

template <class Exec>
void store(const Exec& exec, const Residual<Exec>& r, const Mat<Exec>& computed) {
  if (!r.bf16()) return;
  const std::int64_t n = static_cast<std::int64_t>(computed.size());
  to_bf16(exec, Bf16Vec<Exec>(r.b16.data(), static_cast<std::size_t>(n)), as_vec<Exec>(computed.data(), n));
}

// Where a block's inner activations are (activation_sizes().inner values), in the range's
// storage type: f32, or b16 in bf16 runs.
struct InnerActs {
  float* f32 = nullptr;
  std::uint16_t* b16 = nullptr;
  template <class T>
  T* as() const {
    if constexpr (std::is_same<T, float>::value) {
      return f32;
    } else {
      return b16;
    }
  }
};

// Everything one micro-batch leaves behind in blocks [first, last) of the model, plus the
// embedding and/or the head when the range includes them. Each block's output (the next
// block's input: the checkpoint recomputation restarts from) is always kept; its inner
// activations follow the block's policy: kept here, dropped (recomputed from the input
// before backward, in a scratch the executor owns), or offloaded to a host-tier buffer
// kept here and copied back through staging the executor owns. Under bf16 mixed precision
// the residual stream (the range's input and every block's output) and kept and offloaded
// inner activations are stored as bf16, which a block's kernels read and write as they are.
// The head's activations (final norm, logits, loss statistics) and the residual stream's
// gradient stay fp32.
//
// A range of one block whose policy is offload_checkpoint is pooled: it owns no device
// memory for its input, its output or its residual gradient. The executor binds frames
// from a device pool to them while they are live (bind_input, bind_output, bind_dres), and
// the input (the checkpoint) waits in a host-tier buffer (checkpoint()) between the
// block's forward and its backward.
template <class Exec>
class LayerRangeActs {
 public:
  using Mem = typename Exec::memory_space;
  using TokenView = Kokkos::View<std::int32_t*, Kokkos::LayoutRight, Mem>;
  using HostView = Kokkos::View<float*, Kokkos::LayoutRight, HostTierSpace>;
  using HostView16 = Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, HostTierSpace>;

  // Elements of one residual boundary as stored: bf16 ones padded to an even count, so
  // that every boundary starts on a float word (messages send them as float words).
  static std::int64_t boundary_elements(const ActivationSizes& s, bool bf16) {
    return bf16 ? (s.boundary + 1) / 2 * 2 : s.boundary;
  }
  // Float words of one boundary as stored (bf16 pairs in bf16 runs): a frame of the
  // residual stream, and of a checkpoint in the host tier. Residual gradients take s.boundary.
  static std::int64_t stream_words(const ActivationSizes& s, bool bf16) {
    return bf16 ? boundary_elements(s, true) / 2 : s.boundary;
  }
  static bool pooled(const std::vector<ActivationPolicy>& policy) {
    return policy.size() == 1 && policy.front() == ActivationPolicy::offload_checkpoint;
  }
  // Device-tier bytes of a pooled range (the head's activations, the token ids); its host
  // tier holds one checkpoint (stream_words).
  static std::int64_t pooled_bytes(const ActivationSizes& s, bool head) { return 4 * ((head ? s.head : 0) + s.tokens); }
  // Device-tier bytes of a range: fp32 (4-byte) and bf16 (2-byte) storage, the token ids.
  // kept: blocks whose inner activations are kept; own_dres: its own residual-gradient
  // buffer. Offloaded blocks' host buffers come on top.
  static std::int64_t bytes(const ActivationSizes& s, std::int64_t blocks, std::int64_t kept, bool head,
                            bool own_dres, bool bf16) {
    const std::int64_t stream = (blocks + 1) * boundary_elements(s, bf16) + kept * s.inner;
    const std::int64_t fp32 = (head ? s.head : 0) + (own_dres ? s.boundary : 0) + s.tokens;
    return (bf16 ? 2 : 4) * stream + 4 * fp32;
  }

  // policy: one entry per block of the range. shared_dres: (R, C) floats this range uses
  // for its residual gradient instead of its own, where micro-batches of the range never
  // run their backward passes interleaved (depth-first schedules): one per range, not one
  // per micro-batch in flight.
  LayerRangeActs(MemoryTracker& tracker, const Dims& d, std::int64_t first, std::int64_t last, bool embedding,
                 bool head, const std::vector<ActivationPolicy>& policy, bool bf16 = false,
                 float* shared_dres = nullptr)
      : dims_(d), first_(first), policy_(policy), bf16_(bf16), pooled_(pooled(policy)) {
    const ActivationSizes s = activation_sizes(d);
    const std::int64_t N = d.N(), R = d.rows(), C = d.C;
    const std::int64_t kept = std::count(policy.begin(), policy.end(), ActivationPolicy::keep);
    const std::int64_t boundary = boundary_elements(s, bf16), blocks = last - first;
    const std::string range = std::to_string(first) + "-" + std::to_string(last);
    const std::int64_t stream = pooled_ ? 0 : (blocks + 1) * boundary + kept * s.inner;
    const std::int64_t fp32 = (head ? s.head : 0) + (shared_dres == nullptr && !pooled_ ? s.boundary : 0);
    if (pooled_) {
      checkpoint_ = Buffer<float, HostTierSpace>(tracker, MemCategory::activations, "lamina::checkpoint_h" + range,
                                                 stream_words(s, bf16), MemTier::host);
    }
    if (bf16) {
      buf16_ = Buffer<std::uint16_t, Mem>(tracker, MemCategory::activations, "lamina::acts_bf16_h" + range, stream);
    }
    buf_ = Buffer<float, Mem>(tracker, MemCategory::activations, "lamina::acts_h" + range, (bf16 ? 0 : stream) + fp32);
    float* p = buf_.data();
    std::uint16_t* p16 = buf16_.data();
    auto take = [&p](std::int64_t n) {
      float* q = p;
      p += n;
      return q;
    };
    auto residual = [&] {
      Residual<Exec> r;
      if (bf16) {
        using Rows16 = Kokkos::View<std::uint16_t**, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
        r.b16 = Mat16<Exec>(Rows16(p16, R, C));
        p16 += boundary;
      } else {
        r.f32 = as_mat<Exec>(take(R * C), R, C);
      }
      return r;
    };
    if (!pooled_) input = residual();  // embedding output, or the input received
    has_embedding = embedding;
    for (std::int64_t l = first; l < last; ++l) out_.push_back(pooled_ ? Residual<Exec>() : residual());
    for (std::int64_t l = first; l < last; ++l) {
      const ActivationPolicy pol = policy[static_cast<std::size_t>(l - first)];
      const bool keep = pol == ActivationPolicy::keep;
      inner_.push_back(keep && !bf16 ? take(s.inner) : nullptr);
      inner16_.push_back(keep && bf16 ? p16 : nullptr);
      if (keep && bf16) p16 += s.inner;
      host_.emplace_back();
      host16_.emplace_back();
      if (pol == ActivationPolicy::offload) {
        const std::string label = "lamina::offloaded_h" + std::to_string(l);
        if (bf16) {
          host16_.back() = Buffer<std::uint16_t, HostTierSpace>(tracker, MemCategory::activations, label, s.inner,
                                                                    MemTier::host);
        } else {
          host_.back() = Buffer<float, HostTierSpace>(tracker, MemCategory::activations, label, s.inner,
                                                          MemTier::host);
        }
      }
    }
    has_head = head;
    if (head) {
      if (d.bf16) {  // as activation_sizes counts it
        this->head.lnf16 = Mat16<Exec>(reinterpret_cast<std::uint16_t*>(take((N * C + 1) / 2)), N, C);
      } else {
        this->head.lnf = as_mat<Exec>(take(N * C), N, C);
      }
      this->head.lnf_mean = as_vec<Exec>(take(R), R);
      this->head.lnf_rstd = as_vec<Exec>(take(R), R);
      this->head.logits = as_mat<Exec>(take(d.logit_rows() * d.V), d.logit_rows(), d.V);
      this->head.rowmax = as_vec<Exec>(take(N), N);
      this->head.sumexp = as_vec<Exec>(take(N), N);
      this->head.target = as_vec<Exec>(take(N), N);
      this->head.losses = as_vec<Exec>(take(N), N);
      this->head.lse = as_vec<Exec>(take(N), N);
    }
    if (!pooled_) dres = as_mat<Exec>(shared_dres != nullptr ? shared_dres : take(R * C), R, C);
    tokens_ = Buffer<std::int32_t, Mem>(tracker, MemCategory::activations, "lamina::tokens", s.tokens);
    inputs = Kokkos::subview(tokens_.view(), std::pair<std::int64_t, std::int64_t>(0, N));
    targets = Kokkos::subview(tokens_.view(), std::pair<std::int64_t, std::int64_t>(N, 2 * N));
  }

  const Dims& dims() const { return dims_; }
  std::int64_t first_block() const { return first_; }
  std::int64_t num_blocks() const { return static_cast<std::int64_t>(out_.size()); }
  ActivationPolicy policy(std::int64_t l) const { return policy_[static_cast<std::size_t>(l - first_)]; }
  // Input of global block l (in this range): the range's input or the previous block's output.
  const Residual<Exec>& block_input(std::int64_t l) const { return l == first_ ? input : out_[l - first_ - 1]; }
  const Residual<Exec>& block_output(std::int64_t l) const { return out_[l - first_]; }
  // Output of the range's last block (the input of the head or of the next range).
  const Residual<Exec>& output() const { return out_.empty() ? input : out_.back(); }
  bool bf16() const { return bf16_; }
  // Block l's activations, stored as T (float, or std::uint16_t in bf16 runs), with its inner
  // part at `inner` (its own storage when kept) and its output in its storage, or (`output`
  // false: a recomputation, whose output is kept already) nowhere.
  template <class T>
  BlockActs<Exec, T> block(T* inner, std::int64_t l, bool output = true) const {
    return bind_block_acts<Exec, T>(inner, output ? block_output(l).template as<T>() : MatOf<Exec, T>(), dims_);
  }
  // Kept inner activations (null for other policies).
  InnerActs kept_inner(std::int64_t l) const { return {inner_[l - first_], inner16_[l - first_]}; }
  const HostView& offloaded(std::int64_t l) const { return host_[l - first_].view(); }
  const HostView16& offloaded_bf16(std::int64_t l) const { return host16_[l - first_].view(); }
  // Pooled ranges: frames of stream_words (input, output) or boundary floats (dres), and the
  // checkpoint's host-tier copy.
  bool pooled() const { return pooled_; }
  void bind_input(float* words) { input = frame(words); }
  void bind_output(float* words) { out_.front() = frame(words); }
  void bind_dres(float* p) { dres = as_mat<Exec>(p, dims_.rows(), dims_.C); }
  const HostView& checkpoint() const { return checkpoint_.view(); }
  // A micro-batch's token ids (host memory, N of each) into `inputs` and `targets`, with the
  // inputs' positions grouped by token for the embedding's backward (token_runs()). The
  // copy is queued on `exec`; the host arrays may go once this returns (a copy from
  // pageable memory is staged before the call returns).
  void set_tokens(const Exec& exec, const std::int32_t* in, const std::int32_t* out) {
    const std::int64_t N = dims_.N();
    std::vector<std::int32_t> host(static_cast<std::size_t>(4 * N + 1));
    std::copy_n(in, N, host.data());
    std::copy_n(out, N, host.data() + N);
    runs_ = build_token_runs(in, N, host.data() + 2 * N, host.data() + 3 * N);
    using Host = Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Kokkos::deep_copy(exec, tokens_.view(), Host(host.data(), host.size()));
  }
  TokenRuns<Exec> token_runs() const {
    const auto all = tokens_.view();
    const std::int64_t N = dims_.N();
    return {Kokkos::subview(all, std::pair<std::int64_t, std::int64_t>(2 * N, 3 * N)),
            Kokkos::subview(all, std::pair<std::int64_t, std::int64_t>(3 * N, 4 * N + 1)), runs_};
  }

  Residual<Exec> input;
  HeadActs<Exec> head;
  Mat<Exec> dres;  // (R, C) gradient of the residual stream, flowing backward through the range
  TokenView inputs, targets;  // (N) int32
  bool has_embedding = false, has_head = false;

 private:
  Residual<Exec> frame(float* words) const {
    Residual<Exec> r;
    if (bf16_) {
      r.b16 = Mat16<Exec>(Kokkos::View<std::uint16_t**, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
          reinterpret_cast<std::uint16_t*>(words), dims_.rows(), dims_.C));
    } else {
      r.f32 = as_mat<Exec>(words, dims_.rows(), dims_.C);
    }
    return r;
  }

  Dims dims_;
  std::int64_t first_ = 0;
  std::vector<ActivationPolicy> policy_;
  bool bf16_ = false, pooled_ = false;
  Buffer<float, HostTierSpace> checkpoint_;
  std::vector<Residual<Exec>> out_;
  std::vector<float*> inner_;
  std::vector<std::uint16_t*> inner16_;
  std::vector<Buffer<float, HostTierSpace>> host_;
  std::vector<Buffer<std::uint16_t, HostTierSpace>> host16_;
  Buffer<float, Mem> buf_;
  Buffer<std::uint16_t, Mem> buf16_;
  Buffer<std::int32_t, Mem> tokens_;
  std::int64_t runs_ = 0;  // of token_runs()
};

}  // namespace lamina
