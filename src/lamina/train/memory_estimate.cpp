#include "lamina/train/memory_estimate.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <set>

#include "lamina/core/buffer.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/memory_tracker.hpp"
#include "lamina/model/gpt_activations.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/parallel/schedule.hpp"
#include "lamina/train/runtime.hpp"

namespace lamina {

std::int64_t MemoryEstimate::total(const std::string& space) const {
  std::int64_t t = 0;
  const auto it = bytes.find(space);
  if (it != bytes.end())
    for (const auto& kv : it->second) t += kv.second;
  return t;
}

namespace {

// What one rank of pipeline stage `stage` allocates, mirroring ModelState, Executor and
// the buffers they size from the schedule.
using Bytes = std::map<std::string, std::map<std::string, std::int64_t>>;  // space -> category -> bytes

Bytes stage_bytes(const Deck& deck, const Schedule& schedule, int stage) {
  const ModelConfig& m = deck.model;
  const int dp = static_cast<int>(deck.parallel.dp), tp = static_cast<int>(deck.parallel.tp);
  const int zero = static_cast<int>(deck.parallel.zero);
  const ParamLayout layout = ParamLayout::gpt2(m, tp, 0);
  const Partition& part = schedule.partition();
  auto layers_of = [&](const Chunk& c) {
    std::vector<int> out;
    if (c.embedding || c.head) out.push_back(0);
    for (std::int64_t b = c.first_block; b < c.last_block; ++b) out.push_back(layout.block_layer(b));
    if (c.head) out.push_back(layout.final_layer());
    return out;
  };
  std::set<int> held;
  for (int c : part.chunks_of(stage))
    for (int l : layers_of(part.chunk(c))) held.insert(l);
  auto shard = [&](int l) { return (layout.layers()[static_cast<std::size_t>(l)].numel + dp - 1) / dp; };
  std::int64_t params = 0, grads = 0, moments = 0, comm = 0;
  for (int l : held) {
    const std::int64_t s = shard(l), padded = s * dp;
    params += zero < 3 ? padded : s;
    grads += zero < 2 ? padded : s;
    moments += 2 * (zero == 0 ? padded : s);
  }
  // Buffers that live part of a step come from pools that keep one list per buffer size:
  // the peak is, per size, the most buffers of that size held at once.
  std::map<std::int64_t, int> sizes;  // padded layer size -> layers of it on this stage
  for (int l : held) ++sizes[shard(l) * dp];
  std::int64_t one_of_each = 0, comm_sizes = 0;
  for (const auto& kv : sizes) {
    one_of_each += kv.first;
    comm_sizes += kv.first / dp;
  }
  // ZeRO-3 gathers a layer just before it runs (the head: embedding and final norm
  // together), or holds a breadth-first chunk: one buffer of each layer size.
  if (zero == 3) params += one_of_each;
  // ZeRO-2/3 accumulate a layer's full gradients from its backward until its
  // reduce-scatter completes, one in flight: two of each size.
  if (zero >= 2) grads += 2 * one_of_each;
  // Reduce-scatter outputs and the shards the all-gathers send: one of each shard size.
  if (zero >= 1) comm += comm_sizes;

  const Dims d = Dims::of(m, deck.data.micro_batch_size, tp, 0);
  const ActivationSizes a = activation_sizes(d);
  std::int64_t acts = 0, host_acts = 0;
  bool recompute = false, offload = false;
  for (int c : part.chunks_of(stage)) {
    const Chunk& k = part.chunk(c);
    std::int64_t kept = 0, offloaded = 0;
    for (std::int64_t b = k.first_block; b < k.last_block; ++b) {
      const ActivationPolicy p = deck.memory.activations[static_cast<std::size_t>(b)];
      kept += p == ActivationPolicy::keep;
      offloaded += p == ActivationPolicy::offload;
      recompute = recompute || p == ActivationPolicy::recompute;
      offload = offload || p == ActivationPolicy::offload;
    }
    const std::int64_t slots = schedule.max_in_flight(c);
    acts += slots * (LayerRangeActs<Kokkos::DefaultExecutionSpace>::floats(a, k.blocks(), kept, k.embedding, k.head) +
                     a.tokens);
    host_acts += slots * offloaded * a.inner;
  }
  if (recompute) acts += a.inner;      // the scratch a recomputed block runs in
  if (offload) acts += 2 * a.inner;    // staging for offloaded blocks, double-buffered
  std::int64_t ws = a.workspace + a.ones;
  if (deck.output.sample_tokens > 0) {  // a one-sequence replica for the text sample at the end
    const ActivationSizes s = activation_sizes(Dims::of(m, 1));
    acts += LayerRangeActs<Kokkos::DefaultExecutionSpace>::floats(s, m.layers, m.layers, true, true) + s.tokens;
    ws += s.workspace + s.ones;
  }
  Bytes out;
  auto& dev = out[tier_label(MemTier::device)];
  dev[mem_category_name(MemCategory::parameters)] = 4 * params;
  dev[mem_category_name(MemCategory::gradients)] = 4 * grads;
  dev[mem_category_name(MemCategory::optimizer_state)] = 4 * moments;
  dev[mem_category_name(MemCategory::activations)] = 4 * acts;
  dev[mem_category_name(MemCategory::workspace)] = 4 * ws;
  if (comm > 0) dev[mem_category_name(MemCategory::communication)] = 4 * comm;
  if (host_acts > 0) out[tier_label(MemTier::host)][mem_category_name(MemCategory::activations)] = 4 * host_acts;
  return out;
}

}  // namespace

MemoryEstimate estimate_memory(const Deck& deck) {
  const Schedule schedule = Schedule::build(deck.model.layers, schedule_options(deck));
  MemoryEstimate e;
  std::int64_t worst = -1;
  for (int s = 0; s < schedule.stages(); ++s) {
    Bytes b = stage_bytes(deck, schedule, s);
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

void check_memory_budget(const Deck& deck, const MemoryEstimate& estimate) {
  const std::string device = tier_label(MemTier::device);
  const std::string host = tier_label(MemTier::host);
  auto check = [&](const std::string& space, std::int64_t budget, const char* key) {
    if (budget <= 0 || estimate.bytes.count(space) == 0) return;
    const std::int64_t need = estimate.total(space);
    if (need <= budget) return;
    std::string parts;
    for (const auto& kv : estimate.bytes.at(space)) {
      parts += strprintf("\n    %-16s %s", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
    }
    throw InputError(strprintf(
        "%s: memory.%s = %s, but the run needs %s in %s per rank (%s over):%s\n"
        "  activations and workspace scale with data.micro_batch_size (gradient accumulation keeps the global "
        "batch); parameters, gradients and optimizer state shrink with parallel.zero, tp and pp",
        deck.source.c_str(), key, human_bytes(static_cast<double>(budget)).c_str(),
        human_bytes(static_cast<double>(need)).c_str(), space.c_str(),
        human_bytes(static_cast<double>(need - budget)).c_str(), parts.c_str()));
  };
  check(device, deck.memory.device_budget, "device_budget");
  check(host, deck.memory.host_budget, "host_budget");
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
