#pragma once
// Runs a schedule on a cost model instead of hardware (DESIGN.md idea 3): every stage has
// a compute clock that each forward or backward advances by its cost; a message arrives
// at its sender's clock plus the transfer cost, and a receive waits for it. The result is
// the timeline the formulas in the papers describe (bubble fractions), deterministic on
// any machine. The executor keeps the same clock while it runs (messages carry the
// sender's time), so what is predicted here is what the run reports.
#include <map>
#include <vector>

#include "lamina/parallel/schedule.hpp"

namespace lamina {

struct CostModel {
  double forward_block = 1.0;   // one transformer block on one micro-batch
  double backward_block = 2.0;  // its backward (twice the products of the forward)
  double embedding = 0.0;       // the embedding's forward; its backward counts the same
  double head = 0.0;            // final norm, LM head and loss; backward twice
  double p2p = 0.0;             // one activation or gradient message
  std::map<int, int> recomputed;  // chunk -> blocks whose forward its backward repeats
};

// Compute cost of `op` (forward or backward) on chunk `c`.
double compute_cost(const Chunk& c, Op op, const CostModel& cost);

struct Timeline {
  std::vector<double> busy;    // compute time per stage
  std::vector<double> finish;  // clock per stage after its last instruction
  double makespan = 0.0;
  // Mean over stages of the time a stage waits: (makespan - busy) / makespan.
  double bubble_fraction() const;
};

// Throws std::logic_error when a receive has no matching send or the stages deadlock.
Timeline simulate(const Schedule& schedule, const CostModel& cost);

}  // namespace lamina
