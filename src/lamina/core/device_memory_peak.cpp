#include "lamina/core/device_memory_peak.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <type_traits>
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace lamina {

namespace {

constexpr bool kSeparateDevice =
#if defined(KOKKOS_ENABLE_CUDA)
    std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>::value;
#else
    false;
#endif

}  // namespace

std::int64_t device_memory_in_use() {
#if defined(KOKKOS_ENABLE_CUDA)
  if (kSeparateDevice) {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) return static_cast<std::int64_t>(total - free);
  }
#endif
  return 0;
}

DeviceMemoryPeak::DeviceMemoryPeak(int period_us) {
  peak_ = device_memory_in_use();
  if (!kSeparateDevice) return;
  int device = 0;
#if defined(KOKKOS_ENABLE_CUDA)
  cudaGetDevice(&device);  // a new thread starts on device 0: sample this rank's
#endif
  thread_ = std::thread([this, period_us, device]() {
#if defined(KOKKOS_ENABLE_CUDA)
    cudaSetDevice(device);
#endif
    while (running_.load(std::memory_order_relaxed)) {
      const std::int64_t used = device_memory_in_use();
      std::int64_t seen = peak_.load(std::memory_order_relaxed);
      while (used > seen && !peak_.compare_exchange_weak(seen, used)) {
      }
      std::this_thread::sleep_for(std::chrono::microseconds(period_us));
    }
  });
}

DeviceMemoryPeak::~DeviceMemoryPeak() { stop(); }

std::int64_t DeviceMemoryPeak::stop() {
  running_ = false;
  if (thread_.joinable()) thread_.join();
  peak_ = std::max(peak_.load(), device_memory_in_use());
  return peak_;
}

}  // namespace lamina
