#pragma once
// The planner (H3T, Wang et al. NeurIPS'23, extended to tensor and pipeline parallelism,
// layered accumulation, modular pipelines and Deep Optimizer States): for a model, a batch,
// a number of ranks and a machine, the plan that trains fastest within each rank's memory.
//
// Outer search: every layout the deck leaves open (dp x tp x pp, ZeRO stage, micro-batch
// size, schedule with its virtual stages, layered or not), skipping those that cannot fit
// even with every memory saving on and those whose compute alone is slower than the best
// plan found so far. Inner solver, per pipeline stage: one choice per transformer block
// (activations keep/recompute/offload x parameters device/host x optimizer
// device/host/dynamic), each with the bytes it keeps in device and host memory and the
// time it adds to the stage's step (an additive model: compute, the part of its copies and
// collectives its own compute does not hide, its optimizer update); H3T's dynamic program
// keeps, block by block, the Pareto frontier of (device bytes, host bytes, time) and
// returns the fastest within budget. `greedy` (H3T's baseline: one choice on every k-th
// block) and `brute` (every combination, small models) solve the same problem.
// The best layouts' plans are then simulated exactly (the instruction lists the executor
// runs, priced by the cost model) and their memory estimated exactly; the fastest that
// fits wins.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lamina/core/deck.hpp"
#include "lamina/plan/cost_model.hpp"
#include "lamina/plan/memory_estimate.hpp"
#include "lamina/plan/plan.hpp"

namespace lamina {

enum class Solver { dp, greedy, brute };

// Which schedules the search may use: any; the standard ones (GPipe, 1F1B, interleaved
// 1F1B, depth-first accumulation); or those plus layered accumulation and modular pipelines.
enum class Family { any, standard, layered_modular };

struct PlannerOptions {
  int ranks = 1;
  Solver solver = Solver::dp;
  int top = 3;  // plans reported
  // Keys the search may choose (planner_keys() the deck leaves unset or "auto").
  std::vector<std::string> free_keys;
  std::vector<MeasuredCosts> measured;  // this machine's profiles
  Family family = Family::any;
  // > 0: the batch is not the deck's but, for each layout, the most sequences up to this
  // cap that its data-parallel ranks split evenly; plans then compete on tokens per second.
  std::int64_t batch_cap = 0;
  // Prove every returned plan race-free (plan/race_check.hpp). The training-time sweep, whose
  // plans are estimates nobody runs, leaves it off: a plan to run is checked when it is made.
  bool check_races = true;
  // Threads that model, solve and simulate layouts side by side (0: the cores this process
  // may use). The result does not depend on it.
  int threads = 0;
};

// One candidate: the plan, its predicted step and peak memory.
struct PlanCandidate {
  Plan plan;
  double step_s = 0.0;        // simulated step: forward/backward of the slowest stage + optimizer
  double update_s = 0.0;      // the optimizer program's share
  double bubble = 0.0;        // the pipeline's idle fraction with only compute taking time
  double idle = 0.0;          // the compute's idle fraction in the full simulation (bubble, exposed copies and collectives)
  double solver_objective = 0.0;  // the inner solver's additive estimate
  MemoryEstimate memory;      // exact estimate, the largest stage
  std::int64_t device_bytes = 0, host_bytes = 0;
  std::vector<std::string> sets;  // the deck overrides that give this plan
  std::map<std::string, double> traffic;  // bytes the first stage's ranks send per step, by group (dp, tp, pp)
  std::size_t checked_instructions = 0;  // proved race-free (plan/race_check.hpp) before it was returned
};

struct PlanResult {
  bool feasible = false;
  std::vector<PlanCandidate> best;  // fastest first
  double solve_s = 0.0;
  double model_s = 0.0, inner_s = 0.0;  // of solve_s: modelling every layout, the inner solver
  std::int64_t layouts_considered = 0, layouts_pruned = 0, layouts_solved = 0;
  // Infeasible: the least device and host memory any layout needs (every saving on), and
  // which knob helps most.
  std::int64_t min_device_bytes = 0, min_host_bytes = 0;
  std::string advice;
  double capacity_device = 0.0, capacity_host = 0.0;  // per rank
  // No layout of the ranks splits the model and batch (none considered): the nearest rank
  // counts, at most 8, for which one does.
  std::vector<int> ranks_with_layouts;
};

// Why no layout of `ranks` exists, for a PlanResult with none considered: the rules a layout
// must meet, with the values the deck fixes, and the rank counts that have layouts.
std::string no_layout_message(const Deck& deck, const MachineSpec& machine, const PlannerOptions& options,
                              const PlanResult& r);

PlanResult plan_search(const Deck& deck, const MachineSpec& machine, const PlannerOptions& options);

// ---- The per-stage problem, exposed for tests and for the solvers' comparison ----

// One block's choice with what it costs on its stage.
struct BlockChoice {
  LayerPolicy policy;
  double device_bytes = 0.0, host_bytes = 0.0, seconds = 0.0;
};
// The blocks of one stage, each with its choices; budgets for what the blocks may add.
struct StageProblem {
  std::vector<std::vector<BlockChoice>> blocks;
  double device_budget = 0.0, host_budget = 0.0;  // <= 0: none
};
struct StageSolution {
  bool feasible = false;
  std::vector<int> choice;  // per block, an index into its choices
  double seconds = 0.0, device_bytes = 0.0, host_bytes = 0.0;
};
// The dynamic program over blocks with Pareto frontiers (exact while a frontier has at most
// `max_frontier` points, then merged into memory buckets as H3T does).
StageSolution solve_dp(const StageProblem& p, std::size_t max_frontier = 1024);
StageSolution solve_greedy(const StageProblem& p);
// No choice of the stage's blocks is faster (the linear relaxation over device memory, host
// memory left out): the search's bound, which prunes a layout before it is solved.
double stage_lower_bound(const StageProblem& p);
StageSolution solve_brute(const StageProblem& p);

// Whether the search considers context-parallel degree cp for model m: its ring runs the fused
// attention kernels or staged products (not in place), on chunks (seq_len / 2 cp positions) of
// at least one fused block (smaller ones would leave the blocks partly empty).
bool searched_context_parallel(const ModelConfig& m, int cp);

const char* solver_name(Solver s);

}  // namespace lamina
