#pragma once
// Proves a plan's instruction lists race-free before anything runs (parallel/hazards.hpp):
// every pipeline stage's step program, with the optimizer program of its first
// data-parallel rank. `lamina train --check`, `lamina plan` and the planner (for every plan
// it returns) run it; a hazard is a bug of the schedule builders, not of the deck.
#include <cstddef>

#include "lamina/core/config.hpp"
#include "lamina/parallel/schedule.hpp"
#include "lamina/plan/plan.hpp"

namespace lamina {

struct RaceCheck {
  int stages = 0;
  std::size_t instructions = 0;  // checked, over the stages' step and optimizer programs
};

// Throws std::logic_error naming the first hazards found.
RaceCheck check_races(const Plan& plan, const ModelConfig& model, const Schedule& schedule);

}  // namespace lamina
