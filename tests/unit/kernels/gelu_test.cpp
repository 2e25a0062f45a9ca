#include "lamina/kernels/gelu.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

double gelu_ref(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }
double gelu_grad_ref(double x) {
  const double u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
  const double th = std::tanh(u);
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * 0.7978845608028654 * (1.0 + 3.0 * 0.044715 * x * x);
}

template <class Exec>
class GeluTest : public ::testing::Test {};
TYPED_TEST_SUITE(GeluTest, ExecSpaces);

TYPED_TEST(GeluTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int n = 257;
  const auto x = random_vector(n, 7, -6, 6), dout = random_vector(n, 8);
  std::vector<double> want(n), want_grad(n);
  for (int i = 0; i < n; ++i) {
    want[i] = gelu_ref(x[i]);
    want_grad[i] = gelu_grad_ref(x[i]) * dout[i];
  }
  auto dx = to_device<Exec>(x), dd = to_device<Exec>(dout);
  Vec<Exec> out("out", n), dinp("dinp", n);
  gelu_forward(Exec(), out, dx);
  gelu_backward(Exec(), dinp, dx, dd);
  EXPECT_LT(rel_error(to_host(out), want), 1e-6);
  EXPECT_LT(rel_error(to_host(dinp), want_grad), 1e-6);
  auto f = [&](const std::vector<double>& v) {
    auto d = to_device<Exec>(v);
    Vec<Exec> o("o", n);
    gelu_forward(Exec(), o, d);
    return dot(to_host(o), dout);
  };
  expect_fd_matches(f, x, to_host(dinp), "dinp", 40);
}

}  // namespace
}  // namespace lamina::test
