#pragma once
namespace lamina {

// Where a buffer lives in the memory hierarchy: next to the compute (the default
// execution space's memory) or in host memory that the compute reaches by copies.
// Parameters are placed per layer in one tier or the other (ZeRO-Infinity's offload).
enum class MemTier { device, host };

inline const char* mem_tier_name(MemTier t) { return t == MemTier::device ? "device" : "host"; }

}  // namespace lamina
