// The Deep Optimizer States split on hand-computed cases (the model and stride rule in
// src/lamina/memory/dos_scheduler.hpp).
#include "lamina/memory/dos_scheduler.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace lamina::test {
namespace {

DosModel model(double uh, double ud, double bw) {
  DosModel m;
  m.host_rate = uh;
  m.device_rate = ud;
  m.h2d = bw;
  m.d2h = bw;
  return m;
}

int count_device(const DosPlan& p) {
  int n = 0;
  for (auto s : p.site) n += s == UpdateSite::device;
  return n;
}

TEST(DosScheduler, StrideFollowsThePaperRule) {
  // U_h = 1.5 Gparam/s, B = 25 GB/s, U_d >> U_h: k* = 1 + ceil(0.72) = 2.
  EXPECT_EQ(dos_stride(model(1.5e9, 1e15, 25e9)), 2);
  // 1 + ceil(5e9 (12 / 12e9 + 1 / 2e10)) = 1 + ceil(5.25) = 7.
  EXPECT_EQ(dos_stride(model(5e9, 2e10, 12e9)), 7);
  // A slow link: 1 + ceil(1e9 (12 / 1e9 + 1 / 1e11)) = 1 + ceil(12.01) = 14.
  EXPECT_EQ(dos_stride(model(1e9, 1e11, 1e9)), 14);
  // Contention on the link (gamma = 0.5) doubles its time: 1 + ceil(1.5e9 (12 / 12.5e9)) = 3.
  DosModel m = model(1.5e9, 1e15, 25e9);
  m.contention = 0.5;
  EXPECT_EQ(dos_stride(m), 3);
}

TEST(DosScheduler, EveryKthSubgroupGoesToTheDevice) {
  const std::vector<std::int64_t> sizes(10, 1000);
  const DosPlan p = plan_dos(sizes, model(5e9, 2e10, 12e9), -1, DosSplit::model);  // k = 7
  ASSERT_EQ(p.stride, 7);
  for (std::size_t x = 0; x < sizes.size(); ++x) {
    EXPECT_EQ(p.site[x] == UpdateSite::device, (x + 1) % 7 == 0) << x;
  }
  EXPECT_FALSE(p.memory_limited);
}

TEST(DosScheduler, PredictedTimesAreTheModelsSums) {
  const std::vector<std::int64_t> sizes = {1000000, 1000000, 1000000, 1000000};
  const DosModel m = model(1e9, 1e10, 1e10);
  const DosPlan host = plan_dos(sizes, m, -1, DosSplit::all_host);
  EXPECT_NEAR(host.predicted_seconds, 4e6 / 1e9, 1e-12);  // sum S / U_h
  const DosPlan alt = plan_dos(sizes, m, -1, DosSplit::alternate);
  // Host: 2 subgroups of 1e6 at 1e9/s = 2 ms; device chain: 2 x (12e6 / 1e10 + 1e6 / 1e10 + 12e6 / 1e10) = 5 ms.
  EXPECT_NEAR(alt.predicted_seconds, 5e-3, 1e-12);
  EXPECT_NEAR(alt.all_host_seconds, 4e-3, 1e-12);
  // With nothing concurrent (a host-only build) the two sides add up.
  DosModel serial = m;
  serial.concurrent = false;
  EXPECT_NEAR(plan_dos(sizes, serial, -1, DosSplit::alternate).predicted_seconds, 7e-3, 1e-12);
}

TEST(DosScheduler, AFastDeviceHalvesTheUpdatePhaseAtStrideTwo) {
  // k = 2 with an infinitely fast device and link: the host does half the work (k/(k-1) = 2x).
  const std::vector<std::int64_t> sizes(8, 1 << 20);
  const DosPlan p = plan_dos(sizes, model(1e9, 1e18, 1e18), -1, DosSplit::model);
  EXPECT_EQ(p.stride, 2);
  EXPECT_EQ(count_device(p), 4);
  EXPECT_NEAR(p.all_host_seconds / p.predicted_seconds, 2.0, 1e-6);
}

TEST(DosScheduler, NeverUsesMoreDeviceMemoryThanIsFree) {
  const std::vector<std::int64_t> sizes = {1000, 3000, 2000, 4000};
  const DosModel m = model(1.5e9, 1e15, 25e9);  // k = 2: subgroups 1 and 3 to the device
  const DosPlan enough = plan_dos(sizes, m, 2 * 12 * 4000, DosSplit::model);
  EXPECT_EQ(count_device(enough), 2);
  EXPECT_EQ(enough.device_bytes, 2 * 12 * 4000);  // double-buffered state of the largest
  EXPECT_LE(enough.device_bytes, 2 * 12 * 4000);
  const DosPlan tight = plan_dos(sizes, m, 2 * 12 * 4000 - 1, DosSplit::model);
  EXPECT_EQ(count_device(tight), 0);  // degrades to all-host
  EXPECT_TRUE(tight.memory_limited);
  EXPECT_EQ(tight.device_bytes, 0);
  const DosPlan full = plan_dos(sizes, m, 0, DosSplit::all_device);  // even a forced split
  EXPECT_EQ(count_device(full), 0);
  EXPECT_TRUE(full.memory_limited);
}

TEST(DosScheduler, ForcedSplitsAndTheHostOnlyCase) {
  const std::vector<std::int64_t> sizes(5, 100);
  const DosModel m = model(1e9, 1e10, 1e10);
  EXPECT_EQ(count_device(plan_dos(sizes, m, -1, DosSplit::all_host)), 0);
  EXPECT_EQ(count_device(plan_dos(sizes, m, -1, DosSplit::all_device)), 5);
  const DosPlan alt = plan_dos(sizes, m, -1, DosSplit::alternate);
  EXPECT_EQ(count_device(alt), 2);
  EXPECT_EQ(alt.site[1], UpdateSite::device);
  EXPECT_EQ(alt.site[3], UpdateSite::device);
  EXPECT_EQ(alt.host_params, 300);  // subgroups 0, 2 and 4
  DosModel serial = m;
  serial.concurrent = false;  // a device subgroup would only add its transfers
  EXPECT_EQ(count_device(plan_dos(sizes, serial, -1, DosSplit::model)), 0);
}

}  // namespace
}  // namespace lamina::test
