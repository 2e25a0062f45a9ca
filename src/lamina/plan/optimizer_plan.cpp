#include "lamina/plan/optimizer_plan.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>

#include "lamina/parallel/shard.hpp"

namespace lamina {

DosModel dos_model(const Plan& plan) {
  DosModel d;
  d.host_rate = plan.dos.host_rate;
  d.device_rate = plan.dos.device_rate;
  d.h2d = plan.dos.h2d;
  d.d2h = plan.dos.d2h;
  d.concurrent = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible;
  return d;
}

std::vector<LayerUpdate> RankOptimizers::updates() const {
  std::vector<LayerUpdate> out;
  for (const auto& [l, spec] : layers) {
    LayerUpdate u;
    u.layer = l;
    u.placement = spec.placement;
    switch (spec.placement) {
      case OptimizerPlacement::device: u.sites.assign(spec.subgroups.size(), UpdateSite::device); break;
      case OptimizerPlacement::host: u.sites.assign(spec.subgroups.size(), UpdateSite::host); break;
      case OptimizerPlacement::dynamic: u.sites = spec.sites; break;
    }
    out.push_back(u);
  }
  return out;
}

bool RankOptimizers::stages_on_device() const {
  for (const auto& [l, spec] : layers)
    if (spec.placement == OptimizerPlacement::dynamic &&
        std::count(spec.sites.begin(), spec.sites.end(), UpdateSite::device) > 0)
      return true;
  return false;
}

RankOptimizers plan_rank_optimizers(const Plan& plan, const ParamLayout& layout, const std::vector<int>& held,
                                    int dp_rank, const DosModel& dos, std::int64_t device_free) {
  RankOptimizers r;
  const bool bf16 = plan.precision == Precision::bf16;
  const int zero = plan.layout.zero;
  for (int l : held) {
    const LayerSpec& ls = layout.layers()[static_cast<std::size_t>(l)];
    const LayerPolicy& policy = plan.layer(l);
    const LayerShard shard = LayerShard::of(ls.numel, plan.layout.replicas(), bf16);
    LayerOptimizerSpec s;
    s.layer = l;
    s.matrix_numel = ls.matrix_numel;
    s.begin = shard.owned_begin(dp_rank, zero);
    s.end = shard.owned_end(dp_rank, zero);
    s.owned_size = shard.owned_size(zero);
    if (s.end > s.begin) s.subgroups = layout.subgroups(l, s.begin, s.end, plan.subgroup_size);
    s.placement = policy.optimizer;
    s.params = policy.params;
    s.bf16 = bf16;
    if (s.placement == OptimizerPlacement::dynamic) {
      // One staging size for every layer, so that the pool keeps just one set.
      if (s.end > s.begin) r.dos_stage = std::max(r.dos_stage, std::min(plan.subgroup_size, s.end - s.begin));
      std::vector<std::int64_t> sizes;
      for (const Subgroup& g : s.subgroups) sizes.push_back(g.end - g.begin);
      const DosPlan p = plan_dos(sizes, dos, device_free, plan.dos.split);
      s.sites = p.site;
      if (!sizes.empty()) r.dos[l] = p;
    }
    r.layers[l] = s;
  }
  return r;
}

}  // namespace lamina
