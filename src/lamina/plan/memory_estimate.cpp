#include "lamina/plan/memory_estimate.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <set>

#include "lamina/core/buffer.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/memory_tracker.hpp"
#include "lamina/model/gpt_activations.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/parallel/grad_reducer.hpp"
#include "lamina/parallel/param_store.hpp"
#include "lamina/plan/optimizer_plan.hpp"
#include "lamina/plan/simulator.hpp"

namespace lamina {

std::int64_t MemoryEstimate::total(const std::string& space) const {
  std::int64_t t = 0;
  const auto it = bytes.find(space);
  if (it != bytes.end())
    for (const auto& kv : it->second) t += kv.second;
  return t;
}

RunExtras RunExtras::of(const CheckpointConfig& checkpoint, const OutputConfig& output) {
  RunExtras e;
  e.checkpoints = checkpoint.every > 0 || checkpoint.save_final;
  e.sample = output.sample_tokens > 0;
  return e;
}

namespace {

using Bytes = std::map<std::string, std::map<std::string, std::int64_t>>;  // space -> category -> bytes

// What one rank of pipeline stage `stage` allocates. device_free: for the Deep Optimizer
// States schedule (see dos_device_free).
Bytes stage_bytes(const ModelConfig& m, const Plan& plan, const RunExtras& extras, const Schedule& schedule,
                  int stage, std::int64_t device_free) {
  const ParallelLayout& o = plan.layout;
  const bool bf16 = plan.precision == Precision::bf16;
  const ParamLayout layout = ParamLayout::gpt2(m, o.tp, 0);
  const std::vector<int> held = schedule.layers_of_stage(stage);
  const RankOptimizers opt = plan_rank_optimizers(plan, layout, held, 0, dos_model(plan), device_free);

  // Buffers that live the whole run, from the functions their owners size them with.
  std::int64_t params = 0, grads = 0, moments = 0, host_params = 0, host_grads = 0, host_moments = 0;
  for (int l : held) {
    const LayerShard s = LayerShard::of(layout.layers()[static_cast<std::size_t>(l)].numel, o.dp, bf16);
    const StoredParams p = StoredParams::of(s, plan.layer(l), o.zero, plan.precision);
    params += 4 * p.device_fp32 + 2 * p.device_bf16;
    host_params += 4 * p.host_fp32 + 2 * p.host_bf16 + 2 * p.host_rounded;
    const StoredGrads g = StoredGrads::of(s, o.zero);
    grads += 4 * (g.full + g.shard);
    const OptimizerBuffers b = OptimizerBuffers::of(s.owned_size(o.zero), plan.layer(l).optimizer, plan.layer(l).params, bf16);
    moments += 4 * (b.device_m + b.device_v + b.device_master);
    host_moments += 4 * (b.host_m + b.host_v + b.host_master);
    host_grads += 4 * b.host_grads;
  }

  // Buffers that live part of a step: the pools' peaks as the simulator replays the step,
  // the update and a checkpoint.
  MemoryModel mm;
  mm.zero = o.zero;
  mm.bf16 = bf16;
  mm.dos_stage = opt.dos_stage;
  mm.checkpoint = extras.checkpoints;
  for (int l : held) {
    MemoryModel::Layer x;
    x.shard = LayerShard::of(layout.layers()[static_cast<std::size_t>(l)].numel, o.dp, bf16);
    x.resident = resident_params(schedule.spec(), l);
    x.tier = plan.layer(l).params;
    x.dynamic = plan.layer(l).optimizer == OptimizerPlacement::dynamic;
    mm.layers[l] = x;
  }
  const PoolPeaks pools = simulate_memory(schedule, stage, update_program(opt.updates(), o.zero), mm);
  params += pools.params;
  grads += pools.grads;
  moments += pools.dos;
  const std::int64_t comm = pools.communication;

  // Activations: one LayerRangeActs per chunk and micro-batch in flight, the executor's
  // scratch and staging, the workspace.
  Dims d = Dims::of(m, o.micro_batch_size, o.tp, 0);
  d.bf16 = bf16;
  const ActivationSizes a = activation_sizes(d);
  using Acts = LayerRangeActs<Kokkos::DefaultExecutionSpace>;
  std::int64_t acts = 0, host_acts = 0;
  bool scratch = false, offload = false;
  const Partition& part = schedule.partition();
  for (int c : part.chunks_of(stage)) {
    const Chunk& k = part.chunk(c);
    std::int64_t kept = 0, offloaded = 0;
    for (std::int64_t b = k.first_block; b < k.last_block; ++b) {
      const ActivationPolicy p = plan.blocks[static_cast<std::size_t>(b)].activations;
      kept += p == ActivationPolicy::keep;
      offloaded += p == ActivationPolicy::offload;
      scratch = scratch || p == ActivationPolicy::recompute || (bf16 && p != ActivationPolicy::recompute);
      offload = offload || p == ActivationPolicy::offload;
    }
    const std::int64_t slots = schedule.max_in_flight(c);
    const bool own_dres = o.layered;  // depth-first chunks share one residual-gradient buffer
    acts += slots * Acts::bytes(a, k.blocks(), kept, k.head, own_dres, bf16) + (own_dres ? 0 : 4 * a.boundary);
    host_acts += (bf16 ? 2 : 4) * slots * offloaded * a.inner;
  }
  if (scratch) acts += 4 * a.inner;                   // where a recomputed or bf16-stored block runs
  if (offload) acts += (bf16 ? 2 : 4) * 2 * a.inner;  // staging for offloaded blocks, double-buffered
  std::int64_t ws = a.workspace + a.ones;
  if (extras.sample) {  // a one-sequence replica for the text sample at the end (fp32 activations)
    Dims one = Dims::of(m, 1);
    one.bf16 = bf16;
    const ActivationSizes s = activation_sizes(one);
    acts += Acts::bytes(s, m.layers, m.layers, true, true, false);
    ws += s.workspace + s.ones;
  }

  Bytes out;
  auto& dev = out[tier_label(MemTier::device)];
  dev[mem_category_name(MemCategory::parameters)] = params;
  dev[mem_category_name(MemCategory::gradients)] = grads;
  if (moments > 0) dev[mem_category_name(MemCategory::optimizer_state)] = moments;
  dev[mem_category_name(MemCategory::activations)] = acts;
  dev[mem_category_name(MemCategory::workspace)] = 4 * ws;
  if (comm > 0) dev[mem_category_name(MemCategory::communication)] = comm;
  auto put_host = [&](MemCategory c, std::int64_t bytes) {
    if (bytes > 0) out[tier_label(MemTier::host)][mem_category_name(c)] = bytes;
  };
  put_host(MemCategory::activations, host_acts);
  put_host(MemCategory::parameters, host_params);
  put_host(MemCategory::gradients, host_grads);
  put_host(MemCategory::optimizer_state, host_moments);
  return out;
}

std::int64_t device_total(const Bytes& b) {
  std::int64_t t = 0;
  const auto it = b.find(tier_label(MemTier::device));
  if (it != b.end())
    for (const auto& kv : it->second) t += kv.second;
  return t;
}

std::int64_t free_for_dos(const ModelConfig& m, const Plan& plan, const RunExtras& extras, const Schedule& schedule,
                          int stage) {
  if (plan.budget.device <= 0) return -1;
  // Everything else, with no subgroup staged on the device.
  Plan home = plan;
  home.dos.split = DosSplit::all_host;
  return plan.budget.device - device_total(stage_bytes(m, home, extras, schedule, stage, -1));
}

}  // namespace

MemoryEstimate estimate_memory(const ModelConfig& model, const Plan& plan, const RunExtras& extras) {
  const Schedule schedule = Schedule::build(step_spec(plan, model));
  MemoryEstimate e;
  std::int64_t worst = -1;
  for (int s = 0; s < schedule.stages(); ++s) {
    Bytes b = stage_bytes(model, plan, extras, schedule, s, free_for_dos(model, plan, extras, schedule, s));
    std::int64_t total = 0;
    for (const auto& [space, cats] : b)
      for (const auto& kv : cats) total += kv.second;
    if (total > worst) {
      worst = total;
      e.bytes = b;
      e.stage = s;
    }
  }
  return e;
}

MemoryEstimate estimate_memory(const ModelConfig& model, const Plan& plan, const RunExtras& extras, int stage) {
  const Schedule schedule = Schedule::build(step_spec(plan, model));
  MemoryEstimate e;
  e.bytes = stage_bytes(model, plan, extras, schedule, stage, free_for_dos(model, plan, extras, schedule, stage));
  e.stage = stage;
  return e;
}

std::int64_t dos_device_free(const ModelConfig& model, const Plan& plan, const RunExtras& extras, int stage) {
  return free_for_dos(model, plan, extras, Schedule::build(step_spec(plan, model)), stage);
}

namespace {

constexpr const char* kWhatHelps =
    "  what helps: memory.activations = \"recompute\" or \"offload\" (activations; they also scale with "
    "data.micro_batch_size), memory.params = \"host\", memory.optimizer = \"host\" or \"dynamic\", "
    "train.precision = \"bf16\" (stored parameters and activations), parallel.zero, tp and pp (parameters, "
    "gradients, optimizer state); `lamina plan` finds a plan that fits";

std::string breakdown(const std::map<std::string, std::int64_t>& categories) {
  std::string parts;
  for (const auto& kv : categories) {
    parts += strprintf("\n    %-16s %s", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
  }
  return parts;
}

}  // namespace

void check_memory_budget(const Plan& plan, const MemoryEstimate& estimate, const std::string& source) {
  auto check = [&](const std::string& space, std::int64_t budget, const char* key) {
    if (budget <= 0 || estimate.bytes.count(space) == 0) return;
    const std::int64_t need = estimate.total(space);
    if (need <= budget) return;
    throw InputError(strprintf("%s: memory.%s = %s, but the run needs %s in %s per rank (%s over):%s\n%s",
                               source.c_str(), key, human_bytes(static_cast<double>(budget)).c_str(),
                               human_bytes(static_cast<double>(need)).c_str(), space.c_str(),
                               human_bytes(static_cast<double>(need - budget)).c_str(),
                               breakdown(estimate.bytes.at(space)).c_str(), kWhatHelps));
  };
  check(tier_label(MemTier::device), plan.budget.device, "device_budget");
  check(tier_label(MemTier::host), plan.budget.host, "host_budget");
}

std::string check_memory_fits(const MemoryEstimate& estimate, const SystemMemory& system, const NodeShare& share,
                              const std::string& source) {
  // Without a device of its own, every tier is host memory.
  const std::string device = tier_label(MemTier::device);
  std::int64_t host_per_rank = 0, device_per_rank = 0;
  std::map<std::string, std::int64_t> host_parts, device_parts;
  for (const auto& [space, categories] : estimate.bytes) {
    const bool on_device = system.separate_device && space == device;
    (on_device ? device_per_rank : host_per_rank) += estimate.total(space);
    for (const auto& kv : categories) (on_device ? device_parts : host_parts)[kv.first] += kv.second;
  }
  const std::int64_t host_need = host_per_rank * share.ranks_on_node;
  if (host_need > system.host_limit) {
    throw InputError(strprintf("%s: the run needs %s of host memory on this node (%d rank(s) x %s), but the node "
                               "has %s (%s); per rank:%s\n%s",
                               source.c_str(), human_bytes(static_cast<double>(host_need)).c_str(), share.ranks_on_node,
                               human_bytes(static_cast<double>(host_per_rank)).c_str(),
                               human_bytes(static_cast<double>(system.host_limit)).c_str(),
                               system.host_limit_source.c_str(), breakdown(host_parts).c_str(), kWhatHelps));
  }
  const std::int64_t device_need = device_per_rank * share.ranks_on_device;
  if (system.separate_device && device_need > system.device_free) {
    throw InputError(strprintf("%s: the run needs %s of %s memory (%d rank(s) x %s), but the device has %s free "
                               "of %s; per rank:%s\n%s",
                               source.c_str(), human_bytes(static_cast<double>(device_need)).c_str(), device.c_str(),
                               share.ranks_on_device, human_bytes(static_cast<double>(device_per_rank)).c_str(),
                               human_bytes(static_cast<double>(system.device_free)).c_str(),
                               human_bytes(static_cast<double>(system.device_total)).c_str(),
                               breakdown(device_parts).c_str(), kWhatHelps));
  }
  if (system.host_available > 0 && host_need > system.host_available) {
    return strprintf("the run needs %s of host memory on this node, %s is free now: other processes may have to "
                     "give memory back, or the run may be killed for it",
                     human_bytes(static_cast<double>(host_need)).c_str(),
                     human_bytes(static_cast<double>(system.host_available)).c_str());
  }
  return "";
}

MemoryEstimate estimate_memory(const Deck& deck) {
  return estimate_memory(deck.model, plan_from_deck(deck), RunExtras::of(deck.checkpoint, deck.output));
}

void check_memory_budget(const Deck& deck, const MemoryEstimate& estimate) {
  check_memory_budget(plan_from_deck(deck), estimate, deck.source);
}

std::string format_memory_estimate(const MemoryEstimate& estimate) {
  std::string out;
  for (const auto& [space, cats] : estimate.bytes) {
    out += strprintf("memory estimate per rank (pipeline stage %d, the largest), %s: %s\n", estimate.stage,
                     space.c_str(), human_bytes(static_cast<double>(estimate.total(space))).c_str());
    for (const auto& kv : cats) {
      out += strprintf("  %-16s %12s\n", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
    }
  }
  return out;
}

}  // namespace lamina
