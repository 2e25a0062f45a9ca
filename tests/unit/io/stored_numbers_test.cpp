// float16 conversions: every half value survives a round trip through float, and narrowing
// rounds to nearest-even exactly as a double-precision reference does.
#include "lamina/io/stored_numbers.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

namespace lamina::test {
namespace {

// The nearest half to x, ties to even, computed in double from the half grid.
std::uint16_t reference_half(float xf) {
  const double x = xf;
  if (std::isnan(x)) return 0x7e00;
  const std::uint16_t sign = std::signbit(x) ? 0x8000 : 0;
  const double a = std::fabs(x);
  std::uint16_t best = 0;
  double best_err = INFINITY;
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {  // every finite non-negative half
    const double v = half_to_float(static_cast<std::uint16_t>(h));
    const double err = std::fabs(v - a);
    if (err < best_err || (err == best_err && (h & 1u) == 0)) {
      best_err = err;
      best = static_cast<std::uint16_t>(h);
    }
  }
  // Past the largest half by half an ulp (65520) or more: infinity.
  if (a >= 65520.0) best = 0x7c00;
  return sign | best;
}

TEST(StoredNumbers, EveryHalfSurvivesARoundTripThroughFloat) {
  for (std::uint32_t h = 0; h < 0x10000; ++h) {
    const float f = half_to_float(static_cast<std::uint16_t>(h));
    const bool nan = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
    if (nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      continue;
    }
    EXPECT_EQ(float_to_half(f), h) << "half " << h;
  }
}

TEST(StoredNumbers, NarrowingToHalfRoundsToNearestEven) {
  std::mt19937 gen(7);
  std::uniform_real_distribution<double> exponent(-27.0, 17.0);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  for (int i = 0; i < 400; ++i) {
    const float x = static_cast<float>((i % 2 ? -1.0 : 1.0) * mantissa(gen) * std::exp2(std::floor(exponent(gen))));
    EXPECT_EQ(float_to_half(x), reference_half(x)) << x;
  }
  // Exact ties: between two halves, the even one.
  const float one = 1.0f, tie_up = 1.0f + 3.0f * std::exp2(-11.0f), tie_down = 1.0f + std::exp2(-11.0f);
  EXPECT_EQ(float_to_half(one), 0x3c00);
  EXPECT_EQ(float_to_half(tie_down), 0x3c00);  // 1 + ulp/2: to 1 (even)
  EXPECT_EQ(float_to_half(tie_up), 0x3c02);    // 1 + 3 ulp/2: to 1 + 2 ulp (even)
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);
  EXPECT_EQ(float_to_half(std::exp2(-25.0f)), 0x0000);           // half the smallest subnormal: to 0 (even)
  EXPECT_EQ(float_to_half(std::exp2(-25.0f) * 1.0001f), 0x0001);  // just above: the smallest subnormal
  EXPECT_TRUE(std::isnan(half_to_float(float_to_half(NAN))));
  EXPECT_EQ(float_to_half(-INFINITY), 0xfc00);
}

TEST(StoredNumbers, EncodeAndDecodeEveryType) {
  const float values[] = {0.0f, -1.5f, 3.140625f, 1e-3f, 65504.0f};
  for (const StoredFloat t : {StoredFloat::f32, StoredFloat::f16, StoredFloat::bf16, StoredFloat::f64}) {
    std::vector<std::uint8_t> bytes(5 * static_cast<std::size_t>(stored_size(t)));
    encode_floats(t, values, 5, bytes.data());
    float back[5];
    decode_floats(t, bytes.data(), 5, back);
    EXPECT_EQ(back[0], 0.0f);
    EXPECT_EQ(back[1], -1.5f);  // exact in every type
    EXPECT_NEAR(back[3], 1e-3f, t == StoredFloat::bf16 ? 1e-5 : 1e-6) << safetensors_name(t);
    if (t == StoredFloat::f32 || t == StoredFloat::f64) {
      EXPECT_EQ(back[2], 3.140625f);
    }
  }
}

}  // namespace
}  // namespace lamina::test
