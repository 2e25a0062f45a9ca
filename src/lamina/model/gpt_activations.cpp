#include "lamina/model/gpt_activations.hpp"

#include "lamina/kernels/gemm.hpp"

#include <algorithm>

namespace lamina {

ActivationSizes activation_sizes(const Dims& d) {
  const std::int64_t N = d.N(), C = d.C, A = d.A(), F = d.F, scores = d.B * d.NH * d.T;
  ActivationSizes s;
  s.embed = N * C;
  // ln1, x2, ln2, out: 4 NC; qkv, atty: 4 NA; fch, fch_gelu: 2 NF; 4 (mean, rstd) of N
  s.block = 4 * N * C + 4 * N * A + 2 * N * F + 4 * N + scores * d.saved_attention_columns();
  s.inner = s.block - N * C;
  // lnf: NC; logits: NV; lnf mean/rstd, rowmax, sumexp, target, losses, lse: 7 N
  s.head = N * C + N * d.V + 7 * N;
  s.boundary = N * C;
  s.tokens = 4 * N + 1;  // inputs, targets, and the inputs grouped by token (TokenRuns)
  // q, k, v, y heads 4 NA, attproj and fcproj 2 NC
  const std::int64_t forward = 3 * N * A + N * A + 2 * N * C;
  // dln, scratch: 2 NC; dfch NF; dqkv 3 NA (holding the staged q, k, v heads first);
  // dq, dk, dv, dy, datty: 5 NA; score gradients and recomputed probabilities; 3A bias sums
  const std::int64_t backward = 2 * N * C + N * F + 8 * N * A +
                                scores * (d.score_gradient_columns() + d.recomputed_probability_columns()) + 3 * A;
  s.workspace = std::max(forward, backward);
  s.ones = N;
  if (d.bf16) {
    s.product_out = N * std::max({3 * A, F, C});  // within the shared part's backward: 2 NC + NF + 8 NA
    using Exec = Kokkos::DefaultExecutionSpace;
    const ProductMath math = product_math<Exec>(Precision::bf16);
    s.attention_copies = attention_copies<Exec>(d.attention, math, d.B, d.T, d.NH, d.hd);
    s.param_vectors = 6 * C + 3 * A + F;  // a block's; the final norm's 2C fit
    // Weights products read as bf16 (op(B) of K rows): the projections both ways, the head's.
    const std::int64_t largest = std::max({C * 3 * A, A * C, C * F, d.V * C});
    const std::int64_t largest_k = std::max({C, 3 * A, F, d.V});
    // Attention's products round their operands into it too where they run on a host's oneDNN.
    s.product_scratch =
        std::max(product_scratch<Exec>(largest, largest_k), attention_scratch<Exec>(d.attention, math, d.B, d.T, d.NH, d.hd));
    s.workspace += s.attention_copies + s.param_vectors + s.product_scratch;
  }
  return s;
}

}  // namespace lamina
