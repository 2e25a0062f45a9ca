#include "lamina/kernels/bf16.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "../test_util.hpp"

namespace lamina::test {
namespace {

float bits_to_float(std::uint32_t u) {
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// Round to nearest, ties to even, decided in double precision: of the two bf16 values
// around x (upper 16 bits truncated, and the next one away from zero), the nearer.
std::uint16_t reference_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const std::uint16_t down = static_cast<std::uint16_t>(u >> 16), up = static_cast<std::uint16_t>(down + 1);
  const double lo = from_bf16(down);
  // The bf16 above the largest finite one is infinity; for distances it counts as 2^128.
  const double hi = (up & 0x7fffu) == 0x7f80u ? std::copysign(std::ldexp(1.0, 128), x) : from_bf16(up);
  const double dl = std::fabs(static_cast<double>(x) - lo), dh = std::fabs(static_cast<double>(x) - hi);
  if (dl != dh) return dl < dh ? down : up;
  return (down & 1u) == 0 ? down : up;
}

TEST(Bf16, RoundsToNearestEvenLikeAnExactReference) {
  std::mt19937 gen(7);
  std::uniform_int_distribution<std::uint32_t> bits;
  int checked = 0;
  for (int i = 0; i < 2000000; ++i) {
    const float x = bits_to_float(bits(gen));
    if (!std::isfinite(x)) continue;
    ASSERT_EQ(to_bf16(x), reference_bf16(x)) << x;
    ++checked;
  }
  EXPECT_GT(checked, 1900000);
  // Ties: exactly half-way between two bf16 values goes to the even one.
  EXPECT_EQ(to_bf16(bits_to_float(0x3f808000u)), 0x3f80u);  // 1 + 2^-8: tie, 0x3f80 is even
  EXPECT_EQ(to_bf16(bits_to_float(0x3f818000u)), 0x3f82u);  // tie, rounds up to even
  EXPECT_EQ(to_bf16(bits_to_float(0x3f808001u)), 0x3f81u);  // just above the tie
}

TEST(Bf16, KeepsSpecialValuesAndExactOnes) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(from_bf16(to_bf16(inf)), inf);
  EXPECT_EQ(from_bf16(to_bf16(-inf)), -inf);
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isnan(from_bf16(to_bf16(bits_to_float(0x7f800001u)))));  // a NaN whose payload is all low bits
  EXPECT_EQ(from_bf16(to_bf16(std::numeric_limits<float>::max())), inf);   // above the largest bf16: overflows
  for (const float x : {0.0f, -0.0f, 1.0f, -2.5f, 0.15625f, 65536.0f, 3.14159f}) {
    const float back = from_bf16(to_bf16(x));
    EXPECT_NEAR(back, x, std::fabs(x) * 0x1p-8) << x;
    EXPECT_EQ(std::signbit(back), std::signbit(x)) << x;
  }
  EXPECT_EQ(from_bf16(to_bf16(0.15625f)), 0.15625f);  // 8 significant bits: exact
}

template <class Exec>
class Bf16Kernels : public ::testing::Test {};
TYPED_TEST_SUITE(Bf16Kernels, ExecSpaces);

TYPED_TEST(Bf16Kernels, ConvertAndRoundElementwiseLikeTheScalarFunctions) {
  using Exec = TypeParam;
  const std::int64_t n = 10007;
  const std::vector<double> x = random_vector(static_cast<std::size_t>(n), 3, -50.0, 50.0);
  const auto src = to_device<Exec>(x);
  Bf16Vec<Exec> packed("packed", static_cast<std::size_t>(n));
  Vec<Exec> back("back", static_cast<std::size_t>(n));
  const Exec exec;
  to_bf16(exec, packed, ConstVec<Exec>(src));
  from_bf16(exec, back, packed);
  round_to_bf16(exec, Vec<Exec>(src));
  const auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), packed);
  const std::vector<double> b = to_host(back), r = to_host(src);
  for (std::int64_t i = 0; i < n; ++i) {
    const float xi = static_cast<float>(x[static_cast<std::size_t>(i)]);
    ASSERT_EQ(p(i), to_bf16(xi)) << i;
    ASSERT_EQ(b[static_cast<std::size_t>(i)], static_cast<double>(from_bf16(to_bf16(xi)))) << i;
    ASSERT_EQ(r[static_cast<std::size_t>(i)], b[static_cast<std::size_t>(i)]) << i;
  }
}

}  // namespace
}  // namespace lamina::test
