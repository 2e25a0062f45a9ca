// Version-dependent spellings: zero_fill zeroes exactly the view it is given, contiguous
// (memset on a host under Kokkos 3) or strided (Kokkos's fill), and nothing around it.
#include "lamina/core/kokkos_compat.hpp"

#include <gtest/gtest.h>

namespace lamina::test {
namespace {

TEST(ZeroFill, ZeroesTheViewAndNothingAroundIt) {
  Kokkos::View<float*, Kokkos::HostSpace> all("all", 40);
  Kokkos::deep_copy(all, 7.0f);
  const Kokkos::DefaultHostExecutionSpace exec;
  zero_fill(exec, Kokkos::subview(all, std::pair<int, int>(3, 17)));
  exec.fence();
  for (int i = 0; i < 40; ++i) EXPECT_EQ(all(i), i >= 3 && i < 17 ? 0.0f : 7.0f) << i;
}

TEST(ZeroFill, ZeroesAStridedViewElementByElement) {
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> m("m", 4, 5);
  Kokkos::deep_copy(m, 3.0f);
  const Kokkos::DefaultHostExecutionSpace exec;
  const auto column = Kokkos::subview(m, Kokkos::ALL, 2);  // stride 5: not contiguous
  ASSERT_FALSE(column.span_is_contiguous());
  zero_fill(exec, column);
  exec.fence();
  for (int i = 0; i < 4; ++i) {
    for (int j = 0; j < 5; ++j) EXPECT_EQ(m(i, j), j == 2 ? 0.0f : 3.0f) << i << ", " << j;
  }
}

}  // namespace
}  // namespace lamina::test
