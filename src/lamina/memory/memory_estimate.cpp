#include "lamina/memory/memory_estimate.hpp"

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
  const bool checkpoints = deck.checkpoint.every > 0 || deck.checkpoint.save_final;
  const bool bf16 = deck.train.precision == Precision::bf16;
  // Bytes per tier and category, mirroring ModelState's buffers layer by layer.
  std::int64_t params = 0, grads = 0, moments = 0, host_params = 0, host_grads = 0, host_moments = 0;
  // Pools keep one list per buffer size: their peak is, per size, the most held at once.
  // Sizes in floats, or in bf16 values for the bf16 staging pool.
  std::set<std::int64_t> gathered, shard_staging, full_staging, staging16;
  std::map<std::int64_t, int> full_grads;  // size -> buffers of it held at once
  bool head = false;
  for (int c : part.chunks_of(stage)) head = head || part.chunk(c).head;
  const ScheduleOptions so = schedule_options(deck);
  std::int64_t dos_size = 0;
  bool dos_used = false;
  for (int l : held) {
    const std::int64_t numel = layout.layers()[static_cast<std::size_t>(l)].numel;
    std::int64_t shard = (numel + dp - 1) / dp;
    if (bf16) shard += shard % 2;  // bf16 shards travel in float words
    const std::int64_t padded = shard * dp;
    const std::int64_t stored = zero < 3 ? padded : shard, owned = zero == 0 ? padded : shard;
    const ParamPlacement pa = MemoryConfig::of_layer(deck.memory.params, l);
    const OptimizerPlacement op = MemoryConfig::of_layer(deck.memory.optimizer, l);
    const bool on_device = pa == ParamPlacement::device;
    (on_device ? params : host_params) += (bf16 ? 2 : 4) * stored;
    // Parameters that are not resident on the device in fp32 are gathered, copied in or
    // widened per use.
    if (!on_device || zero == 3 || bf16) gathered.insert(padded);
    if (!on_device && zero == 3) (bf16 ? staging16 : shard_staging).insert(shard);
    if (bf16 && (zero == 3 || !on_device)) staging16.insert(padded);
    if (bf16 && (zero == 1 || zero == 2)) staging16.insert(shard);  // sharing updated parameters
    if (bf16 && (zero == 1 || zero == 2) && !on_device) staging16.insert(padded);
    grads += 4 * (zero < 2 ? padded : shard);
    if (zero >= 2) {
      // Full-size accumulators live until their reduce-scatter completes, one in flight:
      // a size shared by two layers has one accumulating and one reducing. The tied
      // embedding alone has its own size; next to the LM head it has two too when each
      // micro-batch reduces (its reduction ends one backward, the next head starts anew).
      const bool twice = l == 0 && head && so.micro_batches > 1 && !so.layered;
      int& n = full_grads[padded];
      n = std::min(2, n + (twice ? 2 : 1));
    }
    if (zero >= 1) shard_staging.insert(shard);  // reduce-scatter outputs, all-gather inputs
    if ((zero == 1 || zero == 2) && !on_device && !bf16) full_staging.insert(padded);
    if (checkpoints && zero >= 1) {
      shard_staging.insert(shard);  // checkpoints gather sharded state on the device
      full_staging.insert(padded);
    }
    if (op == OptimizerPlacement::device) {
      moments += 4 * (bf16 ? 3 : 2) * owned;  // m, v and, beside bf16 parameters, fp32 master weights
    } else {
      host_moments += 4 * (on_device || bf16 ? 3 : 2) * owned;  // m, v, fp32 master (unless the parameters)
      if (on_device && bf16) host_params += 2 * owned;          // rounded, on their way to the device
      host_grads += 4 * owned;
      if (op == OptimizerPlacement::dynamic) {
        // Master, m and v of the largest subgroup updated on the device: none when the split
        // keeps everything home (forced, or the model on a build whose device is the host),
        // else the largest the split can pick (the model's depends on rates measured at run time).
        const bool host_only =
            Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible;
        const DosSplit split = deck.memory.dos_split;
        const bool none = split == DosSplit::all_host || (split == DosSplit::model && host_only);
        const std::int64_t sg = deck.optimizer.subgroup_size;
        const std::int64_t len = zero == 0 ? numel : std::min(numel, shard);  // rank 0's owned elements
        dos_size = std::max(dos_size, std::min(sg, len));
        // Whether any subgroup can go to the device (the model's split depends on rates).
        dos_used = dos_used || (!none && (split != DosSplit::alternate || len > sg));
      }
    }
  }
  for (const auto n : gathered) params += 4 * n;
  // Blocks are prefetched one ahead: a second buffer of the block size where a chunk has
  // two non-resident blocks in a row.
  for (int c : part.chunks_of(stage)) {
    const Chunk& k = part.chunk(c);
    if (k.blocks() < 2) continue;
    const int l = layout.block_layer(k.first_block);
    const bool away = MemoryConfig::of_layer(deck.memory.params, l) == ParamPlacement::host || zero == 3 || bf16;
    if (away) {
      const std::int64_t numel = layout.layers()[static_cast<std::size_t>(l)].numel;
      std::int64_t shard = (numel + dp - 1) / dp;
      if (bf16) shard += shard % 2;
      params += 4 * shard * dp;
      break;
    }
  }
  for (const auto& [size, n] : full_grads) grads += 4 * n * size;
  if (dos_used) moments += 4 * 3 * dos_size;  // master, m and v of one subgroup, one size for all layers
  std::int64_t comm = 0;
  for (const auto n : shard_staging) comm += 4 * n;
  for (const auto n : full_staging) comm += 4 * n;
  for (const auto n : staging16) comm += 2 * n;

  const Dims d = Dims::of(m, deck.data.micro_batch_size, tp, 0);
  const ActivationSizes a = activation_sizes(d);
  std::int64_t acts = 0, host_acts = 0;  // bytes
  bool scratch = false, offload = false;
  for (int c : part.chunks_of(stage)) {
    const Chunk& k = part.chunk(c);
    std::int64_t kept = 0, offloaded = 0;
    for (std::int64_t b = k.first_block; b < k.last_block; ++b) {
      const ActivationPolicy p = deck.memory.activations[static_cast<std::size_t>(b)];
      kept += p == ActivationPolicy::keep;
      offloaded += p == ActivationPolicy::offload;
      scratch = scratch || p == ActivationPolicy::recompute || (bf16 && p != ActivationPolicy::recompute);
      offload = offload || p == ActivationPolicy::offload;
    }
    const std::int64_t slots = schedule.max_in_flight(c);
    const std::int64_t fp32_kept = bf16 ? 0 : kept;
    acts += slots * (4 * (LayerRangeActs<Kokkos::DefaultExecutionSpace>::floats(a, k.blocks(), fp32_kept, k.embedding,
                                                                                 k.head) +
                          a.tokens) +
                     2 * (kept - fp32_kept) * a.inner);
    host_acts += (bf16 ? 2 : 4) * slots * offloaded * a.inner;
  }
  if (scratch) acts += 4 * a.inner;                   // where a recomputed or bf16-stored block runs
  if (offload) acts += (bf16 ? 2 : 4) * 2 * a.inner;  // staging for offloaded blocks, double-buffered
  std::int64_t ws = a.workspace + a.ones;
  if (deck.output.sample_tokens > 0) {  // a one-sequence replica for the text sample at the end
    const ActivationSizes s = activation_sizes(Dims::of(m, 1));
    acts += 4 * (LayerRangeActs<Kokkos::DefaultExecutionSpace>::floats(s, m.layers, m.layers, true, true) + s.tokens);
    ws += s.workspace + s.ones;
  }
  Bytes out;
  auto& dev = out[tier_label(MemTier::device)];
  dev[mem_category_name(MemCategory::parameters)] = params;
  dev[mem_category_name(MemCategory::gradients)] = grads;
  dev[mem_category_name(MemCategory::optimizer_state)] = moments;
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
  if (moments == 0) dev.erase(mem_category_name(MemCategory::optimizer_state));
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

MemoryEstimate estimate_memory(const Deck& deck, int stage) {
  const Schedule schedule = Schedule::build(deck.model.layers, schedule_options(deck));
  MemoryEstimate e;
  e.bytes = stage_bytes(deck, schedule, stage);
  e.stage = stage;
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
        "  what helps: memory.activations = \"recompute\" or \"offload\" (activations; they also scale with "
        "data.micro_batch_size), memory.params = \"host\", memory.optimizer = \"host\" or \"dynamic\", "
        "train.precision = \"bf16\" (stored parameters and activations), parallel.zero, tp and pp (parameters, "
        "gradients, optimizer state)",
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
