#pragma once
// The memory this process can really use, so that a run that cannot fit is refused before
// it starts instead of dying in an allocation (or by the kernel's OOM killer) mid-run.
#include <cstdint>
#include <string>

namespace lamina {

struct SystemMemory {
  std::int64_t host_limit = 0;      // bytes: physical memory, or the cgroup's limit when lower
  std::string host_limit_source;    // "physical memory" or the cgroup file that sets the limit
  std::int64_t host_available = 0;  // bytes free now (MemAvailable)
  bool separate_device = false;     // the default execution space has memory of its own (a GPU)
  std::int64_t device_free = 0;     // bytes free on this rank's device now (separate_device only)
  std::int64_t device_total = 0;
};

// Reads /proc/meminfo, the cgroup (v2 memory.max, v1 memory.limit_in_bytes) and, on a GPU,
// the device's free memory.
SystemMemory system_memory();

// Host allocations outside the tracked buffers (scratch vectors of initialization,
// checkpoints, conversion, data) throw std::bad_alloc, which says nothing. Once installed,
// a failing one first notes this process's mapped and resident bytes, as they were then
// (the unwinding frees much of it); host_allocation_failure() says what was noted, with the
// address-space limit (ulimit -v) and the host's available memory.
void watch_host_allocations();
std::string host_allocation_failure();

}  // namespace lamina
