#pragma once
// What a transformer block keeps of its inner activations between its forward and its
// backward (Chen et al. 2016 for recomputation; H3T's offload_hidden_state for offload).
namespace lamina {

// keep: in device memory. recompute: dropped after the forward, computed again from the
// block's input (always kept) before the backward. offload: copied to the host tier as the
// forward goes and brought back before the backward.
enum class ActivationPolicy { keep, recompute, offload };

inline const char* activation_policy_name(ActivationPolicy p) {
  switch (p) {
    case ActivationPolicy::keep: return "keep";
    case ActivationPolicy::recompute: return "recompute";
    case ActivationPolicy::offload: return "offload";
  }
  return "?";
}

}  // namespace lamina
