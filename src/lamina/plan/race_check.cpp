#include "lamina/plan/race_check.hpp"

#include "lamina/parallel/hazards.hpp"
#include "lamina/plan/optimizer_plan.hpp"

namespace lamina {

RaceCheck check_races(const Plan& plan, const ModelConfig& model, const Schedule& schedule) {
  const ParamLayout layout = ParamLayout::of(model, plan.layout.tp, 0);
  std::vector<std::vector<Instruction>> updates;
  RaceCheck r;
  r.stages = schedule.stages();
  for (int s = 0; s < schedule.stages(); ++s) {
    const RankOptimizers ro = plan_rank_optimizers(plan, layout, schedule.layers_of_stage(s), 0, dos_model(plan), -1);
    updates.push_back(update_program(ro.updates(), plan.layout.zero));
    r.instructions += schedule.program(s).size() + updates.back().size();
  }
  check_hazards(schedule, updates);
  return r;
}

}  // namespace lamina
