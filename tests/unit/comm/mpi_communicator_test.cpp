#include "lamina/comm/mpi_communicator.hpp"

#include <cmath>

#include <gtest/gtest.h>

#include "lamina/kernels/bf16.hpp"

#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <vector>

namespace lamina {
namespace {

using Vec = Kokkos::View<float*>;

Vec filled(const std::string& label, std::int64_t n, float first) {
  Vec v(label, static_cast<std::size_t>(n));
  auto h = Kokkos::create_mirror_view(v);
  for (std::int64_t i = 0; i < n; ++i) h(static_cast<std::size_t>(i)) = first + static_cast<float>(i);
  Kokkos::deep_copy(v, h);
  return v;
}

std::vector<float> on_host(const Vec& v) {
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  return std::vector<float>(h.data(), h.data() + h.extent(0));
}

// A group of one (a single GPU's run) takes no MPI and no host staging for its float
// collectives: each leaves the result a group of one must have, in the device's memory.
TEST(MpiCommunicator, AGroupOfOneDeliversItsOwnInputInDeviceMemory) {
  MpiCommunicator self(MPI_COMM_SELF, "self");
  ASSERT_EQ(self.size(), 1);
  const std::int64_t n = 1000;
  Vec data = filled("data", n, 1.0f);
  const std::vector<float> before = on_host(data);
  self.allreduce(data.data(), n, ReduceOp::sum);
  self.iallreduce(data.data(), n, ReduceOp::max).wait();
  self.broadcast(data.data(), n, 0);
  EXPECT_EQ(on_host(data), before);

  Vec out = filled("out", n, -5.0f);
  self.reduce_scatter(data.data(), out.data(), n);
  EXPECT_EQ(on_host(out), before);
  Vec gathered = filled("gathered", n, -7.0f);
  Request r = self.iall_gather(data.data(), gathered.data(), n);
  EXPECT_FALSE(r.pending());  // done when it returns: nothing left in flight
  EXPECT_EQ(on_host(gathered), before);
  self.all_gather(data.data(), data.data(), n);  // in place
  EXPECT_EQ(on_host(data), before);
  EXPECT_EQ(self.bytes_sent(), 0);
}

// The reduction a bf16 run's tensor-parallel sums use, applied as MPI applies it: each pair of
// bf16 values summed exactly (fp32 holds any two bf16 values' sum within its rounding to
// bf16's 8 bits) and rounded to nearest even.
TEST(MpiCommunicator, Bf16SumsRoundEachPairToNearestEven) {
  std::vector<std::uint16_t> a, b;
  std::vector<double> exact;
  for (int i = 0; i < 4000; ++i) {
    const float x = std::ldexp(static_cast<float>((i * 7919) % 1000 - 500), (i % 23) - 12);
    const float y = std::ldexp(static_cast<float>((i * 104729) % 997 - 498), (i % 19) - 9);
    a.push_back(to_bf16(x));
    b.push_back(to_bf16(y));
    exact.push_back(static_cast<double>(from_bf16(a.back())) + static_cast<double>(from_bf16(b.back())));
  }
  // Ties: 1 + 2^-8 lies halfway between bf16's 1 and 1 + 2^-7 and goes to the even one, 1;
  // 1 + 3 * 2^-8 goes up to 1 + 2^-6.
  a.push_back(to_bf16(1.0f));
  b.push_back(to_bf16(std::ldexp(1.0f, -8)));
  exact.push_back(1.0 + std::ldexp(1.0, -8));
  a.push_back(to_bf16(1.0f + std::ldexp(1.0f, -7)));
  b.push_back(to_bf16(std::ldexp(1.0f, -8)));
  exact.push_back(1.0 + 3 * std::ldexp(1.0, -8));
  std::vector<std::uint16_t> sum = b;
  ASSERT_EQ(MPI_Reduce_local(a.data(), sum.data(), static_cast<int>(a.size()), MPI_UINT16_T, bf16_sum_op()), MPI_SUCCESS);
  for (std::size_t i = 0; i < sum.size(); ++i) {
    const double got = from_bf16(sum[i]);
    // Nearest: neither neighbour in bf16's bit order lies closer to the exact sum.
    for (const int step : {-1, 1}) {
      const double neighbour = from_bf16(static_cast<std::uint16_t>(sum[i] + step));
      if (!std::isnan(neighbour)) {
        EXPECT_LE(std::fabs(got - exact[i]), std::fabs(neighbour - exact[i])) << i;
      }
    }
  }
  EXPECT_EQ(from_bf16(sum[sum.size() - 2]), 1.0f);
  EXPECT_EQ(from_bf16(sum.back()), 1.0f + std::ldexp(1.0f, -6));
}

TEST(MpiCommunicator, AGroupOfOneLeavesBf16ValuesAsTheyAre) {
  MpiCommunicator self(MPI_COMM_SELF, "self");
  Kokkos::View<std::uint16_t*> v("v", 64);
  Kokkos::deep_copy(v, to_bf16(1.5f));
  self.allreduce_bf16(v.data(), 64);
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), v);
  for (std::size_t i = 0; i < 64; ++i) EXPECT_EQ(h(i), to_bf16(1.5f));
  EXPECT_EQ(self.bytes_sent(), 0);
}

}  // namespace
}  // namespace lamina
