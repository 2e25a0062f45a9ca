#pragma once
// What a transformer block keeps of its activations between its forward and its backward
// (Chen et al. 2016 for recomputation; H3T's offload_hidden_state for offload;
// Lamy-Poirier 2021 for offloaded checkpoints under layered gradient accumulation).
namespace lamina {

// keep: in device memory. recompute: dropped after the forward, computed again from the
// block's input (always kept) before the backward. offload: copied to the host tier as the
// forward goes and brought back before the backward. offload_checkpoint (layered
// accumulation only): recomputed as with recompute, from the block's input, which itself
// (the checkpoint) waits in the host tier between the forward and the backward, so that
// only the micro-batches of the layer being computed hold device memory.
enum class ActivationPolicy { keep, recompute, offload, offload_checkpoint };

inline const char* activation_policy_name(ActivationPolicy p) {
  switch (p) {
    case ActivationPolicy::keep: return "keep";
    case ActivationPolicy::recompute: return "recompute";
    case ActivationPolicy::offload: return "offload";
    case ActivationPolicy::offload_checkpoint: return "offload_checkpoint";
  }
  return "?";
}

// The block's inner activations are computed again before its backward.
inline bool recomputed(ActivationPolicy p) {
  return p == ActivationPolicy::recompute || p == ActivationPolicy::offload_checkpoint;
}

}  // namespace lamina
