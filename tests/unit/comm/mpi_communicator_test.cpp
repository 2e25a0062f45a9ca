#include "lamina/comm/mpi_communicator.hpp"

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
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

}  // namespace
}  // namespace lamina
