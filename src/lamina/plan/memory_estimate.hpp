#pragma once
// Bytes a run allocates, per memory space and category, predicted from the plan. The memory
// model (layer_state, block_activations, range_activations: the planner's too) sizes the
// buffers that live the whole run by the functions their owners allocate with
// (StoredParams, StoredGrads, OptimizerBuffers, LayerRangeActs::bytes, activation_sizes);
// buffers that live part of a step come from pools, and their peak is found by replaying
// the schedule's instruction lists (the step program, the update program and a
// checkpoint's gathers) against the same pool rules the runtime follows: a pool keeps
// every buffer it ever allocated and hands out a free one of the same size first.
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "lamina/core/config.hpp"
#include "lamina/core/memory_tier.hpp"
#include "lamina/core/memory_tracker.hpp"
#include "lamina/core/system_memory.hpp"
#include "lamina/model/gpt_activations.hpp"
#include "lamina/parallel/schedule.hpp"
#include "lamina/parallel/shard.hpp"
#include "lamina/plan/plan.hpp"

namespace lamina {

// Bytes one rank holds, by memory tier and category.
class Footprint {
 public:
  void add(MemTier tier, MemCategory category, std::int64_t bytes) { bytes_[{tier, category}] += bytes; }
  Footprint& operator+=(const Footprint& other) {
    for (const auto& [key, n] : other.bytes_) bytes_[key] += n;
    return *this;
  }
  std::int64_t at(MemTier tier, MemCategory category) const {
    const auto it = bytes_.find({tier, category});
    return it == bytes_.end() ? 0 : it->second;
  }
  std::int64_t total(MemTier tier) const {
    std::int64_t t = 0;
    for (const auto& [key, n] : bytes_)
      if (key.first == tier) t += n;
    return t;
  }

 private:
  std::map<std::pair<MemTier, MemCategory>, std::int64_t> bytes_;
};

// The memory model. A layer's state on one rank under its policy: stored parameters,
// gradients and optimizer state, each in the tier it lives in.
Footprint layer_state(const LayerShard& shard, const LayerPolicy& policy, int zero, Precision precision);
// What one block keeps for `in_flight` micro-batches under its activation policy: its
// output (the residual stream; the next block's recomputation checkpoint) and its inner
// activations, kept on the device or offloaded to the host tier. offload_checkpoint: its
// checkpoint in the host tier only (its chunk's residual stream takes frames from a pool,
// whose peak the replay finds).
Footprint block_activations(const ActivationSizes& a, ActivationPolicy policy, bool bf16, std::int64_t in_flight);
// What a range of blocks keeps per micro-batch besides its blocks: its input, the head's
// activations where it ends with the head, its own residual gradient, the token ids.
std::int64_t range_activations(const ActivationSizes& a, bool head, bool own_dres, bool bf16);

struct MemoryEstimate {
  // space -> category -> bytes, for one rank of the pipeline stage that needs the most
  std::map<std::string, std::map<std::string, std::int64_t>> bytes;
  int stage = 0;
  std::int64_t total(const std::string& space) const;
};

// What a run allocates besides its steps.
struct RunExtras {
  bool checkpoints = false;  // checkpoints gather sharded state through device staging
  bool sample = false;       // a one-sequence replica of the model for the text sample at the end
  // Planning for a machine that need not be this build's (the planner): whether it runs the
  // blocks on a host, as Dims::on_machine takes it; unset: this build's kernels.
  std::optional<bool> machine_host;
  static RunExtras of(const CheckpointConfig& checkpoint, const OutputConfig& output);
};

// The pipeline stage that needs the most (all stages hold the same at pp = 1).
MemoryEstimate estimate_memory(const ModelConfig& model, const Plan& plan, const RunExtras& extras);
// The same for the plan's instruction lists, built already.
MemoryEstimate estimate_memory(const ModelConfig& model, const Plan& plan, const RunExtras& extras,
                               const Schedule& schedule);
// One rank (data- and tensor-parallel rank 0) of one pipeline stage.
MemoryEstimate estimate_memory(const ModelConfig& model, const Plan& plan, const RunExtras& extras, int stage);

// Device memory Deep Optimizer States may stage into at update time on `stage`: what the
// budget leaves beside everything else (negative: no budget, so unknown).
std::int64_t dos_device_free(const ModelConfig& model, const Plan& plan, const RunExtras& extras, int stage);

// Throws InputError when a budget of the plan is exceeded, naming what does not fit and
// the options that help. source: the deck (for the message).
void check_memory_budget(const Plan& plan, const MemoryEstimate& estimate, const std::string& source);

// How the job's ranks share this node's memory: ranks on the node (they share the host
// memory) and ranks on this rank's device.
struct NodeShare {
  int ranks_on_node = 1;
  int ranks_on_device = 1;
};

// Throws InputError when the run cannot fit the memory this node really has: the host
// memory of every rank of the node against the host limit (physical or cgroup), the device
// memory against what is free on the device. Returns a warning (or "") when it fits the
// limit but not the memory free right now.
std::string check_memory_fits(const MemoryEstimate& estimate, const SystemMemory& system, const NodeShare& share,
                              const std::string& source);

// The same for the plan a deck describes, with the extras its checkpoint and output keys ask for.
MemoryEstimate estimate_memory(const Deck& deck);
void check_memory_budget(const Deck& deck, const MemoryEstimate& estimate);

std::string format_memory_estimate(const MemoryEstimate& estimate);

}  // namespace lamina
