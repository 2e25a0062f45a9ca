#pragma once
// Where a layer's optimizer state lives and where each of its subgroups is updated.
namespace lamina {

// device: fp32 master weights, m and v in device memory, updated there. host: in host
// memory, updated by the host (ZeRO-Offload). dynamic: in host memory, each subgroup
// updated on the host or moved to the device for its update (Deep Optimizer States).
enum class OptimizerPlacement { device, host, dynamic };

enum class UpdateSite { host, device };

inline const char* optimizer_placement_name(OptimizerPlacement p) {
  switch (p) {
    case OptimizerPlacement::device: return "device";
    case OptimizerPlacement::host: return "host";
    case OptimizerPlacement::dynamic: return "dynamic";
  }
  return "?";
}

}  // namespace lamina
