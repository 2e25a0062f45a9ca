#pragma once
// What the device itself reports in use (total minus free: the CUDA context, the vendor
// libraries' handles and workspaces, the loaded kernels and every allocation, lamina's or
// not), and its high-water mark over a stretch of a run, sampled by a thread of its own as
// nvidia-smi would (lamina's memory tracker sees only its own buffers).
#include <atomic>
#include <cstdint>
#include <thread>

namespace lamina {

// Bytes in use on this process's device now; 0 where the default execution space has no
// memory of its own.
std::int64_t device_memory_in_use();

class DeviceMemoryPeak {
 public:
  // Starts sampling every `period_us` microseconds (where there is a device).
  explicit DeviceMemoryPeak(int period_us = 500);
  ~DeviceMemoryPeak();
  DeviceMemoryPeak(const DeviceMemoryPeak&) = delete;
  DeviceMemoryPeak& operator=(const DeviceMemoryPeak&) = delete;
  // Stops sampling (after one last sample) and returns the largest bytes in use seen.
  std::int64_t stop();

 private:
  std::atomic<bool> running_{true};
  std::atomic<std::int64_t> peak_{0};
  std::thread thread_;
};

}  // namespace lamina
