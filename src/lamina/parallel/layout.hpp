#pragma once
// The parallel layout of a step and the memory policy of each layer: the data a Plan
// (plan/plan.hpp) hands to the schedule builder, the parameter store, the gradient
// reducer and the executor. Plain values, checked when the plan is made.
#include <cstdint>
#include <vector>

#include "lamina/core/memory_tier.hpp"
#include "lamina/model/activation_policy.hpp"
#include "lamina/optim/placement.hpp"

namespace lamina {

// GPipe (all forwards, then all backwards), 1F1B (PipeDream-flush, Narayanan et al. 2021),
// interleaved 1F1B (virtual_stages chunks per rank) and modular (layer l on stage l mod
// pp, Lamy-Poirier 2021).
enum class ScheduleKind { gpipe, one_f_one_b, interleaved, modular };

inline const char* schedule_kind_name(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::gpipe: return "gpipe";
    case ScheduleKind::one_f_one_b: return "1f1b";
    case ScheduleKind::interleaved: return "interleaved";
    case ScheduleKind::modular: return "modular";
  }
  return "?";
}

struct ParallelLayout {
  int dp = 1, tp = 1, pp = 1;
  // Context parallelism: each sequence's positions over cp ranks (kernels/context_chunks.hpp),
  // attention as a ring; gradients sum and ZeRO shards over the dp x cp ranks of a replica.
  int cp = 1;
  // Megatron's sequence parallelism: the residual stream, its norms and their saved inputs and
  // outputs hold 1/tp of a micro-batch's rows on each tensor-parallel rank, gathered before the
  // column-parallel products and reduce-scattered after the row-parallel ones.
  bool sequence_parallel = false;
  int zero = 0;  // ZeRO stage: 1 shards optimizer state, 2 also gradients, 3 also parameters
  ScheduleKind schedule = ScheduleKind::one_f_one_b;
  int virtual_stages = 1;  // interleaved: model chunks per pipeline rank
  bool layered = false;    // layered gradient accumulation: each layer runs all micro-batches in turn
  int micro_batches = 1;   // per data-parallel rank and step
  std::int64_t micro_batch_size = 1;  // sequences per forward/backward pass

  int ranks() const { return dp * cp * tp * pp; }
  // The data group: the ranks that hold the same parameters and see different tokens.
  int replicas() const { return dp * cp; }
};

// One transformer block's policy; the embedding follows block 0, the final norm the last
// block (policy_of_layer).
struct LayerPolicy {
  ActivationPolicy activations = ActivationPolicy::keep;
  MemTier params = MemTier::device;
  OptimizerPlacement optimizer = OptimizerPlacement::device;
};
inline bool operator==(const LayerPolicy& a, const LayerPolicy& b) {
  return a.activations == b.activations && a.params == b.params && a.optimizer == b.optimizer;
}
inline bool operator!=(const LayerPolicy& a, const LayerPolicy& b) { return !(a == b); }

// The policy of parameter-layout layer `layer` (0 embedding, 1..L blocks, L+1 final norm).
inline const LayerPolicy& policy_of_layer(const std::vector<LayerPolicy>& blocks, int layer) {
  const int n = static_cast<int>(blocks.size());
  const int b = layer - 1 < 0 ? 0 : layer - 1 > n - 1 ? n - 1 : layer - 1;
  return blocks[static_cast<std::size_t>(b)];
}

}  // namespace lamina
