// The cost model's roofline on hand-computed cases: a block's GEMMs, attention and
// element-wise passes, the tensor-parallel all-reduces inside it, ring collectives on the
// link their group spans, and AdamW on either side.
#include "lamina/plan/cost_model.hpp"

#include <gtest/gtest.h>

#include "lamina/core/error.hpp"
#include "lamina/kernels/attention.hpp"
#include "lamina/parallel/shard.hpp"
#include "lamina/plan/optimizer_plan.hpp"

namespace lamina::test {
namespace {

MachineSpec machine() {
  MachineSpec m;
  m.devices_per_node = 8;
  m.peak_flops_fp32 = 100e12;
  m.peak_flops_bf16 = 400e12;
  m.memory_bandwidth = 2e12;
  m.gemm_efficiency = 0.5;
  m.attention_efficiency = 0.25;
  m.elementwise_efficiency = 0.5;
  m.adamw_efficiency = 0.5;
  m.intra_bandwidth = 200e9;
  m.intra_latency = 1e-5;
  m.inter_bandwidth = 20e9;
  m.inter_latency = 2e-5;
  m.h2d = m.d2h = 25e9;
  m.host_adamw_rate = 8e9;
  return m;
}

ModelConfig model() {
  ModelConfig c;
  c.layers = 4;
  c.d_model = 1024;
  c.heads = 16;
  c.seq_len = 2048;
  c.vocab_size = 32768;
  c.attention = AttentionProducts::staged;  // probabilities kept, on every build
  return c;
}

Plan plan(int dp, int tp, std::int64_t micro_batch, Precision p) {
  Plan x;
  x.layout.dp = dp;
  x.layout.tp = tp;
  x.layout.micro_batch_size = micro_batch;
  x.blocks.assign(4, LayerPolicy{});
  x.precision = p;
  return x;
}

// Bytes of a block's element-wise passes in forward: what is stored (the residual stream,
// the saved activations) `s` bytes per element (2 in bf16, read and written as stored), the
// products' outputs and the softmax rows fp32: a layer norm (2 s), a residual add with the
// layer norm after it (3 s + 4), a residual add (2 s + 4), the q/k/v scatter and gather, the
// softmax over `scores` (0 fused; `bf16_scores`, staged products on a bf16 engine: the product
// writes them in bf16 and the softmax reads them and writes the probabilities in place, 3 s),
// the MLP's bias and GELU (read the fp32 product, write the pre-activation and the activation),
// or, a device's bf16 engine (`gelu_epilogue`: cuBLASLt's), the pre-activation the product
// writes beside the activation (s).
double elementwise_bytes(double s, double N, double C, double tp, double scores, bool bf16_scores = false,
                         bool gelu_epilogue = false) {
  const double A = C / tp, F = 4 * C / tp;
  return (7 * s + 8) * N * C + 6 * s * N * A + (bf16_scores ? 3 * s : 8 + s) * scores +
         (gelu_epilogue ? s : 4 + 2 * s) * N * F;
}

// And of its backward, whose gradients are fp32: two layer norms (each reads dout, dskip and x,
// writes dx and the gain's per-row terms, then sums those and dout: 24 + s), the column sums
// of the biases' gradients, GELU's backward in place (8 + s), q, k, v copied again and dq,
// dk, dv merged (2 s + 8), the softmax's backward over `scores` (dP written and read, the
// probabilities read, the score gradients written: in fp32, 12 + s; with `bf16_scores`, dP
// written in bf16 by its product and the score gradients in its place, 4 s). On a bf16
// `engine` the passes that round the products' output gradients sum the biases' gradients
// and apply GELU's derivative: neither moves bytes of its own.
double elementwise_backward_bytes(double s, double N, double C, double tp, double scores, bool bf16_scores,
                                  bool engine) {
  const double A = C / tp, F = 4 * C / tp;
  return 2 * (24 + s) * N * C + (engine ? 0.0 : 4 * N * (2 * C + F + 3 * A) + (8 + s) * N * F) +
         (2 * s + 8) * 3 * N * A + (bf16_scores ? 4 * s : 12 + s) * scores;
}

// The bytes a bf16 block still converts on a device with a bf16 engine (6 per element: the
// fp32 side and the bf16 one): staged attention's output and dy rounded (its products write
// the scores, dP and the score gradients in bf16; `scores` 0: the fused kernels, which convert
// nothing); in backward each product's output gradient dY (dres, dfch, dres, dqkv). (The QKV
// projection writes its output in bf16 with its bias: cuBLASLt's epilogue.)
struct Conversions {
  double forward, backward;
};
Conversions conversions(double N, double C, double tp, double scores) {
  const double A = C / tp, F = 4 * C / tp, staged = scores > 0 ? 6 * N * A : 0.0;
  return {staged, staged + 6 * N * (2 * C + F + 3 * A)};
}

// The head in one chunk of rows, its vocabulary on one rank: forward the product writes the
// logits, one pass reads them for their statistics and writes their gradient over them (bf16
// with a bf16 engine: 2 of the 4 bytes an fp32 run writes); backward its two products read
// the gradient, and the final norm's passes run; the weight's gradient reads the final norm's
// output as stored, in bf16, with nothing to round.
TEST(CostModel, HeadMovesTheLogitGradientInTheProductsPrecision) {
  const double N = 2048, C = 1024, V = 32768, bandwidth = 2e12 * 0.5, logits = 4 * N * V;
  const CostModel b(model(), plan(1, 1, 1, Precision::bf16), machine());
  EXPECT_NEAR(b.head_forward(), 2 * N * C * V / (400e12 * 0.5) + (2.5 * logits + 16 * N * C) / bandwidth, 1e-12);
  EXPECT_NEAR(b.head_backward(), 4 * N * C * V / (400e12 * 0.5) + (0.5 * logits + 16 * N * C) / bandwidth, 1e-12);
  const CostModel f(model(), plan(1, 1, 1, Precision::fp32), machine());
  EXPECT_NEAR(f.head_forward(), 2 * N * C * V / (100e12 * 0.5) + (3 * logits + 16 * N * C) / bandwidth, 1e-12);
  EXPECT_NEAR(f.head_backward(), 4 * N * C * V / (100e12 * 0.5) + (logits + 16 * N * C) / bandwidth, 1e-12);
}

TEST(CostModel, BlockForwardIsItsGemmsAttentionAndElementwisePasses) {
  const CostModel c(model(), plan(1, 1, 1, Precision::bf16), machine());
  const double N = 2048, C = 1024, T = 2048, H = 16, bandwidth = 2e12 * 0.5;
  const double gemm = 24 * N * C * C / (400e12 * 0.5);  // qkv, projection, two MLP products
  const double attention = 4 * N * T * C / (400e12 * 0.25);
  const double elementwise = elementwise_bytes(2, N, C, 1, H * T * T, true, true) / bandwidth;
  const double elementwise_backward = elementwise_backward_bytes(2, N, C, 1, H * T * T, true, true) / bandwidth;
  const Conversions bf16 = conversions(N, C, 1, H * T * T);
  EXPECT_NEAR(c.block_forward(), gemm + attention + elementwise + bf16.forward / bandwidth, 1e-12);
  EXPECT_NEAR(c.block_backward(), 2 * (gemm + attention) + elementwise_backward + bf16.backward / bandwidth, 1e-12);
  // fp32: at the fp32 rate, 4 bytes per stored element, no conversions.
  const CostModel f(model(), plan(1, 1, 1, Precision::fp32), machine());
  const double gemm32 = 24 * N * C * C / (100e12 * 0.5), attention32 = 4 * N * T * C / (100e12 * 0.25);
  EXPECT_NEAR(f.block_forward(), gemm32 + attention32 + elementwise_bytes(4, N, C, 1, H * T * T) / bandwidth, 1e-12);
  EXPECT_NEAR(f.block_backward(),
              2 * (gemm32 + attention32) + elementwise_backward_bytes(4, N, C, 1, H * T * T, false, false) / bandwidth,
              1e-12);
}

// A Llama block (4 key/value heads for 16 query heads, SwiGLU of 2816) prices its own
// products and passes: q, k/v, output projection and three MLP matrices; RMSNorm's second
// pass apart from the residual add (2 s + 4, then 2 s), rotary q and k in place, the
// narrower k/v scatter, SwiGLU reading the [gate | up] product and writing it and the
// activation; in backward RMSNorm's two passes (20 + s each: no bias), no bias sums, SwiGLU
// reading the activation's gradient and [gate | up] and writing theirs, dq and dk turned back
// in place; in bf16 what a bf16 engine moves and rounds (below).
TEST(CostModel, ALlamaBlockPricesItsOwnProductsAndPasses) {
  ModelConfig m = model();
  m.kv_heads = 4;
  m.ffn_hidden = 2816;
  m.parts.norm = NormKind::rmsnorm;
  m.parts.position = PositionKind::rotary;
  m.parts.mlp = MlpKind::swiglu;
  m.parts.bias = false;
  const CostModel f(m, plan(1, 1, 1, Precision::fp32), machine());
  const double N = 2048, C = 1024, T = 2048, H = 16, KV = 4 * 64, F = 2816, s = 4, bandwidth = 2e12 * 0.5;
  const double gemm = 2 * N * (C * (C + 2 * KV) + C * C + 3 * C * F) / (100e12 * 0.5);
  const double attention = 4 * N * T * C / (100e12 * 0.25);
  const double bytes = 2 * s * N * C + (2 * s + 4) * N * C + 2 * s * N * C + (2 * s + 4) * N * C +
                       2 * s * N * (C + 2 * KV) + 2 * s * N * (C + KV) + (8 + s) * H * T * T + (8 + 3 * s) * N * F;
  const double backward_bytes = 2 * (20 + s) * N * C + (12 + 2 * s) * N * F + 8 * N * (C + KV) +
                                (2 * s + 8) * N * (C + 2 * KV) + (12 + s) * H * T * T;
  EXPECT_NEAR(f.block_forward(), gemm + attention + bytes / bandwidth, 1e-12);
  EXPECT_NEAR(f.block_backward(), 2 * (gemm + attention) + backward_bytes / bandwidth, 1e-12);
  // bf16 on a device's engine (staged attention): SwiGLU's backward writes [dgate | dup] in
  // bf16 for the products (2 bytes each, not 4) and no pass rounds it; the products' output
  // gradients that are rounded are the two projections' (C each) and the QKV's (C + 2 KV):
  // 6 bytes per element, beside staged attention's output and dy (6 each); its products write
  // dP in bf16 and the softmax's backward the score gradients in its place (2 bytes each way).
  const CostModel b(m, plan(1, 1, 1, Precision::bf16), machine());
  const double s16 = 2, gemm16 = gemm / 4, attention16 = attention / 4;
  const double backward16 = 2 * (20 + s16) * N * C + (8 + 2 * s16) * N * F + 8 * N * (C + KV) +
                            (2 * s16 + 8) * N * (C + 2 * KV) + 4 * s16 * H * T * T;
  const double rounded16 = 6 * N * C + 6 * N * (2 * C + C + 2 * KV);
  EXPECT_NEAR(b.block_backward(), 2 * (gemm16 + attention16) + (backward16 + rounded16) / bandwidth, 1e-12);
  // Forward, cuBLAS writes the QKV and [gate | up] products in bf16 (they have no bias): no pass
  // rounds the QKV output, SwiGLU reads [gate | up] as stored (3 s per element of F, not 8 + 3 s),
  // the scores move in bf16 (3 s), and only staged attention's output is rounded (6 bytes).
  const double forward16 = 2 * s16 * N * C + (2 * s16 + 4) * N * C + 2 * s16 * N * C + (2 * s16 + 4) * N * C +
                           2 * s16 * N * (C + 2 * KV) + 2 * s16 * N * (C + KV) + 3 * s16 * H * T * T +
                           3 * s16 * N * F;
  EXPECT_NEAR(b.block_forward(), gemm16 + attention16 + (forward16 + 6 * N * C) / bandwidth, 1e-12);
}

TEST(CostModel, FusedAttentionRecomputesTheScoresInsteadOfMovingThem) {
  ModelConfig m = model();
  m.attention = AttentionProducts::fused;
  const CostModel c(m, plan(1, 1, 1, Precision::bf16), machine());
  const double N = 2048, C = 1024, T = 2048, bandwidth = 2e12 * 0.5;
  const double gemm = 24 * N * C * C / (400e12 * 0.5);
  // A device's fused kernels compute at the fp32 rate, recomputing the scores twice in backward.
  const double attention = 4 * N * T * C / (100e12 * 0.25);
  const double elementwise = elementwise_bytes(2, N, C, 1, 0, false, true) / bandwidth;
  const double elementwise_backward = elementwise_backward_bytes(2, N, C, 1, 0, true, true) / bandwidth;
  const Conversions bf16 = conversions(N, C, 1, 0);  // the fused kernels read and write bf16
  EXPECT_NEAR(c.block_forward(), gemm + attention + elementwise + bf16.forward / bandwidth, 1e-12);
  EXPECT_NEAR(c.block_backward(), 2 * gemm + 3.5 * attention + elementwise_backward + bf16.backward / bandwidth,
              1e-12);
  // On a host with a BLAS for attention, its products run at the bf16 rate, the scores once more.
  if (!kAttentionInPlace<Kokkos::DefaultHostExecutionSpace>) return;
  MachineSpec host = machine();
  host.device_is_host = true;
  // Two threads: each norm's backward reads its output's gradient and input again for the
  // sums instead of writing and reading per-row terms and (the bias) reading the gradient
  // again, as a device does: 4 bytes less each in fp32.
  host.cores_per_device = 2;
  const CostModel h(m, plan(1, 1, 1, Precision::fp32), host);
  const double gemm32 = 24 * N * C * C / (100e12 * 0.5), attention32 = 4 * N * T * C / (100e12 * 0.25);
  EXPECT_NEAR(h.block_backward(),
              2 * gemm32 + 2.5 * attention32 +
                  (elementwise_backward_bytes(4, N, C, 1, 0, false, false) - 2 * 4 * N * C) / bandwidth,
              1e-12);
}

// A plan prices the attention a build for its machine runs: on a device, staged unless the
// deck says fused (whatever the planning build's own default); in_place, which needs a host
// BLAS, is refused there.
TEST(CostModel, ADeviceIsPricedWithTheAttentionADeviceBuildRuns) {
  ModelConfig automatic = model(), staged = model(), in_place = model();
  automatic.attention.reset();
  in_place.attention = AttentionProducts::in_place;
  const Plan p = plan(1, 1, 1, Precision::bf16);
  const CostModel a(automatic, p, machine()), s(staged, p, machine());
  EXPECT_DOUBLE_EQ(a.block_forward(), s.block_forward());
  EXPECT_DOUBLE_EQ(a.block_backward(), s.block_backward());
  try {
    const CostModel refused(in_place, p, machine());
    FAIL() << "in_place attention priced on a device";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.attention = \"in_place\" needs host execution"), std::string::npos)
        << e.what();
  }
}

// On a host's bf16 engine (oneDNN) the in_place attention reads the bf16 storage as it is
// and takes its softmax by row blocks whose products stop at the block's last row: forward,
// its rows read and write the fp32 scores and write the saved probabilities only up to the
// diagonal (half the (T, T) scores), and its output products write the output in bf16;
// backward, they read the probabilities and dP that far and round the score gradients (2 of 6
// bytes) without writing them in fp32, and read dy as the output projection writes it, in bf16
// (staged attention rounds it: 6 bytes per element). Staged attention on the engine moves all of the scores
// in bf16 (its product writes them, the softmax reads them and writes the probabilities in
// place: 2 + 2 + 2), rounds its output from fp32 (6 bytes per element), and backward writes
// dP in bf16, reads it and the probabilities, and writes the score gradients in its place (2
// bytes each). Nothing else differs.
TEST(CostModel, AHostsBf16EngineReadsAttentionsStorageInPlace) {
  if (!kAttentionInPlace<Kokkos::DefaultHostExecutionSpace>) GTEST_SKIP() << "no host BLAS for attention";
  MachineSpec host = machine();
  host.device_is_host = true;
  const double N = 2048, A = 1024, T = 2048, H = 16, bandwidth = 2e12 * 0.5;
  ModelConfig in_place = model();
  in_place.attention = AttentionProducts::in_place;
  const CostModel i(in_place, plan(1, 1, 1, Precision::bf16), host), s(model(), plan(1, 1, 1, Precision::bf16), host);
  const double scores = H * T * T, half = scores / 2;
  // forward: (4 + 4 + 2) bytes of half the scores against (2 + 2 + 2) of all of them, and no
  // output rounded
  EXPECT_NEAR(i.block_forward() - s.block_forward(), (10 * half - 6 * scores - 6 * N * A) / bandwidth, 1e-12);
  // backward: probabilities and dP read (2 + 4) and dS rounded (2) for half the scores; staged
  // writes dP, reads it and the probabilities and writes dS (2 + 2 + 2 + 2), all of them; no dy
  // rounded
  EXPECT_NEAR(i.block_backward() - s.block_backward(), ((6 + 2) * half - 8 * scores - 6 * N * A) / bandwidth, 1e-12);
  EXPECT_NEAR(i.head_backward(), s.head_backward(), 1e-12);
}

// A host's engine (oneDNN) writes the QKV projection and the MLP's first product in bf16 with
// their biases, as a device's (cuBLASLt) does, but GELU runs as a pass of its own, which reads
// the kept bf16 pre-activation and writes the activation (2 + 2 bytes), where the device's
// product writes the pre-activation beside the activation (2). Backward, both engines' passes
// that round the output gradients sum the bias gradients and apply GELU's derivative; on a
// rank of one thread each of the two layer norms adds its gain's and bias's terms into their
// sums as it goes: no terms written and read, no second read of the output's gradient
// (4 + 4 + 4); with two threads a second pass reads the output's gradient and the input for
// the sums: against a device's, no terms written and read, but the input read again (4 + 4 - 2).
TEST(CostModel, AHostsEngineWritesTheQkvAndMlpProductsInBf16) {
  MachineSpec host = machine();
  host.device_is_host = true;
  host.cores_per_device = 1;
  MachineSpec threads = host;
  threads.cores_per_device = 2;
  const double N = 2048, C = 1024, F = 4 * C, bandwidth = 2e12 * 0.5;
  const CostModel d(model(), plan(1, 1, 1, Precision::bf16), machine()), h(model(), plan(1, 1, 1, Precision::bf16), host);
  const CostModel t(model(), plan(1, 1, 1, Precision::bf16), threads);
  EXPECT_NEAR(d.block_forward() - h.block_forward(), -2 * N * F / bandwidth, 1e-12);
  EXPECT_NEAR(d.block_backward() - h.block_backward(), 2 * (4 + 4 + 4) * N * C / bandwidth, 1e-12);
  EXPECT_NEAR(t.block_forward(), h.block_forward(), 1e-12);
  EXPECT_NEAR(d.block_backward() - t.block_backward(), 2 * (4 + 4 - 2) * N * C / bandwidth, 1e-12);
}

TEST(CostModel, TensorParallelismSplitsTheWorkAndAddsTwoAllReducesPerPass) {
  const CostModel c(model(), plan(1, 2, 1, Precision::bf16), machine());
  const double N = 2048, C = 1024, T = 2048, H = 8, bandwidth = 2e12 * 0.5;  // 8 heads on each of the 2 ranks
  const double gemm = 24 * N * C * C / 2 / (400e12 * 0.5);
  const double attention = 4 * N * T * C / 2 / (400e12 * 0.25);
  const double elementwise = elementwise_bytes(2, N, C, 2, H * T * T, true, true) / bandwidth;
  const double elementwise_backward = elementwise_backward_bytes(2, N, C, 2, H * T * T, true, true) / bandwidth;
  // An all-reduce of the (N, C) fp32 residual over 2 ranks inside a node: 2 (p-1)/p of its
  // bytes, 2 (p-1) latency-bound steps; two per pass (Megatron's f and g).
  const double allreduce = 4 * N * C / 200e9 + 2 * 1e-5;
  const Conversions bf16 = conversions(N, C, 2, H * T * T);
  EXPECT_NEAR(c.block_forward(), gemm + attention + elementwise + bf16.forward / bandwidth + 2 * allreduce, 1e-12);
  EXPECT_NEAR(c.block_backward(),
              2 * (gemm + attention) + elementwise_backward + bf16.backward / bandwidth + 2 * allreduce, 1e-12);
}

// parallel.tp_sums = "bf16": each of the four sums moves half the bytes. Forward, the
// products write the local (N, C) partial results in bf16 (a bf16 engine, cuBLAS's here: the
// row-parallel products have no bias) where a pass would round them (read 4, write 2 bytes),
// and the residual adds read the bf16 sum (2 bytes, not 4). Backward, the column-parallel
// products write the partial input gradients in bf16 alike, and the norms read the sum as it
// is (2 bytes, and LayerNorm's bias gradient again: twice, but once on a host's one thread).
// Without a bf16 engine a pass rounds each partial result and gradient.
TEST(CostModel, Bf16TensorParallelSumsMoveHalfTheBytesAndAreReadAsSummed) {
  Plan halves = plan(1, 2, 1, Precision::bf16);
  halves.tp_sums = Precision::bf16;
  MachineSpec host = machine(), threads = machine();
  host.device_is_host = threads.device_is_host = true;
  host.cores_per_device = 1;
  threads.cores_per_device = 2;
  const CostModel f(model(), plan(1, 2, 1, Precision::bf16), machine()), h(model(), halves, machine());
  const double N = 2048, C = 1024, bandwidth = 2e12 * 0.5;
  const double fp32_sum = 4 * N * C / 200e9 + 2 * 1e-5, bf16_sum = 2 * N * C / 200e9 + 2 * 1e-5;
  EXPECT_NEAR(f.forward_parts().tp, 2 * fp32_sum, 1e-12);
  EXPECT_NEAR(h.forward_parts().tp, 2 * bf16_sum, 1e-12);
  EXPECT_NEAR(h.backward_parts().tp, 2 * bf16_sum, 1e-12);
  EXPECT_NEAR(h.forward_parts().conversions, f.forward_parts().conversions, 1e-12);
  EXPECT_NEAR(f.forward_parts().elementwise - h.forward_parts().elementwise, 2 * 2 * N * C / bandwidth, 1e-12);
  EXPECT_NEAR(h.backward_parts().conversions, f.backward_parts().conversions, 1e-12);
  EXPECT_NEAR(f.backward_parts().elementwise - h.backward_parts().elementwise, 2 * 4 * N * C / bandwidth, 1e-12);
  EXPECT_NEAR(h.forward_parts().gemm, f.forward_parts().gemm, 0.0);
  MachineSpec no_engine = machine();
  no_engine.peak_flops_bf16 = 0;
  const CostModel nf(model(), plan(1, 2, 1, Precision::bf16), no_engine), nh(model(), halves, no_engine);
  EXPECT_NEAR(nh.forward_parts().conversions - nf.forward_parts().conversions, 2 * 6 * N * C / bandwidth, 1e-12);
  EXPECT_NEAR(nh.backward_parts().conversions - nf.backward_parts().conversions, 2 * 6 * N * C / bandwidth, 1e-12);
  for (const MachineSpec& m : {host, threads}) {
    SCOPED_TRACE(m.cores_per_device);
    const CostModel f32(model(), plan(1, 2, 1, Precision::bf16), m), b16(model(), halves, m);
    EXPECT_NEAR(b16.forward_parts().conversions, f32.forward_parts().conversions, 1e-12);
    EXPECT_NEAR(f32.forward_parts().elementwise - b16.forward_parts().elementwise, 2 * 2 * N * C / bandwidth, 1e-12);
    EXPECT_NEAR(b16.backward_parts().conversions, f32.backward_parts().conversions, 1e-12);
    EXPECT_NEAR(f32.backward_parts().elementwise - b16.backward_parts().elementwise,
                2 * (m.cores_per_device <= 1 ? 2 : 4) * N * C / bandwidth, 1e-12);
  }
}

// Sequence parallelism (tp 4, fp32): each all-reduce becomes an all-gather and a reduce-scatter,
// the same bytes and steps; backward gathers the norms' outputs once more (1.5 times the
// bytes); the norms and residual adds, 36 bytes per element of the stream (a layer norm 8, the
// residual add with the second one 16 + 4, the last residual add 8), run on N / 4 rows. The
// reduction adds the norms' gradients over the group. The head's all-reduce becomes an
// all-gather of the final norm's output. In bf16 the norms' outputs travel as stored, 2 bytes.
TEST(CostModel, SequenceParallelismShardsTheNormsAndSplitsEachSumInTwo) {
  Plan split = plan(1, 4, 1, Precision::fp32);
  split.layout.sequence_parallel = true;
  const CostModel whole(model(), plan(1, 4, 1, Precision::fp32), machine()), sp(model(), split, machine());
  const double N = 2048, C = 1024, bandwidth = 2e12 * 0.5;
  const double half = 3.0 / 4 * 4 * N * C / 200e9 + 3 * 1e-5, allreduce = 2 * 3.0 / 4 * 4 * N * C / 200e9 + 6 * 1e-5;
  EXPECT_NEAR(whole.forward_parts().tp, 2 * allreduce, 1e-12);
  EXPECT_NEAR(sp.forward_parts().tp, 4 * half, 1e-12);
  EXPECT_NEAR(sp.backward_parts().tp, 6 * half, 1e-12);
  EXPECT_NEAR(whole.forward_parts().elementwise - sp.forward_parts().elementwise, 36 * (N - N / 4) * C / bandwidth,
              1e-12);
  EXPECT_GT(whole.backward_parts().elementwise, sp.backward_parts().elementwise);
  EXPECT_NEAR(sp.forward_parts().gemm, whole.forward_parts().gemm, 0.0);
  EXPECT_NEAR(sp.forward_parts().attention, whole.forward_parts().attention, 0.0);
  const double norms = 4 * C;  // two LayerNorms' gains and biases
  EXPECT_NEAR(sp.reduce(1) - whole.reduce(1), sp.collective(2 * 3.0 / 4 * 4 * norms, 6, 4), 1e-15);
  Plan split16 = plan(1, 4, 1, Precision::bf16);
  split16.layout.sequence_parallel = true;
  const CostModel bf16(model(), split16, machine()), bf16_whole(model(), plan(1, 4, 1, Precision::bf16), machine());
  const double gathered = 3.0 / 4 * 2 * N * C / 200e9 + 3 * 1e-5;
  EXPECT_NEAR(sp.head_forward() - whole.head_forward(), half - allreduce, 1e-12);
  EXPECT_NEAR(bf16.head_forward() - bf16_whole.head_forward(), gathered - allreduce, 1e-12);
  EXPECT_NEAR(bf16.forward_parts().tp, 2 * (half + gathered), 1e-12);
  EXPECT_NEAR(bf16.backward_parts().tp, 2 * (2 * half + gathered), 1e-12);
  // bf16 sums: the partial results reduce-scatter in bf16 too (the gathered residual gradient
  // stays fp32).
  split16.tp_sums = Precision::bf16;
  const CostModel sums16(model(), split16, machine());
  EXPECT_NEAR(sums16.forward_parts().tp, 2 * (gathered + gathered), 1e-12);
  EXPECT_NEAR(sums16.backward_parts().tp, 2 * (half + gathered + gathered), 1e-12);
}

// plan() with context parallelism over cp ranks (bf16, micro-batch 1).
Plan context_plan(int cp) {
  Plan p = plan(1, 1, 1, Precision::bf16);
  p.layout.cp = cp;
  return p;
}

// A rank's ring traffic per pass on cp 2: its 1024 rows of keys and values, 2 x 1024 columns,
// in bf16 to the next rank in a node (200 GB/s, 10 us), and their fp32 gradients.
constexpr double kRingValues = 1024.0 * 2 * 1024;
constexpr double kRingPass = 2 * kRingValues / 200e9 + 1e-5, kRingGradients = 4 * kRingValues / 200e9 + 1e-5;

// Context parallelism: a rank's queries (N / cp rows) meet every key of their sequences, so
// the attention halves on cp 2 as the products do; the ring's passes cost what the attention
// beside them does not hide, and the gradients sum over the dp x cp ranks of a replica.
TEST(CostModel, ContextParallelismPricesTheRingBesideTheAttentionItOverlaps) {
  ModelConfig m = model();
  m.attention = AttentionProducts::fused;
  const Plan ring_plan = context_plan(2);
  const CostModel whole(m, plan(1, 1, 1, Precision::bf16), machine()), ring(m, ring_plan, machine());
  EXPECT_NEAR(ring.forward_parts().attention, whole.forward_parts().attention / 2, 1e-15);
  EXPECT_NEAR(ring.backward_parts().attention, whole.backward_parts().attention / 2, 1e-15);
  EXPECT_NEAR(ring.forward_parts().gemm, whole.forward_parts().gemm / 2, 1e-15);
  EXPECT_EQ(whole.forward_parts().cp, 0.0);
  // In a node the attention (0.34 ms forward) hides the pass; the gradients' passes are exposed.
  EXPECT_LT(kRingPass, ring.forward_parts().attention / 2);
  EXPECT_EQ(ring.forward_parts().cp, 0.0);
  EXPECT_NEAR(ring.backward_parts().cp, 2 * kRingGradients, 1e-15);
  // One device per node: the ring crosses the network (20 GB/s), slower than the attention.
  MachineSpec apart = machine();
  apart.devices_per_node = 1;
  const CostModel slow(m, ring_plan, apart);
  const double slow_pass = 2 * kRingValues / 20e9 + 2e-5, slow_gradients = 4 * kRingValues / 20e9 + 2e-5;
  EXPECT_NEAR(slow.forward_parts().cp, slow_pass - slow.forward_parts().attention / 2, 1e-15);
  EXPECT_GT(slow.forward_parts().cp, 0.0);
  EXPECT_NEAR(slow.backward_parts().cp,
              std::max(0.0, slow_pass - slow.backward_parts().attention / 2) + 2 * slow_gradients, 1e-15);
  EXPECT_NEAR(slow.block_forward() - ring.block_forward(), slow.forward_parts().cp, 1e-15);
  // The gradients of cp 2 reduce as dp 2's; the ring holds the host (collectives inside a layer).
  EXPECT_DOUBLE_EQ(ring.reduce(1), CostModel(m, plan(2, 1, 1, Precision::bf16), machine()).reduce(1));
  EXPECT_FALSE(ring.compute_queued());
  // Pipeline messages and checkpoints are a rank's rows.
  EXPECT_LT(ring.p2p(true), whole.p2p(true));
  EXPECT_DOUBLE_EQ(ring.checkpoint_copy(true), whole.checkpoint_copy(true) / 2);
}

// Staged products under context parallelism: a rank's queries (half the rows) against every
// position's keys, half the whole sequence's score matrices, its attention half the
// whole's; its products wait for all the keys, so every pass is exposed, even in a node.
TEST(CostModel, StagedContextParallelismExposesEveryPassAndHalvesTheScores) {
  ModelConfig m = model();
  m.attention = AttentionProducts::staged;
  const CostModel whole(m, plan(1, 1, 1, Precision::bf16), machine()), gathered(m, context_plan(2), machine());
  EXPECT_NEAR(gathered.forward_parts().attention, whole.forward_parts().attention / 2, 1e-15);
  EXPECT_NEAR(gathered.backward_parts().attention, whole.backward_parts().attention / 2, 1e-15);
  EXPECT_NEAR(gathered.forward_parts().cp, kRingPass, 1e-15);
  EXPECT_NEAR(gathered.backward_parts().cp, kRingPass + 2 * kRingGradients, 1e-15);
  // The score passes (half the (T, T) scores) dominate the element-wise time of both; the
  // placed keys add 2 x 2 bytes of every position's keys and values to the rank's half.
  EXPECT_LT(gathered.forward_parts().elementwise, whole.forward_parts().elementwise);
  EXPECT_GT(gathered.forward_parts().elementwise, whole.forward_parts().elementwise / 2);
}

// The loss in chunks of rows (model.loss_chunk): the head's backward computes the logits
// again, its product and the logits' bytes once more, then reads them and writes their
// gradient. In one chunk the forward's pass over the logits writes the gradient instead.
TEST(CostModel, LossChunksPriceTheHeadsProductAgainInBackward) {
  ModelConfig m = model();
  const CostModel whole(m, plan(1, 1, 1, Precision::bf16), machine());
  m.loss_chunk = 256;
  const CostModel chunked(m, plan(1, 1, 1, Precision::bf16), machine());
  // 2048 rows, C = 1024, V = 32768: bf16 products at 200 TFLOP/s, 1 TB/s for the fp32 logits
  // and their bf16 gradient.
  const double N = 2048, C = 1024, V = 32768;
  EXPECT_NEAR(whole.head_forward() - chunked.head_forward(), 2 * N * V / 1e12, 1e-15);
  EXPECT_NEAR(chunked.head_backward() - whole.head_backward(),
              2 * N * C * V / 200e12 + (4 + 4 + 2) * N * V / 1e12, 1e-15);
}

TEST(CostModel, CollectivesUseTheLinkTheirGroupSpans) {
  const CostModel c(model(), plan(4, 2, 1, Precision::bf16), machine());
  EXPECT_DOUBLE_EQ(c.collective(1e9, 3, 8), 1e9 / 200e9 + 3 * 1e-5);  // one node
  EXPECT_DOUBLE_EQ(c.collective(1e9, 3, 16), 1e9 / 20e9 + 3 * 2e-5);  // two nodes
  // ZeRO-0 all-reduces a block's fp32 gradients over dp = 4, which with tp = 2 spans 8
  // ranks: one node.
  const double padded = static_cast<double>(
      LayerShard::of(ParamLayout::of(model(), 2, 0).layers()[1].numel, 4, true).padded);
  EXPECT_DOUBLE_EQ(c.reduce(1), c.collective(2.0 * 3 / 4 * 4 * padded, 6, 8));
}

// Where tp exceeds the key/value heads, the reduction first adds the copies of each over
// the tensor-parallel group: one all-reduce of every head's K and V columns.
TEST(CostModel, SharedKeyValueHeadsAddTheirCopiesOverTheTensorParallelGroup) {
  ModelConfig m = model();
  m.kv_heads = 4;
  const CostModel whole(m, plan(1, 4, 1, Precision::bf16), machine());  // a head per rank
  EXPECT_DOUBLE_EQ(whole.reduce(1), 0.0);
  const CostModel shared(m, plan(1, 8, 1, Precision::bf16), machine());  // two ranks per head
  const double packed = 2 * 4 * (1024 + 1) * 64;  // K and V: 4 heads of 64 columns, C weight rows and the bias
  EXPECT_DOUBLE_EQ(shared.replica_sum_bytes(1), 2.0 * 7 / 8 * 4 * packed);
  EXPECT_DOUBLE_EQ(shared.reduce(1), shared.collective(2.0 * 7 / 8 * 4 * packed, 14, 8));
  EXPECT_DOUBLE_EQ(shared.reduce(0), 0.0);  // the embedding has none
}

TEST(CostModel, AdamWOnTheDeviceMovesTwentyEightBytesPerParameter) {
  const CostModel c(model(), plan(1, 1, 1, Precision::fp32), machine());
  EXPECT_DOUBLE_EQ(c.update(1000000, UpdateSite::device, false, false), 28e6 / (2e12 * 0.5));
  // Writing the bf16 parameters beside the master weights: 2 bytes more.
  EXPECT_DOUBLE_EQ(c.update(1000000, UpdateSite::device, false, true), 30e6 / (2e12 * 0.5));
  // A device subgroup of host-resident state also moves its 12 bytes each way.
  EXPECT_DOUBLE_EQ(c.update(1000000, UpdateSite::device, true, false), 28e6 / 1e12 + 12e6 / 25e9 + 12e6 / 25e9);
  // On the host: a node's rate shared by its 8 devices.
  EXPECT_DOUBLE_EQ(c.update(1000000, UpdateSite::host, true, false), 1e6 / 1e9);
  // An optimizer program prices what each instruction moves: a bf16 layer on the device has
  // no publish (its update writes the stored parameters), one with host state copies its
  // bf16 parameters in.
  Plan b = plan(1, 1, 1, Precision::bf16);
  CostModel bf16(model(), b, machine());
  RankOptimizers ro;
  ro.layers[1].layer = 1;
  ro.layers[1].subgroups = {Subgroup{1, 0, 1000000}};
  bf16.set_rank_optimizers(ro);
  Instruction u;
  u.op = Op::optimizer_update;
  u.layer = 1;
  u.subgroup = 0;
  u.site = UpdateSite::device;
  EXPECT_DOUBLE_EQ(bf16.price(u), 30e6 / (2e12 * 0.5));
  b.blocks.assign(4, LayerPolicy{ActivationPolicy::keep, MemTier::device, OptimizerPlacement::host});
  const CostModel hosted(model(), b, machine());
  const double owned = static_cast<double>(LayerShard::of(ParamLayout::of(model(), 1, 0).layers()[1].numel, 1, true).owned_size(0));
  EXPECT_DOUBLE_EQ(hosted.publish(1), owned * 2 / 25e9);
}

}  // namespace
}  // namespace lamina::test
