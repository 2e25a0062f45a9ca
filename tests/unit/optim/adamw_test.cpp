#include "lamina/optim/adamw.hpp"

#include <gtest/gtest.h>

#include <random>

#include "contraction/adamw_step.hpp"
#include "lamina/optim/grad_norm.hpp"
#include "test_util.hpp"

namespace lamina::test {
namespace {

// torch.optim.AdamW, one element, in double.
struct ScalarAdamW {
  double p, m = 0, v = 0;
  void step(double g, double lr, double b1, double b2, double eps, double wd, int t) {
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
    p -= lr / bc1 * m / (std::sqrt(v) / std::sqrt(bc2) + eps);
  }
};

template <class Exec>
class AdamWTest : public ::testing::Test {};
TYPED_TEST_SUITE(AdamWTest, ExecSpaces);

TYPED_TEST(AdamWTest, MatchesScalarReferenceOverSeveralSteps) {
  using Exec = TypeParam;
  const int n = 1000;
  const double lr = 1e-2, b1 = 0.9, b2 = 0.95, eps = 1e-8, wd = 0.1, clip = 0.5;
  auto p0 = random_vector(n, 81);
  auto dp = to_device<Exec>(p0);
  Vec<Exec> m("m", n), v("v", n);
  std::vector<ScalarAdamW> ref;
  for (double x : p0) ref.push_back({x});
  for (int t = 1; t <= 5; ++t) {
    const auto g = random_vector(n, 100 + t, -2, 2);
    auto dg = to_device<Exec>(g);
    adamw_update(Exec(), dp, m, v, dg, AdamWStep::make(lr, b1, b2, eps, t, clip), static_cast<float>(wd));
    for (int i = 0; i < n; ++i) ref[i].step(g[i] * clip, lr, b1, b2, eps, wd, t);
  }
  std::vector<double> want(n), want_m(n), want_v(n);
  for (int i = 0; i < n; ++i) {
    want[i] = ref[i].p;
    want_m[i] = ref[i].m;
    want_v[i] = ref[i].v;
  }
  EXPECT_LT(rel_error(to_host(dp), want), 1e-6);
  EXPECT_LT(rel_error(to_host(m), want_m), 1e-6);
  EXPECT_LT(rel_error(to_host(v), want_v), 1e-6);
}

TYPED_TEST(AdamWTest, RangeDecaysMatricesAndOptionallyVectors) {
  using Exec = TypeParam;
  // Zero gradients isolate the decay: p -> p (1 - lr wd) where decayed, unchanged elsewhere.
  const int n = 10;
  for (const bool decay_vectors : {false, true}) {
    auto p = to_device<Exec>(std::vector<double>(n, 1.0));
    auto g = to_device<Exec>(std::vector<double>(n, 0.0));
    Vec<Exec> m("m", n), v("v", n);
    const auto r = std::make_pair(2, 8);  // layer elements [2, 8); matrices end at 5
    adamw_update_range(Exec(), Vec<Exec>(Kokkos::subview(p, r)), Vec<Exec>(Kokkos::subview(m, r)),
                       Vec<Exec>(Kokkos::subview(v, r)), ConstVec<Exec>(Kokkos::subview(g, r)), 2, 5,
                       AdamWStep::make(0.5, 0.9, 0.95, 1e-8, 1, 1.0), 0.1f, decay_vectors);
    const auto got = to_host(p);
    for (int i = 0; i < n; ++i) {
      const bool decayed = i >= 2 && i < 8 && (i < 5 || decay_vectors);
      EXPECT_FLOAT_EQ(got[i], decayed ? 0.95f : 1.0f) << i << " decay_vectors=" << decay_vectors;
    }
  }
}

// The update that also writes the bf16 parameters: the same fp32 state, and beside it each
// new value rounded to nearest even, bit for bit what a rounding pass after it would write.
TYPED_TEST(AdamWTest, TheRoundingUpdateWritesTheNewValuesInBf16Too) {
  using Exec = TypeParam;
  const int n = 1001;
  auto p0 = random_vector(n, 5);
  auto g = to_device<Exec>(random_vector(n, 6, -2, 2));
  auto a = to_device<Exec>(p0), b = to_device<Exec>(p0);
  Vec<Exec> ma("ma", n), va("va", n), mb("mb", n), vb("vb", n);
  Bf16Vec<Exec> rounded("rounded", n), want("want", n);
  const AdamWStep step = AdamWStep::make(1e-2, 0.9, 0.95, 1e-8, 2, 0.8);
  adamw_update_range(Exec(), a, ma, va, ConstVec<Exec>(g), 0, 600, step, 0.1f, false);
  adamw_update_range(Exec(), b, mb, vb, ConstVec<Exec>(g), 0, 600, step, 0.1f, false, rounded);
  to_bf16(Exec(), want, ConstVec<Exec>(a));
  EXPECT_EQ(to_host(b), to_host(a));
  EXPECT_EQ(to_host(mb), to_host(ma));
  EXPECT_EQ(to_host(vb), to_host(va));
  const auto r = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rounded);
  const auto w = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), want);
  for (int i = 0; i < n; ++i) ASSERT_EQ(r(i), w(i)) << i;
}

TYPED_TEST(AdamWTest, SumOfSquaresMatchesDoubleSum) {
  using Exec = TypeParam;
  for (const int n : {1, 7, 8, 9, 1001}) {
    const auto x = random_vector(n, 90 + n);
    double want = 0;
    for (double e : x) want += e * e;
    EXPECT_NEAR(sum_of_squares(Exec(), ConstVec<Exec>(to_device<Exec>(x))), want, 1e-6 * want) << n;
  }
}

// The claim that host and device updates give the same bits needs the kernel's arithmetic
// to be what the source says wherever it is compiled: nvcc contracts a * b + c into a fused
// multiply-add by default, g++ does under -ffp-contract=fast (its default outside strict
// ISO modes). The same step compiled with contraction on and with it off must agree to the bit.
TEST(AdamW, TheStepIsTheSameWhetherOrNotTheCompilerContracts) {
#if !LAMINA_CONTRACTION_FLAGS
  GTEST_SKIP() << "this compiler takes no -ffp-contract flags (the test's two translation units are alike)";
#endif
  AdamWState a;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int i = 0; i < 4096; ++i) {
    a.params.push_back(normal(rng));
    a.m.push_back(0.1f * normal(rng));
    a.v.push_back(0.01f * std::fabs(normal(rng)));
    a.grads.push_back(normal(rng));
  }
  AdamWState b = a;
  adamw_step_contract_fast(a);
  adamw_step_contract_off(b);
  EXPECT_EQ(a.params, b.params);
  EXPECT_EQ(a.m, b.m);
  EXPECT_EQ(a.v, b.v);
}

TEST(GradClip, CoefficientOnlyShrinks) {
  EXPECT_DOUBLE_EQ(clip_coefficient(0.5, 1.0), 1.0);
  EXPECT_NEAR(clip_coefficient(4.0, 1.0), 0.25, 1e-6);
  EXPECT_DOUBLE_EQ(clip_coefficient(4.0, 0.0), 1.0);  // disabled
}

}  // namespace
}  // namespace lamina::test
