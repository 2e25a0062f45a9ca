#pragma once
// A plan is data (docs/architecture.md, idea 4): how one step of a job runs. The parallel layout (dp,
// tp, pp, ZeRO stage, pipeline schedule, layered accumulation, micro-batches) and, per
// transformer block, what happens to its activations, where its parameters live and where
// its optimizer state is updated; plus the precision, the optimizer's subgroup size, the
// memory budgets and Deep Optimizer States' split. It comes from a deck (plan_from_deck,
// which checks every constraint and names the deck line to change) or, later, from the
// planner; the runtime, the memory estimate and the simulator all read only the plan.
#include <cstdint>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/core/deck.hpp"
#include "lamina/memory/dos_scheduler.hpp"
#include "lamina/parallel/layout.hpp"
#include "lamina/parallel/schedule.hpp"

namespace lamina {

struct MemoryBudget {
  std::int64_t device = 0;  // bytes per rank; 0: none
  std::int64_t host = 0;
};

// Deep Optimizer States: which subgroups of dynamic layers go to the device, and the
// performance model's inputs (0: measured at start-up where the model's split needs them).
struct DosSettings {
  DosSplit split = DosSplit::model;
  double host_rate = 0.0;    // host AdamW, parameters per second
  double device_rate = 0.0;  // device AdamW, parameters per second
  double h2d = 0.0;          // bytes per second each way
  double d2h = 0.0;
};

struct Plan {
  ParallelLayout layout;
  std::vector<LayerPolicy> blocks;  // one per transformer block
  Precision precision = Precision::fp32;
  Precision tp_sums = Precision::fp32;  // the tensor-parallel sums of the blocks' partial results
  std::int64_t subgroup_size = 1 << 22;  // elements per optimizer-state subgroup
  MemoryBudget budget;
  DosSettings dos;
  ClockPrices clock;  // the virtual clock's prices

  const LayerPolicy& layer(int l) const { return policy_of_layer(blocks, l); }
  bool any_optimizer(OptimizerPlacement p) const;
};

// The plan a deck describes. Every problem is reported at once, each as
// file:line:col: message (the deck line to change); world > 0 also checks that dp x tp x pp
// uses exactly that many ranks. Throws InputError.
Plan plan_from_deck(const Deck& deck, int world = 0);

// The precision of the tensor-parallel sums a deck asks for (parallel.tp_sums).
Precision tp_sum_precision(const Deck& deck);

// What one step of the plan runs (the schedule builders' input).
StepSpec step_spec(const Plan& plan, const ModelConfig& model);

// Readable, several lines: the layout, then the per-block policies with equal blocks in ranges.
std::string describe(const Plan& plan);
// One line, for checkpoints and logs: "dp=2 tp=1 pp=2 zero=3 schedule=modular ...".
std::string plan_summary(const Plan& plan);

}  // namespace lamina
