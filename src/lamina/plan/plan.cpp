#include "lamina/plan/plan.hpp"

#include <algorithm>
#include <functional>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

namespace {

ScheduleKind schedule_kind(const std::string& s) {
  return s == "gpipe"         ? ScheduleKind::gpipe
         : s == "interleaved" ? ScheduleKind::interleaved
         : s == "modular"     ? ScheduleKind::modular
                              : ScheduleKind::one_f_one_b;
}

ActivationPolicy activation_policy(const std::string& s) {
  return s == "recompute"            ? ActivationPolicy::recompute
         : s == "offload"            ? ActivationPolicy::offload
         : s == "offload_checkpoint" ? ActivationPolicy::offload_checkpoint
                                     : ActivationPolicy::keep;
}

OptimizerPlacement optimizer_placement(const std::string& s) {
  return s == "host" ? OptimizerPlacement::host : s == "dynamic" ? OptimizerPlacement::dynamic : OptimizerPlacement::device;
}

DosSplit dos_split(const std::string& s) {
  return s == "all_host"     ? DosSplit::all_host
         : s == "all_device" ? DosSplit::all_device
         : s == "alternate"  ? DosSplit::alternate
                             : DosSplit::model;
}

const char* dos_split_name(DosSplit s) {
  switch (s) {
    case DosSplit::model: return "model";
    case DosSplit::all_host: return "all_host";
    case DosSplit::all_device: return "all_device";
    case DosSplit::alternate: return "alternate";
  }
  return "?";
}

// Runs of equal values over the blocks: "keep" or "keep x4, recompute x2".
template <class F>
std::string runs(const std::vector<LayerPolicy>& blocks, F name) {
  std::string out;
  for (std::size_t i = 0; i < blocks.size();) {
    std::size_t j = i;
    while (j < blocks.size() && std::string(name(blocks[j])) == name(blocks[i])) ++j;
    if (!out.empty()) out += ",";
    out += name(blocks[i]);
    if (i != 0 || j != blocks.size()) out += strprintf("*%zu", j - i);
    i = j;
  }
  return out;
}

long long ll(std::int64_t v) { return static_cast<long long>(v); }

}  // namespace

bool Plan::any_optimizer(OptimizerPlacement p) const {
  return std::any_of(blocks.begin(), blocks.end(), [p](const LayerPolicy& b) { return b.optimizer == p; });
}

Precision tp_sum_precision(const Deck& deck) {
  return deck.parallel.tp_sums == "bf16" ? Precision::bf16 : Precision::fp32;
}

Plan plan_from_deck(const Deck& deck, int world) {
  std::vector<std::string> errors;
  auto error = [&](const std::string& key, const std::string& msg) {
    errors.push_back(deck.where(key) + ": " + key + ": " + msg);
  };
  const ModelConfig& m = deck.model;
  const ParallelSection& p = deck.parallel;
  const MemorySection& mem = deck.memory;
  Plan plan;
  ParallelLayout& o = plan.layout;
  o.dp = static_cast<int>(p.dp);
  o.cp = static_cast<int>(p.cp);
  o.tp = static_cast<int>(p.tp);
  o.pp = static_cast<int>(p.pp);
  o.zero = static_cast<int>(p.zero);
  o.schedule = schedule_kind(p.schedule);
  o.virtual_stages = static_cast<int>(p.virtual_stages);
  o.layered = p.layered;
  o.sequence_parallel = p.sequence_parallel;
  o.micro_batch_size = deck.data.micro_batch_size;
  // Sizes beyond any machine stop here, before 64-bit byte counts of the memory estimate
  // could overflow: no single quantity of one rank may exceed a pebibyte.
  constexpr long double kMaxBytes = static_cast<long double>(1LL << 50);
  const long double d = static_cast<long double>(m.d_model), T = static_cast<long double>(m.seq_len);
  const long double params = 12.0L * static_cast<long double>(m.layers) * d * d +
                             (static_cast<long double>(m.vocab_size) + T) * d;
  if (16.0L * params > kMaxBytes) {
    error("model.d_model", strprintf("%.3Lg parameters need %s of weights and optimizer state, more than any machine "
                                     "holds",
                                     params, human_bytes(static_cast<double>(16.0L * params)).c_str()));
  }
  const long double widest = std::max({static_cast<long double>(m.vocab_size), 4.0L * d,
                                       static_cast<long double>(m.heads) * T});
  const long double activation = 4.0L * static_cast<long double>(o.micro_batch_size) * T * widest;
  if (activation > kMaxBytes) {
    error("data.micro_batch_size",
          strprintf("a micro-batch of %lld sequences of %lld tokens makes activations of %s each, more than any "
                    "machine holds; lower data.micro_batch_size or model.seq_len",
                    ll(o.micro_batch_size), ll(m.seq_len), human_bytes(static_cast<double>(activation)).c_str()));
  }
  const std::int64_t per_step = o.micro_batch_size * o.dp;
  if (deck.data.batch_size / per_step > (1 << 24)) {
    error("data.batch_size", strprintf("%lld sequences are %lld micro-batches of %lld x parallel.dp = %d per step; "
                                       "at most %d are supported: raise data.micro_batch_size",
                                       ll(deck.data.batch_size), ll(deck.data.batch_size / per_step),
                                       ll(o.micro_batch_size), o.dp, 1 << 24));
  } else if (deck.data.batch_size % per_step != 0) {
    error("data.batch_size", strprintf("%lld is not a multiple of micro_batch_size x parallel.dp = %lld x %d",
                                       ll(deck.data.batch_size), ll(o.micro_batch_size), o.dp));
  }
  o.micro_batches = static_cast<int>(std::max<std::int64_t>(1, deck.data.batch_size / per_step));
  if (o.tp > 1 && m.heads % o.tp != 0) {
    error("parallel.tp", strprintf("model.heads = %lld must be divisible by tp = %d (each rank takes whole heads)",
                                   ll(m.heads), o.tp));
  }
  // Each rank takes whole key/value heads, or, where tp exceeds them, one that tp / kv_heads
  // ranks share (Megatron's replication).
  const std::int64_t kv = m.key_value_heads();
  if (o.tp > 1 && m.heads % o.tp == 0 && kv % o.tp != 0 && o.tp % kv != 0) {
    error("parallel.tp", strprintf("model.kv_heads = %lld and tp = %d: one must divide the other (each rank takes "
                                   "whole key/value heads, or one that tp / kv_heads ranks share)",
                                   ll(kv), o.tp));
  }
  if (o.tp > 1 && m.mlp_hidden() % o.tp != 0) {
    error("model.ffn_hidden", strprintf("%lld is not divisible by parallel.tp = %d (the MLP is split by columns)",
                                        ll(m.mlp_hidden()), o.tp));
  }
  if (o.tp > 1 && m.vocab_size % o.tp != 0) {
    error("model.vocab_size", strprintf("%lld is not divisible by parallel.tp = %d (the embedding is split by rows); "
                                        "pad it, e.g. to %lld",
                                        ll(m.vocab_size), o.tp,
                                        ll((m.vocab_size + 128 * o.tp - 1) / (128 * o.tp) * 128 * o.tp)));
  }
  if (o.cp > 1) {
    if (m.seq_len % (2 * o.cp) != 0) {
      error("parallel.cp", strprintf("cuts each sequence into 2 cp = %d chunks (rank i holding chunks i and 2 cp - 1 - "
                                     "i), and model.seq_len = %lld does not split into them",
                                     2 * o.cp, ll(m.seq_len)));
    }
    if (m.attention == AttentionProducts::in_place) {
      error("model.attention", strprintf("context parallelism (parallel.cp = %d) runs attention as ring attention on "
                                         "the fused kernels or on staged products, not in place (in_place reads "
                                         "keys and values in the rank's own rows; the ring brings the other ranks' "
                                         "in buffers): set model.attention = \"fused\" or \"staged\", or leave "
                                         "it out",
                                         o.cp));
    }
  }
  if (o.sequence_parallel) {
    const std::int64_t rows = o.micro_batch_size * m.seq_len / o.cp;
    if (o.tp == 1) {
      error("parallel.sequence_parallel", "shards the sequence over the tensor-parallel group, and parallel.tp = 1 "
                                          "has none: set parallel.tp > 1 or parallel.sequence_parallel = false");
    } else if (rows % o.tp != 0) {
      error("parallel.sequence_parallel",
            strprintf("a micro-batch's %lld positions (micro_batch_size x seq_len%s) do not split evenly over tp = %d",
                      ll(rows), o.cp > 1 ? " / cp on a rank" : "", o.tp));
    }
  }
  for (const ScheduleProblem& sp : schedule_problems(m.layers, o)) error(sp.key, sp.message);
  if (world > 0 && o.ranks() != world) {
    const std::string grid = o.cp > 1 ? strprintf("dp x cp x tp x pp = %d x %d x %d x %d", o.dp, o.cp, o.tp, o.pp)
                                      : strprintf("dp x tp x pp = %d x %d x %d", o.dp, o.tp, o.pp);
    error("parallel.dp", strprintf("%s = %d ranks, but the job runs on %d; change parallel.dp, %stp or pp, or the "
                                   "number of ranks (mpirun -np %d)",
                                   grid.c_str(), o.ranks(), world, o.cp > 1 ? "cp, " : "", o.ranks()));
  }

  for (std::int64_t b = 0; b < m.layers; ++b) {
    const auto i = static_cast<std::size_t>(b);
    LayerPolicy lp;
    lp.activations = activation_policy(mem.activations[i]);
    lp.params = mem.params[i] == "host" ? MemTier::host : MemTier::device;
    lp.optimizer = optimizer_placement(mem.optimizer[i]);
    plan.blocks.push_back(lp);
  }
  for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
    if (plan.blocks[i].params == MemTier::host && plan.blocks[i].optimizer == OptimizerPlacement::device) {
      error("memory.optimizer",
            strprintf("block %zu has memory.params = 'host' (its fp32 master weights live on the host) but "
                      "memory.optimizer = 'device'; use 'host' or 'dynamic' for it",
                      i));
      break;
    }
  }
  if (!o.layered) {
    for (std::size_t i = 0; i < plan.blocks.size(); ++i) {
      if (plan.blocks[i].activations != ActivationPolicy::offload_checkpoint) continue;
      error("memory.activations",
            strprintf("block %zu has 'offload_checkpoint', which needs parallel.layered = true (each layer runs "
                      "over all micro-batches, so its checkpoints can wait in host memory); use 'recompute' or "
                      "'offload', or set parallel.layered = true",
                      i));
      break;
    }
  }
  plan.precision = deck.train.precision;
  plan.tp_sums = tp_sum_precision(deck);
  if (plan.tp_sums == Precision::bf16 && plan.precision != Precision::bf16) {
    error("parallel.tp_sums", "'bf16' rounds a bf16 run's partial results; this run is fp32: set "
                              "train.precision = \"bf16\" or parallel.tp_sums = \"fp32\"");
  }
  plan.subgroup_size = deck.optimizer.subgroup_size;
  plan.budget = {mem.device_budget, mem.host_budget};
  plan.dos = {dos_split(mem.dos_split), mem.dos_host_rate, mem.dos_device_rate, mem.dos_h2d, mem.dos_d2h};
  plan.clock.forward_block = p.cost_forward;
  plan.clock.backward_block = p.cost_backward;
  plan.clock.p2p = p.cost_p2p;

  if (!errors.empty()) {
    std::string msg = errors.size() == 1 ? "" : strprintf("%zu problems in the deck:\n", errors.size());
    for (std::size_t i = 0; i < errors.size(); ++i) msg += (i ? "\n" : "") + errors[i];
    throw InputError(msg);
  }
  return plan;
}

StepSpec step_spec(const Plan& plan, const ModelConfig& model) {
  StepSpec s;
  s.layers = model.layers;
  s.layout = plan.layout;
  s.blocks = plan.blocks;
  s.precision = plan.precision;
  s.tp_sums = plan.tp_sums;
  s.tied_embeddings = model.tie_embeddings;
  return s;
}

std::string describe(const Plan& plan) {
  const ParallelLayout& o = plan.layout;
  std::string out = strprintf("plan: dp %d x tp %d x pp %d = %d rank(s), ZeRO stage %d, schedule %s", o.dp, o.tp, o.pp,
                              o.ranks(), o.zero, schedule_kind_name(o.schedule));
  if (o.schedule == ScheduleKind::interleaved) out += strprintf(" (%d chunks per stage)", o.virtual_stages);
  if (o.cp > 1) out += strprintf(", context parallelism over %d ranks (ring attention)", o.cp);
  if (o.layered) out += ", layered gradient accumulation";
  if (o.sequence_parallel) out += ", sequence parallelism";
  out += strprintf(", %d micro-batch(es) of %lld sequence(s) per rank, %s, optimizer subgroups of %lld", o.micro_batches,
                   ll(o.micro_batch_size), plan.precision == Precision::bf16 ? "bf16" : "fp32",
                   ll(plan.subgroup_size));
  if (plan.tp_sums == Precision::bf16) out += ", tensor-parallel sums in bf16";
  if (plan.budget.device > 0) out += ", device budget " + human_bytes(static_cast<double>(plan.budget.device));
  if (plan.budget.host > 0) out += ", host budget " + human_bytes(static_cast<double>(plan.budget.host));
  // Consecutive blocks with the same policies, as ranges.
  const auto& b = plan.blocks;
  for (std::size_t i = 0; i < b.size();) {
    std::size_t j = i;
    while (j < b.size() && b[j].activations == b[i].activations && b[j].params == b[i].params &&
           b[j].optimizer == b[i].optimizer)
      ++j;
    out += strprintf("\n  blocks %zu-%zu: activations %s, parameters %s, optimizer %s", i, j - 1,
                     activation_policy_name(b[i].activations), mem_tier_name(b[i].params),
                     optimizer_placement_name(b[i].optimizer));
    i = j;
  }
  if (plan.any_optimizer(OptimizerPlacement::dynamic)) {
    out += strprintf("\n  deep optimizer states: split %s", dos_split_name(plan.dos.split));
  }
  return out;
}

std::string plan_summary(const Plan& plan) {
  const ParallelLayout& o = plan.layout;
  return strprintf("dp=%d tp=%d pp=%d zero=%d schedule=%s virtual_stages=%d layered=%s micro_batch_size=%lld "
                   "micro_batches=%d precision=%s%s%s activations=%s params=%s optimizer=%s",
                   o.dp, o.tp, o.pp, o.zero, schedule_kind_name(o.schedule), o.virtual_stages,
                   o.layered ? "true" : "false", ll(o.micro_batch_size), o.micro_batches,
                   plan.precision == Precision::bf16 ? "bf16" : "fp32",
                   plan.tp_sums == Precision::bf16 ? " tp_sums=bf16" : "",
                   ((o.sequence_parallel ? std::string(" sequence_parallel=true") : std::string()) +
                    (o.cp > 1 ? strprintf(" cp=%d", o.cp) : std::string()))
                       .c_str(),
                   runs(plan.blocks, [](const LayerPolicy& p) { return activation_policy_name(p.activations); }).c_str(),
                   runs(plan.blocks, [](const LayerPolicy& p) { return mem_tier_name(p.params); }).c_str(),
                   runs(plan.blocks, [](const LayerPolicy& p) { return optimizer_placement_name(p.optimizer); }).c_str());
}

}  // namespace lamina
