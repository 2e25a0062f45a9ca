// The planner's solvers on the per-stage problem (the dynamic program equals brute force
// on every budget; greedy, H3T's baseline, is never faster), and the search on small
// decks: plans that fit, keys the deck fixes respected, and infeasible problems explained.
#include "lamina/plan/planner.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "lamina/core/deck.hpp"
#include "lamina/core/error.hpp"
#include "lamina/plan/machine.hpp"

namespace lamina::test {
namespace {

// A stage of n blocks whose choices are every policy of the planner, with bytes and times
// from the cost model of a small GPT on the DGX A100 description written below.
const char* kMachine = R"(name = "test machine"
[device]
per_node = 4
memory = "16GiB"
peak_tflops_fp32 = 10
peak_tflops_bf16 = 100
memory_bandwidth = "1TB"
[host]
memory = "256GiB"
memory_bandwidth = "200GB"
adamw_params_per_s = 2e9
[links]
h2d = "20GB"
d2h = "20GB"
[network]
intra_node_bandwidth = "100GB"
intra_node_latency = 5e-6
inter_node_bandwidth = "10GB"
inter_node_latency = 1e-5
)";

const char* kDeck = R"([model]
layers = 8
d_model = 1024
heads = 16
seq_len = 512
vocab_size = 8192
[data]
format = "synthetic"
batch_size = 16
[train]
steps = 1
[checkpoint]
save_final = false
)";

// Blocks with distinct, hand-made choices: each (device bytes, host bytes, seconds).
StageProblem handmade(int blocks) {
  StageProblem p;
  const double choices[][3] = {{8, 0, 1.0}, {4, 2, 1.5}, {2, 4, 2.5}, {1, 6, 4.0}, {6, 1, 1.2}};
  for (int b = 0; b < blocks; ++b) {
    std::vector<BlockChoice> cs;
    for (const auto& c : choices) {
      BlockChoice x;
      x.device_bytes = c[0] + b;  // blocks differ a little
      x.host_bytes = c[1];
      x.seconds = c[2] * (1.0 + 0.1 * b);
      cs.push_back(x);
    }
    p.blocks.push_back(cs);
  }
  return p;
}

TEST(Planner, DynamicProgramEqualsBruteForceOnEveryBudget) {
  for (int blocks : {1, 2, 3}) {
    for (double dev = 2; dev <= 30; dev += 1) {
      for (double host : {0.0, 3.0, 6.0, 12.0}) {
        StageProblem p = handmade(blocks);
        p.device_budget = dev;
        p.host_budget = host;
        const StageSolution dp = solve_dp(p), brute = solve_brute(p), greedy = solve_greedy(p);
        ASSERT_EQ(dp.feasible, brute.feasible) << blocks << " blocks, budget " << dev << "/" << host;
        if (!brute.feasible) continue;
        EXPECT_DOUBLE_EQ(dp.seconds, brute.seconds) << blocks << " blocks, budget " << dev << "/" << host;
        EXPECT_LE(dp.device_bytes, dev);
        if (host > 0) {
          EXPECT_LE(dp.host_bytes, host);
        }
        if (greedy.feasible) {
          EXPECT_LE(dp.seconds, greedy.seconds);
        }
      }
    }
  }
}

// The bound that prunes layouts before they are solved is never above the best plan's time
// (the linear relaxation over device memory), equals it where memory does not bind, and is
// infinite where the least memory does not fit.
TEST(Planner, TheStageBoundIsNeverAboveTheBestPlan) {
  for (int blocks : {1, 2, 3}) {
    for (double dev = 2; dev <= 30; dev += 0.5) {
      for (double host : {0.0, 6.0}) {
        StageProblem p = handmade(blocks);
        p.device_budget = dev;
        p.host_budget = host;
        const StageSolution brute = solve_brute(p);
        const double bound = stage_lower_bound(p);
        if (!brute.feasible) {
          if (std::isfinite(bound)) continue;  // host memory alone rules it out
          EXPECT_GT(blocks + 0.5 * blocks * (blocks - 1), dev) << blocks << " blocks, budget " << dev;
          continue;
        }
        EXPECT_LE(bound, brute.seconds * (1 + 1e-12)) << blocks << " blocks, budget " << dev << "/" << host;
      }
    }
    StageProblem roomy = handmade(blocks);
    EXPECT_DOUBLE_EQ(stage_lower_bound(roomy), solve_brute(roomy).seconds);  // no budget
  }
  // One block whose hull runs from 4 bytes in 1.5 s to 6 bytes in 1.2 s: 5 bytes buy half the
  // 0.3 s.
  StageProblem half = handmade(1);
  half.device_budget = 5;
  EXPECT_NEAR(stage_lower_bound(half), 1.35, 1e-15);
}

TEST(Planner, SolversAgreeOnTheChoicesOfARealModel) {
  // The search's own per-stage problems, through its solvers, for 1, 2 and 3 blocks per
  // stage: the plans brute force and the dynamic program pick are equally fast.
  const MachineSpec machine = parse_machine(kMachine, "<test>");
  for (const int layers : {2, 3}) {
    const Deck deck = parse_deck(kDeck, "deck.toml", {"model.layers=" + std::to_string(layers)});
    PlannerOptions o;
    o.ranks = 2;
    o.top = 1;
    o.free_keys = planner_keys();
    o.solver = Solver::dp;
    const PlanResult dp = plan_search(deck, machine, o);
    o.solver = Solver::brute;
    const PlanResult brute = plan_search(deck, machine, o);
    ASSERT_TRUE(dp.feasible);
    ASSERT_TRUE(brute.feasible);
    EXPECT_NEAR(dp.best[0].solver_objective, brute.best[0].solver_objective, 1e-12 * brute.best[0].solver_objective);
  }
}

TEST(Planner, PlansFitAndRespectTheKeysTheDeckSets) {
  const MachineSpec machine = parse_machine(kMachine, "<test>");
  const Deck deck = parse_deck(kDeck, "deck.toml", {"parallel.tp=2", "memory.activations=recompute"});
  PlannerOptions o;
  o.ranks = 4;
  o.top = 3;
  for (const std::string& k : planner_keys())
    if (!deck.sets(k)) o.free_keys.push_back(k);
  const PlanResult r = plan_search(deck, machine, o);
  ASSERT_TRUE(r.feasible);
  for (const PlanCandidate& c : r.best) {
    EXPECT_EQ(c.plan.layout.tp, 2);
    EXPECT_EQ(c.plan.layout.ranks(), 4);
    for (const LayerPolicy& b : c.plan.blocks) EXPECT_EQ(b.activations, ActivationPolicy::recompute);
    EXPECT_LE(static_cast<double>(c.device_bytes), machine.device_memory);
    EXPECT_GT(c.step_s, 0.0);
    EXPECT_GT(c.checked_instructions, 0u);  // proved race-free before it was priced
  }
  for (std::size_t i = 1; i < r.best.size(); ++i) EXPECT_LE(r.best[i - 1].step_s, r.best[i].step_s);
  // The overrides give the plan back.
  std::vector<std::string> sets = {"parallel.tp=2", "memory.activations=recompute"};
  sets.insert(sets.end(), r.best[0].sets.begin(), r.best[0].sets.end());
  const Plan again = plan_from_deck(parse_deck(kDeck, "deck.toml", sets), 4);
  EXPECT_EQ(plan_summary(again), plan_summary(r.best[0].plan));
}

// Layered accumulation over many micro-batches keeps every micro-batch's checkpoints; where
// they do not fit on the device, the planner sends them to the host tier if the host link
// keeps up with the compute, and finds another plan where it does not.
TEST(Planner, OffloadsCheckpointsWhereTheHostLinkKeepsUp) {
  MachineSpec machine = parse_machine(kMachine, "<test>");
  machine.device_memory = 4.5 * (1 << 30);
  const Deck deck = parse_deck(kDeck, "deck.toml", {"data.batch_size=64", "train.precision=\"bf16\"",
                                                     "parallel.layered=true"});
  PlannerOptions o;
  o.ranks = 1;
  o.top = 1;
  for (const std::string& k : planner_keys())
    if (!deck.sets(k)) o.free_keys.push_back(k);
  auto offloaded = [](const PlanCandidate& c) {
    int n = 0;
    for (const LayerPolicy& b : c.plan.blocks) n += b.activations == ActivationPolicy::offload_checkpoint;
    return n;
  };
  const PlanResult fast = plan_search(deck, machine, o);
  ASSERT_TRUE(fast.feasible);
  EXPECT_GT(offloaded(fast.best[0]), 0) << plan_summary(fast.best[0].plan);
  machine.h2d = machine.d2h = 1e6;  // 1 MB/s: a checkpoint takes seconds to move
  const PlanResult slow = plan_search(deck, machine, o);
  ASSERT_TRUE(slow.feasible);
  // Every block offloads where the link keeps up; over a slow one a few, where freeing their
  // device memory keeps optimizer state on the device, off the link, and its updates run
  // beside the host's (the simulation finds three offloaded blocks with three layers'
  // state on the device faster than none: 474.5 against 507.4 s).
  EXPECT_EQ(offloaded(fast.best[0]), deck.model.layers) << plan_summary(fast.best[0].plan);
  EXPECT_LE(offloaded(slow.best[0]), 3) << plan_summary(slow.best[0].plan);
  EXPECT_GT(slow.best[0].step_s, fast.best[0].step_s);
}

// Sequence parallelism divides the stream's activations by tp: on a device a byte short of
// keeping every block's activations without it, the search chooses it (and its deck override
// says so).
TEST(Planner, ChoosesSequenceParallelismWhereItsActivationsFitAlone) {
  MachineSpec machine = parse_machine(kMachine, "<test>");
  const std::vector<std::string> fixed = {"parallel.tp=4", "parallel.dp=1", "parallel.pp=1",
                                          "data.micro_batch_size=16", "memory.activations=keep",
                                          "memory.params=device", "memory.optimizer=device"};
  PlannerOptions o;
  o.ranks = 4;
  o.top = 1;
  o.free_keys = {"parallel.sequence_parallel"};
  auto best = [&](const std::string& sp) {
    std::vector<std::string> sets = fixed;
    if (!sp.empty()) sets.push_back("parallel.sequence_parallel=" + sp);
    PlannerOptions fixed_sp = o;
    if (!sp.empty()) fixed_sp.free_keys.clear();
    return plan_search(parse_deck(kDeck, "deck.toml", sets), machine, fixed_sp);
  };
  const PlanResult all_rows = best("false"), shards = best("true");
  ASSERT_TRUE(all_rows.feasible);
  ASSERT_TRUE(shards.feasible);
  const double without = static_cast<double>(all_rows.best[0].device_bytes);
  const double with = static_cast<double>(shards.best[0].device_bytes);
  ASSERT_LT(with, without);
  machine.device_memory = without - 1;
  const PlanResult r = best("");
  ASSERT_TRUE(r.feasible);
  EXPECT_TRUE(r.best[0].plan.layout.sequence_parallel);
  EXPECT_EQ(r.best[0].device_bytes, shards.best[0].device_bytes);
  EXPECT_NE(std::find(r.best[0].sets.begin(), r.best[0].sets.end(), "parallel.sequence_parallel=true"),
            r.best[0].sets.end());
}

// Context parallelism where a sequence's activations do not fit one rank: over 4 ranks with
// everything else fixed (dp 1, no tensor parallelism), only cp 4 fits a device that cp 2 does
// not, and the search finds it among cp 1, 2 and 4.
TEST(Planner, ChoosesContextParallelismWhereOnlyItFits) {
  MachineSpec machine = parse_machine(kMachine, "<test>");
  const std::vector<std::string> fixed = {"parallel.tp=1", "parallel.pp=1", "data.micro_batch_size=4",
                                          "model.attention=fused", "memory.activations=keep",
                                          "memory.params=device", "memory.optimizer=device"};
  PlannerOptions o;
  o.ranks = 4;
  o.top = 1;
  o.free_keys = {"parallel.cp", "parallel.dp"};
  auto best = [&](int cp) {
    std::vector<std::string> sets = fixed;
    sets.push_back("parallel.cp=" + std::to_string(cp));
    sets.push_back("parallel.dp=" + std::to_string(4 / cp));
    PlannerOptions fixed_cp = o;
    fixed_cp.free_keys.clear();
    return plan_search(parse_deck(kDeck, "deck.toml", sets), machine, fixed_cp);
  };
  const PlanResult two = best(2), four = best(4);
  ASSERT_TRUE(two.feasible);
  ASSERT_TRUE(four.feasible);
  ASSERT_LT(four.best[0].device_bytes, two.best[0].device_bytes);
  machine.device_memory = static_cast<double>(two.best[0].device_bytes) - 1;
  const PlanResult r = plan_search(parse_deck(kDeck, "deck.toml", fixed), machine, o);
  ASSERT_TRUE(r.feasible);
  EXPECT_EQ(r.best[0].plan.layout.cp, 4);
  EXPECT_EQ(r.best[0].plan.layout.dp, 1);
  EXPECT_EQ(r.best[0].device_bytes, four.best[0].device_bytes);
  EXPECT_NE(std::find(r.best[0].sets.begin(), r.best[0].sets.end(), "parallel.cp=4"), r.best[0].sets.end());
  // Chunks of seq_len / 2 cp positions below one block of the fused kernels are not searched.
  EXPECT_TRUE(searched_context_parallel(parse_deck(kDeck, "deck.toml", {}).model, 8));
  EXPECT_FALSE(searched_context_parallel(parse_deck(kDeck, "deck.toml", {}).model, 16));
  EXPECT_TRUE(searched_context_parallel(parse_deck(kDeck, "deck.toml", {"model.attention=staged"}).model, 2));
  EXPECT_FALSE(searched_context_parallel(parse_deck(kDeck, "deck.toml", {"model.attention=in_place"}).model, 2));
}

// Layouts are modelled, solved and simulated on several threads, the bound pruning them
// as one thread would: the same plans, figures and counts whatever the thread count.
TEST(Planner, TheSearchIsTheSameOnAnyNumberOfThreads) {
  const MachineSpec machine = parse_machine(kMachine, "<test>");
  const Deck deck = parse_deck(kDeck, "deck.toml", {"data.batch_size=32"});
  PlannerOptions o;
  o.ranks = 8;
  o.top = 3;
  o.free_keys = planner_keys();
  o.threads = 1;
  const PlanResult one = plan_search(deck, machine, o);
  ASSERT_TRUE(one.feasible);
  ASSERT_GT(one.layouts_pruned, 0);  // the bound is at work
  for (const int threads : {2, 5}) {
    o.threads = threads;
    const PlanResult r = plan_search(deck, machine, o);
    EXPECT_EQ(r.layouts_considered, one.layouts_considered);
    EXPECT_EQ(r.layouts_pruned, one.layouts_pruned);
    EXPECT_EQ(r.layouts_solved, one.layouts_solved);
    ASSERT_EQ(r.best.size(), one.best.size());
    for (std::size_t i = 0; i < r.best.size(); ++i) {
      EXPECT_EQ(plan_summary(r.best[i].plan), plan_summary(one.best[i].plan)) << threads << " threads, plan " << i;
      EXPECT_EQ(r.best[i].step_s, one.best[i].step_s);
      EXPECT_EQ(r.best[i].device_bytes, one.best[i].device_bytes);
      EXPECT_EQ(r.best[i].checked_instructions, one.best[i].checked_instructions);
    }
  }
}

// The additive model ranks layouts before the few exact simulations, so what it leaves out
// decides which layouts those get: GPT-3 175B over slow and fast networks, ZeRO 1 and 3,
// standard and layered pipelines, each within a tenth of its simulated step. (It left out
// ZeRO's shares of the updated parameters, the first stage's fetches before its first
// block and reductions after its last, the messages between stages, and counted a layered
// block's collectives hidden by one micro-batch where every micro-batch hides them: these
// simulations were 0.66-1.22 of its estimates.)
TEST(Planner, TheAdditiveEstimateIsWithinATenthOfTheSimulation) {
  struct Case {
    const char* machine;
    int ranks, tp, pp, zero;
    const char* schedule;  // modular runs layered
  };
  const std::vector<Case> cases = {
      {"dgx-a100-80gb-25gbe", 65536, 8, 32, 1, "gpipe"}, {"dgx-a100-80gb-25gbe", 32768, 8, 16, 1, "modular"},
      {"dgx-a100-80gb-25gbe", 32768, 8, 16, 3, "modular"}, {"dgx-a100-80gb", 4096, 4, 4, 3, "modular"},
      {"paper-a100", 65536, 8, 16, 0, "modular"}, {"paper-a100", 32768, 8, 32, 1, "1f1b"},
  };
  const std::string inputs = std::string(LAMINA_SOURCE_DIR) + "/inputs/";
  for (const Case& c : cases) {
    const MachineSpec machine = load_machine(inputs + "machines/" + c.machine + ".toml");
    const std::string schedule = c.schedule;
    // The memory policies are the search's.
    const std::vector<std::string> sets = {
        "data.batch_size=6912", "data.micro_batch_size=1", "parallel.sequence_parallel=true",
        "parallel.tp=" + std::to_string(c.tp), "parallel.pp=" + std::to_string(c.pp),
        "parallel.zero=" + std::to_string(c.zero), "parallel.schedule=" + schedule,
        std::string("parallel.layered=") + (schedule == "modular" ? "true" : "false")};
    const Deck deck = load_deck(inputs + "gpt3-175b.toml", sets);
    PlannerOptions o;
    o.ranks = c.ranks;
    o.top = 1;
    o.check_races = false;
    for (const std::string& k : planner_keys())
      if (!deck.sets(k)) o.free_keys.push_back(k);
    const PlanResult r = plan_search(deck, machine, o);
    ASSERT_TRUE(r.feasible) << c.machine << " " << c.ranks;
    const PlanCandidate& best = r.best[0];
    EXPECT_NEAR(best.step_s / best.solver_objective, 1.0, 0.1)
        << c.machine << ", " << plan_summary(best.plan) << ": simulated " << best.step_s << " s, estimated "
        << best.solver_objective << " s";
  }
}

// With several chunks per stage a chunk's gradients are whole a group of pp micro-batches
// before the next chunk's: the cooldown hides the reductions that one micro-batch's backward
// per block would not (estimated 0.91 of the simulation when priced so).
TEST(Planner, AnInterleavedStepsReductionsHideBehindTheNextChunksMicroBatches) {
  const std::string inputs = std::string(LAMINA_SOURCE_DIR) + "/inputs/";
  const MachineSpec machine = load_machine(inputs + "machines/paper-a100.toml");
  const Deck deck = load_deck(inputs + "gpt3-175b.toml",
                              {"data.batch_size=6144", "data.micro_batch_size=3", "parallel.dp=1024", "parallel.cp=2",
                               "parallel.tp=8", "parallel.pp=2", "parallel.zero=1", "parallel.schedule=interleaved",
                               "parallel.virtual_stages=8", "parallel.layered=false",
                               "parallel.sequence_parallel=true"});
  PlannerOptions o;
  o.ranks = 32768;
  o.top = 1;
  o.check_races = false;
  for (const std::string& k : planner_keys())
    if (!deck.sets(k)) o.free_keys.push_back(k);
  const PlanResult r = plan_search(deck, machine, o);
  ASSERT_TRUE(r.feasible);
  const PlanCandidate& best = r.best[0];
  EXPECT_NEAR(best.step_s / best.solver_objective, 1.0, 0.05)
      << plan_summary(best.plan) << ": simulated " << best.step_s << " s, estimated " << best.solver_objective << " s";
}

TEST(Planner, AModelThatCannotFitIsExplained) {
  MachineSpec machine = parse_machine(kMachine, "<test>");
  machine.device_memory = 64.0 * (1 << 20);  // 64 MiB devices
  machine.host_memory = 4 * 128.0 * (1 << 20);
  const Deck deck = parse_deck(kDeck, "deck.toml");
  PlannerOptions o;
  o.ranks = 1;
  o.free_keys = planner_keys();
  const PlanResult r = plan_search(deck, machine, o);
  EXPECT_FALSE(r.feasible);
  EXPECT_GT(r.min_device_bytes, static_cast<std::int64_t>(machine.device_memory));
  EXPECT_NE(r.advice.find("more ranks"), std::string::npos) << r.advice;
}

}  // namespace
}  // namespace lamina::test
