#include "lamina/kernels/rotary.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

constexpr double kPi = 3.14159265358979323846;

// x rotated as HuggingFace's apply_rotary_pos_emb does, in double: rows of B sequences of
// T positions (the first at pos0), rotating the first `heads` heads of width d; sign -1
// rotates back.
std::vector<double> rotary_reference(std::vector<double> x, int N, int W, int heads, int d, int T, int pos0,
                                     const std::vector<double>& inv_freq, double sign = 1.0) {
  for (int n = 0; n < N; ++n) {
    const int p = pos0 + n % T;
    for (int h = 0; h < heads; ++h) {
      for (int i = 0; i < d / 2; ++i) {
        const double a = p * inv_freq[i], c = std::cos(a), s = sign * std::sin(a);
        double& x1 = x[n * W + h * d + i];
        double& x2 = x[n * W + h * d + i + d / 2];
        const double r1 = x1 * c - x2 * s, r2 = x2 * c + x1 * s;
        x1 = r1;
        x2 = r2;
      }
    }
  }
  return x;
}

TEST(RotaryFrequencies, ArePowersOfThetaAndLlama3ScalingStretchesOnlyTheLongWavelengths) {
  const int d = 128;
  const double theta = 500000.0;
  const auto plain = rotary_inverse_frequencies(d, theta);
  ASSERT_EQ(plain.size(), 64u);
  for (int i = 0; i < 64; ++i) EXPECT_DOUBLE_EQ(plain[i], 1.0 / std::pow(theta, 2.0 * i / d));
  // Llama 3.1's rope_scaling: factor 8, low 1, high 4, original context 8192.
  const RotaryScaling llama31{8.0, 1.0, 4.0, 8192.0};
  const auto scaled = rotary_inverse_frequencies(d, theta, llama31);
  int kept = 0, stretched = 0, blended = 0;
  for (int i = 0; i < 64; ++i) {
    const double wavelen = 2 * kPi / plain[i];
    if (wavelen < 8192.0 / 4.0) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i]) << i;
      ++kept;
    } else if (wavelen > 8192.0 / 1.0) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i] / 8.0) << i;
      ++stretched;
    } else {
      const double smooth = (8192.0 / wavelen - 1.0) / (4.0 - 1.0);
      EXPECT_NEAR(scaled[i], (1 - smooth) * plain[i] / 8.0 + smooth * plain[i], 1e-15 * plain[i]) << i;
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 8.0);
      ++blended;
    }
  }
  // All three regimes occur at Llama 3's head size and theta.
  EXPECT_GT(kept, 0);
  EXPECT_GT(stretched, 0);
  EXPECT_GT(blended, 0);
}

template <class Exec>
class RotaryTest : public ::testing::Test {};
TYPED_TEST_SUITE(RotaryTest, ExecSpaces);

// Grouped-query layout: 4 query heads, 2 key/value heads of width 8 in a row of
// [q | k | v]; 2 sequences of 5 positions starting at position 3; rope theta 10000.
TYPED_TEST(RotaryTest, RotatesQueryAndKeyHeadsAsHuggingFaceAndBackByTheTranspose) {
  using Exec = TypeParam;
  const int H = 4, KV = 2, d = 8, T = 5, B = 2, N = B * T, W = (H + 2 * KV) * d, pos0 = 3;
  const auto inv = rotary_inverse_frequencies(d, 10000.0);
  const RotaryTable<Exec> table(pos0 + T, inv);
  const auto x = random_vector(N * W, 31, -2, 2), dout = random_vector(N * W, 32);
  const auto want = rotary_reference(x, N, W, H + KV, d, T, pos0, inv);
  auto dx = to_device<Exec>(x);
  rotary_apply(Exec(), as_mat<Exec>(dx.data(), N, W), H + KV, T, pos0, table, true);
  const auto got = to_host(dx);
  EXPECT_LT(rel_error(got, want), 1e-6);
  for (int n = 0; n < N; ++n) {
    for (int c = (H + KV) * d; c < W; ++c) EXPECT_EQ(got[n * W + c], x[n * W + c]) << "v is not rotated";
  }
  // The gradient: the transpose rotation of dout, against the reference and finite
  // differences of <rotate(x), dout>.
  auto dd = to_device<Exec>(dout);
  rotary_apply(Exec(), as_mat<Exec>(dd.data(), N, W), H + KV, T, pos0, table, false);
  const auto grad = to_host(dd);
  EXPECT_LT(rel_error(grad, rotary_reference(dout, N, W, H + KV, d, T, pos0, inv, -1.0)), 1e-6);
  auto f = [&](const std::vector<double>& v) {
    auto dv = to_device<Exec>(v);
    rotary_apply(Exec(), as_mat<Exec>(dv.data(), N, W), H + KV, T, pos0, table, true);
    return dot(to_host(dv), dout);
  };
  expect_fd_matches(f, x, grad, "dx", 40);
  // Back and forth is the identity (a rotation).
  rotary_apply(Exec(), as_mat<Exec>(dx.data(), N, W), H + KV, T, pos0, table, false);
  EXPECT_LT(rel_error(to_host(dx), x), 1e-6);
}

// bf16 runs rotate the stored q and k in place: fp32 arithmetic, one rounding.
TYPED_TEST(RotaryTest, Bf16StorageIsRotatedInPlaceWithOneRounding) {
  using Exec = TypeParam;
  const int H = 2, KV = 1, d = 16, T = 7, N = 2 * T, W = (H + 2 * KV) * d;
  const RotaryScaling scaling{8.0, 1.0, 4.0, 16.0};
  const auto inv = rotary_inverse_frequencies(d, 500000.0, scaling);
  const RotaryTable<Exec> table(T, inv);
  const auto x = bf16_values(random_vector(N * W, 41, -3, 3));
  const auto want = rotary_reference(x, N, W, H + KV, d, T, 0, inv);
  auto dx = to_device_bf16<Exec>(x);
  rotary_apply(Exec(), Mat16<Exec>(dx.data(), N, W), H + KV, T, 0, table, true);
  const auto got = widened_to_host(dx);
  for (int i = 0; i < N * W; ++i) EXPECT_NEAR(got[i], want[i], std::abs(want[i]) / 256 + 1e-6) << i;
}

}  // namespace
}  // namespace lamina::test
