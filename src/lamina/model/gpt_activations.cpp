#include "lamina/model/gpt_activations.hpp"

#include "lamina/kernels/gemm.hpp"

#include <algorithm>

namespace lamina {

namespace {

// A bf16 run's conversions and copies on Exec (into s, of dims d).
template <class Exec>
void add_bf16_workspace(ActivationSizes& s, const Dims& d) {
  const std::int64_t N = d.N(), C = d.C, A = d.A(), W = d.qkv_width(), F = d.F, F1 = d.fc_width();
  s.product_out = N * std::max({W, F1, C});  // within the shared part's backward
  const ProductMath math = product_math<Exec>(Precision::bf16);
  // (Context parallelism's fused ring reads and writes bf16 as it is stored.)
  const bool ring = d.context_parallel() && d.attention == AttentionProducts::fused;
  s.attention_copies = ring ? 0 : attention_copies<Exec>(d.attention, math, d.B, d.T, d.NH, d.hd, d.NKV, d.keys());
  s.param_vectors = d.block_vectors();  // a block's; the final norm's fit
  // Weights products read as bf16 (op(B) of K rows): the projections both ways, the head's.
  const std::int64_t largest = std::max({C * W, A * C, C * F1, F * C, d.V * C});
  const std::int64_t largest_k = std::max({C, W, F1, F, d.V});
  // Attention's products round their operands into it too where they run on a host's oneDNN.
  s.product_scratch =
      std::max(product_scratch<Exec>(largest, largest_k),
               d.context_parallel() ? 0 : attention_scratch<Exec>(d.attention, math, d.B, d.T, d.NH, d.hd));
  s.workspace += s.attention_copies + s.param_vectors + s.product_scratch;
}

}  // namespace

ActivationSizes activation_sizes(const Dims& d) {
  const std::int64_t N = d.N(), R = d.rows(), C = d.C, A = d.A(), W = d.qkv_width(), F = d.F, F1 = d.fc_width(),
                     scores = d.B * d.NH * d.T;
  ActivationSizes s;
  s.embed = R * C;
  // ln1, x2, ln2, out: 4 RC (the stream's rows: all N, or a sequence-parallel rank's share);
  // qkv NW, atty NA; the MLP's first product and its activation N (F1 + F); the norms'
  // statistics per row
  s.block = 4 * R * C + N * W + N * A + N * (F1 + F) + 2 * d.norm_stats() * R + scores * d.saved_attention_columns();
  s.inner = s.block - R * C;
  // lnf: NC (gathered; bf16 in bf16 runs, which the head's products read as stored); logits:
  // V per row of a chunk (logit_rows); lnf mean/rstd 2 R; rowmax, sumexp, target, losses, lse:
  // 5 N
  s.head = (d.bf16 ? (N * C + 1) / 2 : N * C) + d.logit_rows() * d.V + 2 * R + 5 * N;
  s.boundary = R * C;
  s.tokens = 4 * N + 1;  // inputs, targets, and the inputs grouped by token (TokenRuns)
  // Sequence parallelism: the gathered residual gradient (or a reduce-scatter's share) in
  // fp32, and a norm's gathered output as stored.
  if (d.sequence_parallel()) s.sequence = N * C + (d.bf16 ? (N * C + 1) / 2 : N * C);
  // Context parallelism: keys and values as stored, two buffers; then the fused ring's running
  // results (N A and a log-sum-exp per score row) or, in their memory, two buffers of key/value
  // gradients; staged products take the keys and values of every position and their gradients
  // (cp N K each) before those buffers.
  if (d.context_parallel()) {
    const std::int64_t K = W - A, every = d.B * d.NKV * d.keys() * d.hd;
    s.context = 2 * N * (d.bf16 ? K / 2 : K) + (d.attention == AttentionProducts::staged
                                                     ? 4 * every + 2 * N * K
                                                     : std::max(N * A + scores, 2 * N * K));
  }
  // staged q, k, v, y heads N (W + A), attproj and fcproj 2 NC
  const std::int64_t forward = N * (W + A) + 2 * N * C;
  // dln, scratch: 2 NC; the MLP's gradients N fc_grad_width; dqkv NW (holding the staged q,
  // k, v heads first); dq, dk, dv NW; dy, datty: 2 NA; score gradients and recomputed
  // probabilities; the QKV bias's sums W
  const std::int64_t backward = 2 * N * C + N * d.fc_grad_width() + 2 * N * W + 2 * N * A +
                                scores * (d.score_gradient_columns() + d.recomputed_probability_columns()) +
                                (d.parts.bias ? W : 0);
  s.rotary = d.rotary_floats();
  s.workspace = std::max(forward, backward);
  // The widest column sums: a norm's gain, the projections' biases.
  s.column_partials = column_partials(N, std::max({C, d.fc_width(), W}));
  if (d.bf16) {
    // The dims' execution space: the build's default, or (a test's blocks) its host one.
    using Default = Kokkos::DefaultExecutionSpace;
    if (d.host_attention == kAttentionInPlace<Default>) {
      add_bf16_workspace<Default>(s, d);
    } else {
      add_bf16_workspace<Kokkos::DefaultHostExecutionSpace>(s, d);
    }
  }
  s.workspace += s.rotary;
  return s;
}

}  // namespace lamina
