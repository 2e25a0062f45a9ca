// The analytic memory model on hand-computed cases: the bytes per parameter that ZeRO and
// ZeRO-Offload count (Rajbhandari et al. 2020, Ren et al. 2021), the activation bytes each
// policy keeps or moves, and the budget check. That the model equals what a run
// allocates is tested against the trainer (tests/unit/train/memory_options_test.cpp).
#include "lamina/plan/memory_estimate.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lamina/core/error.hpp"
#include "lamina/core/memory_tracker.hpp"
#include "lamina/model/gpt_activations.hpp"
#include "lamina/plan/plan.hpp"

namespace lamina::test {
namespace {

// 2 blocks, d = 32, 4 heads, seq 16, vocab 64, 4 sequences per micro-batch, one step.
Deck tiny(const std::vector<std::string>& sets = {}) {
  const std::string text = R"(
[model]
layers = 2
d_model = 32
heads = 4
seq_len = 16
vocab_size = 64
[data]
format = "synthetic"
batch_size = 4
micro_batch_size = 4
[train]
steps = 1
[checkpoint]
every = 0
save_final = false
[output]
sample_tokens = 0
)";
  return parse_deck(text, "<tiny>", sets);
}

// GPT-2 parameters: token and position embeddings, 12 d^2 + 13 d per block, final norm.
constexpr std::int64_t kParams = 64 * 32 + 16 * 32 + 2 * (12 * 32 * 32 + 13 * 32) + 2 * 32;

std::int64_t bytes(const MemoryEstimate& e, MemTier tier, MemCategory c) {
  const auto s = e.bytes.find(tier_label(tier));
  if (s == e.bytes.end()) return 0;
  const auto it = s->second.find(mem_category_name(c));
  return it == s->second.end() ? 0 : it->second;
}

TEST(MemoryEstimate, OneFp32RankHoldsFourFourAndEightBytesPerParameter) {
  const MemoryEstimate e = estimate_memory(tiny());
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::parameters), 4 * kParams);
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::gradients), 4 * kParams);
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::optimizer_state), 8 * kParams);  // m and v
  EXPECT_EQ(e.total(tier_label(MemTier::host)), 0);
}

TEST(MemoryEstimate, OptimizerOffloadMovesMasterMomentsAndAGradientCopyToTheHost) {
  const MemoryEstimate e = estimate_memory(tiny({"memory.optimizer=host"}));
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::optimizer_state), 0);
  EXPECT_EQ(bytes(e, MemTier::host, MemCategory::optimizer_state), 12 * kParams);  // master, m, v
  EXPECT_EQ(bytes(e, MemTier::host, MemCategory::gradients), 4 * kParams);
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::parameters), 4 * kParams);
}

TEST(MemoryEstimate, Bf16StoresTwoBytesAndKeepsTwelveForTheOptimizer) {
  const MemoryEstimate e = estimate_memory(tiny({"train.precision=\"bf16\""}));
  // Stored bf16 parameters, which the compute reads as they are: no fp32 copy of any layer.
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::parameters), 2 * kParams);
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::gradients), 4 * kParams);               // fp32, as main_grad
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::optimizer_state), 12 * kParams);  // master, m, v
}

TEST(MemoryEstimate, Zero3OnTwoRanksShardsTheOptimizerState) {
  const MemoryEstimate e = estimate_memory(tiny({"parallel.dp=2", "parallel.zero=3", "data.batch_size=8"}));
  // Each layer's flat buffer padded to a multiple of 2, half of it owned.
  const std::int64_t block = 12 * 32 * 32 + 13 * 32, embedding = 64 * 32 + 16 * 32, final_norm = 2 * 32;
  const std::int64_t owned = (embedding + 1) / 2 + 2 * ((block + 1) / 2) + (final_norm + 1) / 2;
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::optimizer_state), 8 * owned);
  // The owned shard, one gathered buffer per layer size and the next block's, prefetched.
  EXPECT_EQ(bytes(e, MemTier::device, MemCategory::parameters),
            4 * owned + 4 * (embedding + block + final_norm) + 4 * block);
}

// Planning for a device on a host build: the device's fused attention keeps its T x T score
// rows in team scratch, so the estimate has none of the host's recomputed probabilities and
// score gradients in the workspace (one layer's B heads T^2 each).
TEST(MemoryEstimate, APlannedMachineRunsItsOwnKernels) {
  const Deck d = tiny({"model.attention=\"fused\""});
  const Plan plan = plan_from_deck(d);
  RunExtras host = RunExtras::of(d.checkpoint, d.output), device = host;
  host.machine_host = true;
  device.machine_host = false;
  const std::int64_t scores = 4 * 4 * 16 * 16;
  EXPECT_EQ(bytes(estimate_memory(d.model, plan, host), MemTier::device, MemCategory::workspace) -
                bytes(estimate_memory(d.model, plan, device), MemTier::device, MemCategory::workspace),
            4 * 2 * scores);
}

TEST(MemoryEstimate, RecomputeDropsAndOffloadMovesEachBlocksInnerActivations) {
  const std::string four = "model.layers=4";
  const ActivationSizes a = activation_sizes(Dims::of(tiny().model, 4));
  const std::int64_t keep = bytes(estimate_memory(tiny({four})), MemTier::device, MemCategory::activations);
  const MemoryEstimate recompute = estimate_memory(tiny({four, "memory.activations=\"recompute\""}));
  // Every block drops its inner activations; one block's worth of scratch is where they are recomputed.
  EXPECT_EQ(bytes(recompute, MemTier::device, MemCategory::activations), keep - 4 * 4 * a.inner + 4 * a.inner);
  const MemoryEstimate offload = estimate_memory(tiny({four, "memory.activations=\"offload\""}));
  EXPECT_EQ(bytes(offload, MemTier::host, MemCategory::activations), 4 * 4 * a.inner);
  // Offloaded blocks run in two device staging buffers (one copying while the other computes).
  EXPECT_EQ(bytes(offload, MemTier::device, MemCategory::activations), keep - 4 * 4 * a.inner + 2 * 4 * a.inner);
}

TEST(MemoryEstimate, ABudgetIsCheckedPerSpace) {
  const MemoryEstimate e = estimate_memory(tiny());
  const std::int64_t need = e.total(tier_label(MemTier::device));
  EXPECT_NO_THROW(check_memory_budget(tiny({"memory.device_budget=" + std::to_string(need)}), e));
  try {
    check_memory_budget(tiny({"memory.device_budget=" + std::to_string(need - 1)}), e);
    FAIL() << "expected an InputError";
  } catch (const InputError& err) {
    const std::string msg = err.what();
    EXPECT_NE(msg.find("<tiny>: memory.device_budget"), std::string::npos) << msg;
    EXPECT_NE(msg.find("(1 B over)"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory.optimizer = \"host\""), std::string::npos) << msg;
  }
  const MemoryEstimate offloaded = estimate_memory(tiny({"memory.optimizer=host"}));
  EXPECT_THROW(check_memory_budget(tiny({"memory.host_budget=1KiB"}), offloaded), InputError);
}

// An estimate of 1 MiB per rank on the host and, where there is one, 1 MiB on the device.
MemoryEstimate mebibyte_each() {
  MemoryEstimate e;
  e.bytes[tier_label(MemTier::host)]["parameters"] = 1 << 20;
  e.bytes[tier_label(MemTier::device)]["activations"] = 1 << 20;
  return e;
}

std::string fits(const SystemMemory& system, const NodeShare& share) {
  try {
    const std::string warning = check_memory_fits(mebibyte_each(), system, share, "<deck>");
    return warning.empty() ? "fits" : "warning: " + warning;
  } catch (const InputError& e) {
    return e.what();
  }
}

TEST(MemoryEstimate, TheRanksOfANodeMustFitItsHostMemory) {
  SystemMemory host_only;
  host_only.host_limit = 4 << 20;
  host_only.host_limit_source = "physical memory";
  host_only.host_available = 4 << 20;
  // Without a device of its own, both tiers are host memory: 2 MiB per rank.
  EXPECT_EQ(fits(host_only, {2, 2}), "fits");
  const std::string three = fits(host_only, {3, 3});
  EXPECT_NE(three.find("<deck>: the run needs 6.00 MiB of host memory on this node (3 rank(s) x 2.00 MiB), but the "
                       "node has 4.00 MiB (physical memory)"),
            std::string::npos)
      << three;
  EXPECT_NE(three.find("`lamina plan` finds a plan that fits"), std::string::npos) << three;
  host_only.host_available = 3 << 20;
  EXPECT_EQ(fits(host_only, {2, 2}).rfind("warning: the run needs 4.00 MiB of host memory on this node, 3.00 MiB is "
                                          "free now",
                                          0),
            0u);
}

TEST(MemoryEstimate, TheRanksOfADeviceMustFitItsFreeMemory) {
  SystemMemory gpu;
  gpu.host_limit = gpu.host_available = 64 << 20;
  gpu.separate_device = true;
  gpu.device_total = 8 << 20;
  gpu.device_free = 2 << 20;
  EXPECT_EQ(fits(gpu, {4, 2}), "fits");
  const std::string three = fits(gpu, {4, 3});
  EXPECT_NE(three.find("(3 rank(s) x 1.00 MiB), but the device has 2.00 MiB free of 8.00 MiB"), std::string::npos)
      << three;
}

}  // namespace
}  // namespace lamina::test
