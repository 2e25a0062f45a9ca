#pragma once
// The optimizer of every layer one rank holds, as the plan decides it: the owned elements
// and their subgroups, and for Deep Optimizer States layers which subgroups are updated on
// the device (the schedule of dos_scheduler.hpp, made once when the plan is applied). The
// runtime builds its optimizers and its update program from this; the memory estimate
// and the simulator read the same.
#include <cstdint>
#include <map>
#include <vector>

#include "lamina/memory/dos_scheduler.hpp"
#include "lamina/memory/optimizer_updaters.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/parallel/schedule.hpp"
#include "lamina/plan/plan.hpp"

namespace lamina {

// The Deep Optimizer States model of a plan; `concurrent` where host and device updates
// run at the same time (a device that is not the host).
DosModel dos_model(const Plan& plan);

struct RankOptimizers {
  std::map<int, LayerOptimizerSpec> layers;  // per held layer
  std::map<int, DosPlan> dos;                // per dynamic layer with owned elements
  std::int64_t dos_stage = 0;  // elements of each Deep Optimizer States staging buffer (0: none)

  // The update program's input: each layer's subgroups and sites.
  std::vector<LayerUpdate> updates() const;
  // Whether any subgroup is updated on the device through the staging.
  bool stages_on_device() const;
};

// device_free: bytes of device memory free for Deep Optimizer States staging at update
// time (negative: unknown, treated as enough).
RankOptimizers plan_rank_optimizers(const Plan& plan, const ParamLayout& layout, const std::vector<int>& held,
                                    int dp_rank, const DosModel& dos, std::int64_t device_free);

}  // namespace lamina
