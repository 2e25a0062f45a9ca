#include "lamina/kernels/swiglu.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

double silu_ref(double x) { return x / (1.0 + std::exp(-x)); }
double silu_grad_ref(double x) {
  const double s = 1.0 / (1.0 + std::exp(-x));
  return s * (1.0 + x * (1.0 - s));
}

template <class Exec>
class SwigluTest : public ::testing::Test {};
TYPED_TEST_SUITE(SwigluTest, ExecSpaces);

// fp32 runs: forward in place (the product is the kept pre-activation), backward from it.
TYPED_TEST(SwigluTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int N = 5, F = 37;
  const auto pre = random_vector(N * 2 * F, 7, -8, 8), dout = random_vector(N * F, 8);
  std::vector<double> want(N * F), want_grad(N * 2 * F);
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < F; ++j) {
      const double g = pre[i * 2 * F + j], u = pre[i * 2 * F + F + j], d = dout[i * F + j];
      want[i * F + j] = silu_ref(g) * u;
      want_grad[i * 2 * F + j] = d * u * silu_grad_ref(g);
      want_grad[i * 2 * F + F + j] = d * silu_ref(g);
    }
  }
  auto dpre = to_device<Exec>(pre), dd = to_device<Exec>(dout);
  Vec<Exec> out("out", N * F), dinp("dinp", N * 2 * F);
  const Mat<Exec> pm = as_mat<Exec>(dpre.data(), N, 2 * F);
  swiglu_forward(Exec(), pm, as_mat<Exec>(out.data(), N, F), pm);
  EXPECT_EQ(to_host(dpre), pre);
  EXPECT_LT(rel_error(to_host(out), want), 1e-6);
  swiglu_backward(Exec(), as_mat<Exec>(dinp.data(), N, 2 * F), pm, as_mat<Exec>(dd.data(), N, F));
  EXPECT_LT(rel_error(to_host(dinp), want_grad), 1e-6);
  auto f = [&](const std::vector<double>& v) {
    auto d = to_device<Exec>(v);
    Vec<Exec> o("o", N * F);
    const Mat<Exec> dm = as_mat<Exec>(d.data(), N, 2 * F);
    swiglu_forward(Exec(), dm, as_mat<Exec>(o.data(), N, F), dm);
    return dot(to_host(o), dout);
  };
  expect_fd_matches(f, pre, to_host(dinp), "dpre", 40);
}

// bf16 runs: the fp32 product's halves rounded into bf16 once and kept; the activation
// computed from the kept values and rounded once; the backward reads the kept halves.
TYPED_TEST(SwigluTest, Bf16StorageIsReadAndWrittenAsStored) {
  using Exec = TypeParam;
  const int N = 4, F = 29;
  const auto product = random_vector(N * 2 * F, 17, -6, 6), dout = random_vector(N * F, 18);
  const auto kept = bf16_values(product);
  auto dprod = to_device<Exec>(product), dd = to_device<Exec>(dout);
  Bf16Vec<Exec> pre("pre", N * 2 * F), out("out", N * F);
  Vec<Exec> dinp("dinp", N * 2 * F);
  swiglu_forward(Exec(), Mat16<Exec>(pre.data(), N, 2 * F), Mat16<Exec>(out.data(), N, F),
                 as_mat<Exec>(dprod.data(), N, 2 * F));
  EXPECT_EQ(widened_to_host(pre), kept);
  const auto got = widened_to_host(out);
  std::vector<double> want_grad(N * 2 * F);
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < F; ++j) {
      const double g = kept[i * 2 * F + j], u = kept[i * 2 * F + F + j], d = dout[i * F + j];
      const double want = silu_ref(g) * u;
      EXPECT_NEAR(got[i * F + j], want, std::abs(want) / 256 + 1e-7);
      want_grad[i * 2 * F + j] = d * u * silu_grad_ref(g);
      want_grad[i * 2 * F + F + j] = d * silu_ref(g);
    }
  }
  swiglu_backward(Exec(), as_mat<Exec>(dinp.data(), N, 2 * F), Mat16<Exec>(pre.data(), N, 2 * F),
                  as_mat<Exec>(dd.data(), N, F));
  EXPECT_LT(rel_error(to_host(dinp), want_grad), 1e-6);
}

// Where the product wrote the kept halves itself (rounding products), the activation reads
// them as stored: the same output as from the fp32 product, the halves left as they are.
TYPED_TEST(SwigluTest, TheActivationReadsHalvesTheProductKept) {
  using Exec = TypeParam;
  const int N = 3, F = 31;
  const auto product = random_vector(N * 2 * F, 27, -6, 6);
  auto dprod = to_device<Exec>(product);
  auto kept16 = to_device_bf16<Exec>(bf16_values(product));
  Bf16Vec<Exec> pre("pre", N * 2 * F), out("out", N * F), out2("out2", N * F);
  swiglu_forward(Exec(), Mat16<Exec>(pre.data(), N, 2 * F), Mat16<Exec>(out.data(), N, F),
                 as_mat<Exec>(dprod.data(), N, 2 * F));
  const Mat16<Exec> kept(kept16.data(), N, 2 * F);
  swiglu_forward(Exec(), kept, Mat16<Exec>(out2.data(), N, F), kept);
  EXPECT_EQ(widened_to_host(out2), widened_to_host(out));
  EXPECT_EQ(widened_to_host(kept16), widened_to_host(pre));
}

}  // namespace
}  // namespace lamina::test
