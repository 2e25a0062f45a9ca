// The training-time analysis: the scaling laws' loss and critical batch on hand-computed
// cases, the devices a batch keeps busy per pipeline family, and the sweep's properties
// (the layered family never slower; more devices never slower below the batch cap).
#include "lamina/plan/training_time.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace lamina::test {
namespace {

TEST(TrainingTime, KaplansLossAndCriticalBatchForGpt3) {
  // GPT-3 175B: 96 x 12 x 12288^2 = 173.95e9 non-embedding parameters, 300e9 tokens:
  // (8.8e13 / 1.7395e11)^(0.076 / 0.095) = 505.89^0.8 = 145.70; 5.4e13 / 3e11 = 180;
  // L = 325.70^0.095 = 1.7326 nats. B_crit = 2e8 / 1.7326^(1 / 0.21) = 2e8 / 13.70 = 14.60M tokens.
  const double n = 96.0 * 12 * 12288.0 * 12288.0;
  const double loss = expected_loss(n, 300e9);
  EXPECT_NEAR(loss, 1.7326, 1e-3);
  EXPECT_NEAR(critical_batch_tokens(loss), 14.60e6, 0.02e6);
  // A loss of 1 nat: B_crit = B_* exactly; lower losses need larger batches.
  EXPECT_DOUBLE_EQ(critical_batch_tokens(1.0), 2e8);
  EXPECT_GT(critical_batch_tokens(0.9), 2e8);
}

TEST(TrainingTime, ABatchFeedsFourTimesMoreDevicesWithModularPipelines) {
  // 7128 sequences at tp 8: standard pipelines want 4 micro-batches per stage, so dp x pp
  // <= 1782 and 14256 devices; modular ones 1 per stage: 57024 devices.
  EXPECT_EQ(devices_fed(7128, 8, Family::standard), 8 * 1782);
  EXPECT_EQ(devices_fed(7128, 8, Family::layered_modular), 8 * 7128);
  EXPECT_EQ(devices_fed(3, 1, Family::standard), 1);  // never fewer than one replica
}

const char* kMachine = R"(name = "test machine"
[device]
per_node = 8
memory = "80GB"
peak_tflops_fp32 = 20
peak_tflops_bf16 = 300
memory_bandwidth = "2TB"
[host]
memory = "1TB"
memory_bandwidth = "400GB"
adamw_params_per_s = 5e9
[links]
h2d = "25GB"
d2h = "25GB"
[network]
intra_node_bandwidth = "300GB"
intra_node_latency = 5e-6
inter_node_bandwidth = "25GB"
inter_node_latency = 1e-5
)";

const char* kDeck = R"([model]
layers = 16
d_model = 2048
heads = 16
seq_len = 1024
vocab_size = 32768
[data]
format = "synthetic"
batch_size = 512
[train]
steps = 1
precision = "bf16"
[checkpoint]
save_final = false
)";

// Of equal times the fewest devices: a larger cluster whose simulated step differs in its
// last bits does not take the shortest time from a smaller one.
TEST(TrainingTime, MoreDevicesCountOnlyWhereTheyAreFaster) {
  SweepRow shortest, row;
  shortest.days = 0.648128673;
  row.days = shortest.days * (1.0 - 1e-13);
  EXPECT_FALSE(trains_faster(row, shortest));
  row.days = shortest.days * (1.0 - 1e-6);
  EXPECT_TRUE(trains_faster(row, shortest));
  row.days = shortest.days;
  EXPECT_FALSE(trains_faster(row, shortest));
}

TEST(TrainingTime, TheSweepFindsEachFamilysShortestTime) {
  const MachineSpec machine = parse_machine(kMachine, "<test>");
  const Deck deck = parse_deck(kDeck, "deck.toml");
  PlannerOptions o;
  o.free_keys = planner_keys();
  const ShortestTime r = shortest_time(deck, machine, 20e9, 256, false, o);
  ASSERT_GE(r.shortest_standard, 0);
  ASSERT_GE(r.shortest_layered, 0);
  // The batch never exceeds the critical one.
  for (const SweepRow& row : r.rows) {
    if (row.feasible) {
      EXPECT_LE(row.batch_sequences * 1024, static_cast<std::int64_t>(r.critical_batch_tokens));
    }
  }
  // Layered accumulation and modular pipelines are options on top of the standard ones:
  // never slower at any size, so never a longer shortest time.
  for (const SweepRow& a : r.rows) {
    if (a.family != Family::standard || !a.feasible) continue;
    for (const SweepRow& b : r.rows) {
      if (b.family == Family::layered_modular && b.ranks == a.ranks) {
        ASSERT_TRUE(b.feasible);
        EXPECT_LE(b.days, a.days) << a.ranks << " ranks";
      }
    }
  }
  EXPECT_LE(r.rows[static_cast<std::size_t>(r.shortest_layered)].days,
            r.rows[static_cast<std::size_t>(r.shortest_standard)].days);
  // Far below the batch cap (a critical batch of 2.7M tokens, 2649 sequences, and at most
  // 256 devices), twice the devices are faster.
  double previous = INFINITY;
  for (const SweepRow& row : r.rows) {
    if (row.family != Family::standard || !row.feasible) continue;
    EXPECT_LT(row.days, previous) << row.ranks << " ranks";
    previous = row.days;
  }
  // Days = tokens / throughput.
  const SweepRow& best = r.rows[static_cast<std::size_t>(r.shortest_standard)];
  EXPECT_NEAR(best.days, 20e9 / best.tokens_per_s / 86400.0, 1e-9 * best.days);
}

}  // namespace
}  // namespace lamina::test
