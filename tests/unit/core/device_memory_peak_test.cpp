#include "lamina/core/device_memory_peak.hpp"

#include <Kokkos_Core.hpp>
#include <chrono>
#include <thread>

#include "test_util.hpp"

namespace lamina::test {
namespace {

TEST(DeviceMemoryPeak, SeesAnAllocationMadeAndFreedWhileItSamples) {
  const std::int64_t before = device_memory_in_use();
  if (before == 0) {
    // A host build: nothing to sample, and the peak says so.
    EXPECT_EQ(DeviceMemoryPeak().stop(), 0);
    return;
  }
  constexpr std::int64_t kBytes = std::int64_t{256} << 20;
  DeviceMemoryPeak peak(100);
  {
    Kokkos::View<char*> v("lamina::test_peak", kBytes);
    Kokkos::fence();
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GE(peak.stop(), before + kBytes);
  EXPECT_LT(device_memory_in_use(), before + kBytes);
}

}  // namespace
}  // namespace lamina::test
