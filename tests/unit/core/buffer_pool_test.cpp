// Pools reuse released buffers of the same size; what they hold idle is free for reuse.
#include "lamina/core/buffer_pool.hpp"

#include <gtest/gtest.h>

namespace lamina::test {
namespace {

TEST(BufferPool, ReusesReleasedBuffersAndCountsIdleBytes) {
  MemoryTracker tracker;
  BufferPool<Kokkos::HostSpace> pool(tracker, MemCategory::communication, "test_pool");
  const std::string space = tier_label(default_tier<Kokkos::HostSpace>());
  float* a = pool.acquire(100);
  float* b = pool.acquire(50);
  EXPECT_EQ(pool.idle_bytes(), 0);
  EXPECT_EQ(tracker.current(space), 4 * 150);
  pool.release(a, 100);
  EXPECT_EQ(pool.idle_bytes(), 4 * 100);
  EXPECT_EQ(pool.acquire(100), a);  // the same buffer again, nothing new allocated
  EXPECT_EQ(tracker.current(space), 4 * 150);
  pool.release(a, 100);
  pool.release(b, 50);
  EXPECT_EQ(pool.idle_bytes(), 4 * 150);
}

}  // namespace
}  // namespace lamina::test
