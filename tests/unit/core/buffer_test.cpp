// Tracked buffers: an allocation that cannot be satisfied is the run's failure, named.
#include "lamina/core/buffer.hpp"

#include <gtest/gtest.h>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina::test {
namespace {

TEST(Buffer, AnAllocationThatFailsIsARunErrorNamingWhatAndWhere) {
  MemoryTracker tracker;
  // 4 EiB: more than any address space (or overcommit) grants.
  const std::int64_t n = std::int64_t{1} << 60;
  const std::string bytes = human_bytes(4.0 * static_cast<double>(n));
  try {
    Buffer<float, Kokkos::HostSpace> b(tracker, MemCategory::activations, "lamina::too_big", n, MemTier::host);
    FAIL() << "allocated 4 EiB";
  } catch (const RunError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind("out of memory: allocating " + bytes + " of activations ('lamina::too_big') in " +
                             tier_label(MemTier::host) + " memory failed",
                         0),
              0u)
        << what;
  }
  for (const auto& kv : tracker.current_by_space()) EXPECT_EQ(kv.second, 0) << kv.first;
}

}  // namespace
}  // namespace lamina::test
