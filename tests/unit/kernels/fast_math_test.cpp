#include "lamina/kernels/fast_math.hpp"

#include <gtest/gtest.h>

#include <cmath>

namespace lamina::test {
namespace {

TEST(FastMath, ExpIsWithinFourUlpsOverTheNormalRange) {
  double worst = 0;
  for (int i = -873000; i <= 883000; ++i) {
    const float x = static_cast<float>(i * 1e-4);
    const double want = std::exp(static_cast<double>(x));
    worst = std::max(worst, std::fabs(fast_exp(x) - want) / want);
  }
  EXPECT_LT(worst, 4 * 5.96e-8);
  EXPECT_EQ(fast_exp(0.0f), 1.0f);
  EXPECT_GT(fast_exp(-1000.0f), 0.0f);  // clamped to the smallest normal range, never NaN
  EXPECT_LT(fast_exp(-1000.0f), 1e-37f);
  // A NaN stays one (a non-finite loss must show), and infinities clamp.
  EXPECT_TRUE(std::isnan(fast_exp(std::nanf(""))));
  EXPECT_TRUE(std::isfinite(fast_exp(INFINITY)));
  EXPECT_EQ(fast_exp(-INFINITY), fast_exp(-1000.0f));
}

TEST(FastMath, TanhMatchesTanhEverywhere) {
  double worst = 0;
  for (int i = -200000; i <= 200000; ++i) {
    const float x = static_cast<float>(i * 1e-4);
    worst = std::max(worst, std::fabs(static_cast<double>(fast_tanh(x)) - std::tanh(static_cast<double>(x))));
  }
  EXPECT_LT(worst, 5e-7);
  EXPECT_NEAR(fast_tanh(1e30f), 1.0f, 1e-7);
  EXPECT_NEAR(fast_tanh(-1e30f), -1.0f, 1e-7);
  EXPECT_EQ(fast_tanh(0.0f), 0.0f);
}

}  // namespace
}  // namespace lamina::test
