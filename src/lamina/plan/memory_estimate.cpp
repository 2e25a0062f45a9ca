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

Footprint layer_state(const LayerShard& s, const LayerPolicy& policy, int zero, Precision precision) {
  const bool bf16 = precision == Precision::bf16;
  const MemTier dev = MemTier::device, host = MemTier::host;
  Footprint f;
  const StoredParams p = StoredParams::of(s, policy, zero, precision);
  f.add(dev, MemCategory::parameters, 4 * p.device_fp32 + 2 * p.device_bf16);
  f.add(host, MemCategory::parameters, 4 * p.host_fp32 + 2 * p.host_bf16 + 2 * p.host_rounded);
  const StoredGrads g = StoredGrads::of(s, zero);
  f.add(dev, MemCategory::gradients, 4 * (g.full + g.shard));
  const OptimizerBuffers o = OptimizerBuffers::of(s.owned_size(zero), policy.optimizer, policy.params, bf16);
  f.add(dev, MemCategory::optimizer_state, 4 * (o.device_m + o.device_v + o.device_master));
  f.add(host, MemCategory::optimizer_state, 4 * (o.host_m + o.host_v + o.host_master));
  f.add(host, MemCategory::gradients, 4 * o.host_grads);
  return f;
}

namespace {
using Acts = LayerRangeActs<Kokkos::DefaultExecutionSpace>;
}  // namespace

Footprint block_activations(const ActivationSizes& a, ActivationPolicy policy, bool bf16, std::int64_t in_flight) {
  Footprint f;
  if (policy == ActivationPolicy::offload_checkpoint) {  // the checkpoint; frames are the pool's
    f.add(MemTier::host, MemCategory::activations, in_flight * 4 * Acts::stream_words(a, bf16));
    return f;
  }
  const bool keep = policy == ActivationPolicy::keep;
  // A range of one block beside an empty one: the block's output and, kept, its inner part.
  f.add(MemTier::device, MemCategory::activations,
        in_flight * (Acts::bytes(a, 1, keep ? 1 : 0, false, false, bf16) - Acts::bytes(a, 0, 0, false, false, bf16)));
  if (policy == ActivationPolicy::offload) {
    f.add(MemTier::host, MemCategory::activations, in_flight * (bf16 ? 2 : 4) * a.inner);
  }
  return f;
}

std::int64_t range_activations(const ActivationSizes& a, bool head, bool own_dres, bool bf16) {
  return Acts::bytes(a, 0, 0, head, own_dres, bf16);
}

namespace {

using Bytes = std::map<std::string, std::map<std::string, std::int64_t>>;  // space -> category -> bytes

// What one rank of pipeline stage `stage` allocates. device_free: for the Deep Optimizer
// States schedule (see dos_device_free).
Bytes stage_bytes(const ModelConfig& m, const Plan& plan, const RunExtras& extras, const Schedule& schedule,
                  int stage, std::int64_t device_free) {
  const ParallelLayout& o = plan.layout;
  const bool bf16 = plan.precision == Precision::bf16;
  const ParamLayout layout = ParamLayout::of(m, o.tp, 0);
  const std::vector<int> held = schedule.layers_of_stage(stage);
  const RankOptimizers opt = plan_rank_optimizers(plan, layout, held, 0, dos_model(plan), device_free);
  const MemTier dev = MemTier::device, host = MemTier::host;
  auto shard = [&](int l) {
    return LayerShard::of(layout.layers()[static_cast<std::size_t>(l)].numel, o.replicas(), bf16);
  };

  // Buffers that live the whole run: the layers' state.
  Footprint f;
  for (int l : held) f += layer_state(shard(l), plan.layer(l), o.zero, plan.precision);
  std::int64_t replica_sums = 0;  // the gradient reducer's buffer for replicated K/V heads
  for (int l : held) replica_sums = std::max(replica_sums, replica_sum_elements(layout.layers()[static_cast<std::size_t>(l)]));
  f.add(dev, MemCategory::communication, 4 * replica_sums);

  // Buffers that live part of a step: the pools' peaks as the simulator replays the step,
  // the update and a checkpoint.
  MemoryModel mm;
  mm.zero = o.zero;
  mm.bf16 = bf16;
  mm.dos_stage = opt.dos_stage;
  mm.checkpoint = extras.checkpoints;
  Dims d = extras.machine_host
               ? Dims::on_machine(m, o.micro_batch_size, o.tp, *extras.machine_host, o.sequence_parallel, o.cp)
               : Dims::of(m, o.micro_batch_size, o.tp, 0, o.sequence_parallel, o.cp);
  d.bf16 = bf16;
  // The products of a run on this build (another machine's: fp32, which prices more workspace).
  if (!extras.machine_host) d.products = product_math<Kokkos::DefaultExecutionSpace>(plan.precision);
  const ActivationSizes a = activation_sizes(d);
  mm.stream_frame = Acts::stream_words(a, bf16);
  mm.gradient_frame = a.boundary;
  for (int l : held) {
    MemoryModel::Layer x;
    x.shard = shard(l);
    x.resident = resident_params(schedule.spec(), l);
    x.tier = plan.layer(l).params;
    x.dynamic = plan.layer(l).optimizer == OptimizerPlacement::dynamic;
    mm.layers[l] = x;
  }
  const PoolPeaks pools = simulate_memory(schedule, stage, update_program(opt.updates(), o.zero), mm);
  f.add(dev, MemCategory::parameters, pools.params);
  f.add(dev, MemCategory::gradients, pools.grads);
  f.add(dev, MemCategory::optimizer_state, pools.dos);
  f.add(dev, MemCategory::communication, pools.communication);
  f.add(dev, MemCategory::activations, pools.frames);

  // Activations: one LayerRangeActs per chunk and micro-batch in flight, the executor's
  // scratch and staging, the workspace.
  bool scratch = false, offload = false;
  const Partition& part = schedule.partition();
  for (int c : part.chunks_of(stage)) {
    const Chunk& k = part.chunk(c);
    const std::int64_t slots = schedule.max_in_flight(c);
    const bool own_dres = o.layered;  // depth-first chunks share one residual-gradient buffer
    f.add(dev, MemCategory::activations,
          offloaded_checkpoint(schedule.spec(), k)
              ? slots * Acts::pooled_bytes(a, k.head)
              : slots * range_activations(a, k.head, own_dres, bf16) + (own_dres ? 0 : 4 * a.boundary));
    for (std::int64_t b = k.first_block; b < k.last_block; ++b) {
      const ActivationPolicy p = plan.blocks[static_cast<std::size_t>(b)].activations;
      f += block_activations(a, p, bf16, slots);
      scratch = scratch || recomputed(p);
      offload = offload || p == ActivationPolicy::offload;
    }
  }
  if (scratch) f.add(dev, MemCategory::activations, (bf16 ? 2 : 4) * a.inner);  // where a recomputed block runs
  if (offload) f.add(dev, MemCategory::activations, (bf16 ? 2 : 4) * 2 * a.inner);  // staging, double-buffered
  f.add(dev, MemCategory::workspace, 4 * (a.workspace + a.column_partials + a.sequence + a.context));
  if (extras.sample) {  // a one-sequence replica for the text sample at the end (fp32 activations)
    Dims one = Dims::of(m, 1);
    one.bf16 = bf16;
    one.products = product_math<Kokkos::DefaultExecutionSpace>(plan.precision);
    const ActivationSizes s = activation_sizes(one);
    f.add(dev, MemCategory::activations, Acts::bytes(s, m.layers, m.layers, true, true, false));
    f.add(dev, MemCategory::workspace, 4 * (s.workspace + s.column_partials));
  }

  // The breakdown: the device's main categories always, the rest where they hold anything.
  Bytes out;
  for (const MemTier t : {dev, host}) {
    for (const MemCategory c : {MemCategory::parameters, MemCategory::gradients, MemCategory::optimizer_state,
                                MemCategory::activations, MemCategory::workspace, MemCategory::communication}) {
      const bool always = t == dev && c != MemCategory::optimizer_state && c != MemCategory::communication;
      if (always || f.at(t, c) > 0) out[tier_label(t)][mem_category_name(c)] = f.at(t, c);
    }
  }
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
  return estimate_memory(model, plan, extras, Schedule::build(step_spec(plan, model)));
}

MemoryEstimate estimate_memory(const ModelConfig& model, const Plan& plan, const RunExtras& extras,
                               const Schedule& schedule) {
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
    "data.micro_batch_size), model.attention = \"fused\" (keeps no T x T attention probabilities), "
    "model.loss_chunk (the head's logits for that many rows at a time), "
    "memory.params = \"host\", memory.optimizer = \"host\" or \"dynamic\", "
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
