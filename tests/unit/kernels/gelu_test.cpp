#include "lamina/kernels/gelu.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

double gelu_grad_ref(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

template <class Exec>
class GeluTest : public ::testing::Test {};
TYPED_TEST_SUITE(GeluTest, ExecSpaces);

// Forward with the bias joined in, in place as fp32 runs do: pre += bias, out = gelu(pre);
// backward from pre.
TYPED_TEST(GeluTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int N = 5, F = 53, n = N * F;
  const auto x = random_vector(n, 7, -6, 6), bias = random_vector(F, 9), dout = random_vector(n, 8);
  std::vector<double> want_pre(n), want(n), want_grad(n);
  for (int i = 0; i < n; ++i) {
    want_pre[i] = static_cast<double>(static_cast<float>(x[i]) + static_cast<float>(bias[i % F]));
    want[i] = gelu_reference(want_pre[i]);
    want_grad[i] = gelu_grad_ref(want_pre[i]) * dout[i];
  }
  auto pre = to_device<Exec>(x), dbias = to_device<Exec>(bias), dd = to_device<Exec>(dout);
  Vec<Exec> out("out", n), dinp("dinp", n);
  const Mat<Exec> pm = as_mat<Exec>(pre.data(), N, F);
  bias_gelu_forward(Exec(), pm, as_mat<Exec>(out.data(), N, F), pm, dbias);
  EXPECT_EQ(to_host(pre), want_pre);
  gelu_backward(Exec(), dinp, pre, dd);
  EXPECT_LT(rel_error(to_host(out), want), 1e-6);
  // The derivative multiplies fast_tanh's error (3.6e-7 absolute) by terms up to about 3:
  // measured 9.6e-7 at -O3 and 1.05e-6 at -O1 (the sanitizer builds), where the compiler
  // fuses other multiply-adds.
  EXPECT_LT(rel_error(to_host(dinp), want_grad), 2e-6);
  auto f = [&](const std::vector<double>& v) {
    auto d = to_device<Exec>(v);
    Vec<Exec> o("o", n);
    const Mat<Exec> dm = as_mat<Exec>(d.data(), N, F);
    bias_gelu_forward(Exec(), dm, as_mat<Exec>(o.data(), N, F), dm, dbias);
    return dot(to_host(o), dout);
  };
  expect_fd_matches(f, x, to_host(dinp), "dinp", 40);
}

// bf16 runs: the product's fp32 output in, the pre-activation and activation rounded into
// bf16 storage once; the backward reads the stored pre-activation.
TYPED_TEST(GeluTest, Bf16StorageIsWrittenOnceAndReadAsStored) {
  using Exec = TypeParam;
  const int N = 5, F = 53, n = N * F;
  const auto x = random_vector(n, 17, -6, 6), bias = random_vector(F, 19), dout = random_vector(n, 18);
  std::vector<double> want_pre(n), want(n), want_grad(n);
  for (int i = 0; i < n; ++i) {
    const float pre = static_cast<float>(x[i]) + static_cast<float>(bias[i % F]);
    want_pre[i] = from_bf16(to_bf16(pre));
    want[i] = from_bf16(to_bf16(static_cast<float>(gelu_reference(pre))));
    want_grad[i] = gelu_grad_ref(want_pre[i]) * dout[i];
  }
  auto product = to_device<Exec>(x), dbias = to_device<Exec>(bias), dd = to_device<Exec>(dout);
  Bf16Vec<Exec> pre("pre", n), out("out", n);
  Vec<Exec> dinp("dinp", n);
  bias_gelu_forward(Exec(), Mat16<Exec>(pre.data(), N, F), Mat16<Exec>(out.data(), N, F),
                    as_mat<Exec>(product.data(), N, F), dbias);
  EXPECT_EQ(widened_to_host(pre), want_pre);
  // fast_tanh's error (3.6e-7) can move a value across a bf16 rounding boundary: one step
  // of 2^-8 relative in a few elements at most.
  EXPECT_LT(rel_error(widened_to_host(out), want), 1e-3);
  gelu_backward(Exec(), dinp, pre, dd);
  EXPECT_LT(rel_error(to_host(dinp), want_grad), 2e-6);
  // Where the product wrote the pre-activation with its bias (rounding products), the
  // activation reads it as stored and leaves it as it is.
  std::vector<double> want_from_stored(n);
  for (int i = 0; i < n; ++i) want_from_stored[i] = from_bf16(to_bf16(static_cast<float>(gelu_reference(want_pre[i]))));
  Bf16Vec<Exec> out2("out2", n);
  bias_gelu_forward(Exec(), Mat16<Exec>(pre.data(), N, F), Mat16<Exec>(out2.data(), N, F),
                    Mat16<Exec>(pre.data(), N, F), ConstVec<Exec>());
  EXPECT_EQ(widened_to_host(pre), want_pre);
  EXPECT_LT(rel_error(widened_to_host(out2), want_from_stored), 1e-3);
}

}  // namespace
}  // namespace lamina::test
