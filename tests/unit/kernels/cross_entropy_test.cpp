#include "lamina/kernels/cross_entropy.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class CrossEntropyTest : public ::testing::Test {};
TYPED_TEST_SUITE(CrossEntropyTest, ExecSpaces);

TYPED_TEST(CrossEntropyTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  using Mem = typename Exec::memory_space;
  const int N = 6, V = 13;
  const auto logits = random_vector(N * V, 51, -4, 4);
  const std::vector<std::int32_t> targets = {0, 12, 5, 5, 7, 1};
  const float scale = 1.0f / N;
  Kokkos::View<std::int32_t*, Kokkos::LayoutRight, Mem> dt("targets", N);
  auto ht = Kokkos::create_mirror_view(dt);
  for (int i = 0; i < N; ++i) ht(i) = targets[i];
  Kokkos::deep_copy(dt, ht);

  std::vector<double> want_loss(N), want_grad(N * V);
  for (int i = 0; i < N; ++i) {
    double mx = -1e300, z = 0;
    for (int j = 0; j < V; ++j) mx = std::max(mx, logits[i * V + j]);
    for (int j = 0; j < V; ++j) z += std::exp(logits[i * V + j] - mx);
    const double lse = mx + std::log(z);
    want_loss[i] = lse - logits[i * V + targets[i]];
    for (int j = 0; j < V; ++j) want_grad[i * V + j] = scale * (std::exp(logits[i * V + j] - lse) - (j == targets[i]));
  }
  auto run = [&](const std::vector<double>& l, Vec<Exec>& dl, Vec<Exec>& lse) {
    dl = to_device<Exec>(l);
    Vec<Exec> losses("losses", N);
    lse = Vec<Exec>("lse", N);
    cross_entropy_forward(Exec(), losses, lse, as_mat<Exec>(dl.data(), N, V), dt);
    return to_host(losses);
  };
  Vec<Exec> dl, lse;
  EXPECT_LT(rel_error(run(logits, dl, lse), want_loss), 1e-6);
  cross_entropy_backward(Exec(), as_mat<Exec>(dl.data(), N, V), as_mat<Exec>(dl.data(), N, V), lse, dt, scale);
  const auto got = to_host(dl);
  EXPECT_LT(rel_error(got, want_grad), 1e-6);
  auto mean_loss = [&](const std::vector<double>& l) {
    Vec<Exec> a, b;
    const auto losses = run(l, a, b);
    double s = 0;
    for (const double x : losses) s += x * scale;
    return s;
  };
  expect_fd_matches(mean_loss, logits, got, "dlogits", 30);
}

}  // namespace
}  // namespace lamina::test
