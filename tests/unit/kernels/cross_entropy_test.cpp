#include "lamina/kernels/cross_entropy.hpp"

#include <cstring>

#include "fd_check.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class CrossEntropyTest : public ::testing::Test {};
TYPED_TEST_SUITE(CrossEntropyTest, ExecSpaces);

// The forward pass on a column block [v0, v1) of the logits, statistics combined over
// blocks as a tensor-parallel group would: returns losses and lse of the full rows.
template <class Exec>
void sharded_forward(const Mat<Exec>& logits, const Tokens<Exec>& targets, const std::vector<int>& cuts,
                     Vec<Exec>& losses, Vec<Exec>& lse) {
  const std::int64_t N = logits.extent(0), V = logits.extent(1);
  std::vector<double> gmax(N, -1e300), gsum(N, 0.0), gtarget(N, 0.0);
  std::vector<Mat<Exec>> shards;
  for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
    Mat<Exec> shard("shard", N, cuts[s + 1] - cuts[s]);
    auto hs = Kokkos::create_mirror_view(shard);
    auto hl = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), logits);
    for (std::int64_t i = 0; i < N; ++i)
      for (int j = cuts[s]; j < cuts[s + 1]; ++j) hs(i, j - cuts[s]) = hl(i, j);
    Kokkos::deep_copy(shard, hs);
    shards.push_back(shard);
    Vec<Exec> mx("mx", N);
    cross_entropy_row_max(Exec(), mx, shard);
    const auto h = to_host(mx);
    for (std::int64_t i = 0; i < N; ++i) gmax[i] = std::max(gmax[i], h[i]);
  }
  auto dmax = to_device<Exec>(gmax);
  for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
    Vec<Exec> sum("sum", N), tl("tl", N);
    cross_entropy_row_sumexp(Exec(), sum, shards[s], dmax);
    cross_entropy_target_logit(Exec(), tl, shards[s], targets, cuts[s]);
    const auto hs = to_host(sum), ht = to_host(tl);
    for (std::int64_t i = 0; i < N; ++i) {
      gsum[i] += hs[i];
      gtarget[i] += ht[i];
    }
  }
  losses = Vec<Exec>("losses", N);
  lse = Vec<Exec>("lse", N);
  cross_entropy_forward(Exec(), losses, lse, dmax, to_device<Exec>(gsum), to_device<Exec>(gtarget));
  (void)V;
}

// One process's single pass gives the two kernels' row statistics bit for bit (rows of
// lengths that are and are not multiples of a reduction's block of eight).
TYPED_TEST(CrossEntropyTest, RowStatsInOnePassEqualTheMaximumThenTheSums) {
  using Exec = TypeParam;
  for (const int V : {13, 64, 1000}) {
    const int N = 5;
    auto dl = to_device<Exec>(random_vector(N * V, 7 + V, -30, 30));
    const ConstMat<Exec> logits = as_mat<Exec>(dl.data(), N, V);
    Vec<Exec> mx("mx", N), sum("sum", N), mx1("mx1", N), sum1("sum1", N);
    cross_entropy_row_max(Exec(), mx, logits);
    cross_entropy_row_sumexp(Exec(), sum, logits, mx);
    cross_entropy_row_stats(Exec(), mx1, sum1, logits);
    EXPECT_EQ(to_host(mx1), to_host(mx)) << V;
    EXPECT_EQ(to_host(sum1), to_host(sum)) << V;
  }
}

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
  // One shard (a single process) and three uneven shards give the same result.
  for (const auto& cuts : {std::vector<int>{0, V}, std::vector<int>{0, 4, 9, V}}) {
    auto dl = to_device<Exec>(logits);
    Vec<Exec> losses, lse;
    sharded_forward<Exec>(as_mat<Exec>(dl.data(), N, V), dt, cuts, losses, lse);
    EXPECT_LT(rel_error(to_host(losses), want_loss), 1e-6);
    std::vector<double> got(N * V);
    for (std::size_t s = 0; s + 1 < cuts.size(); ++s) {
      const int w = cuts[s + 1] - cuts[s];
      std::vector<double> part(N * w);
      for (int i = 0; i < N; ++i)
        for (int j = 0; j < w; ++j) part[i * w + j] = logits[i * V + cuts[s] + j];
      auto dp = to_device<Exec>(part);
      cross_entropy_backward(Exec(), as_mat<Exec>(dp.data(), N, w), as_mat<Exec>(dp.data(), N, w), lse, dt, cuts[s],
                             scale);
      const auto hp = to_host(dp);
      for (int i = 0; i < N; ++i)
        for (int j = 0; j < w; ++j) got[i * V + cuts[s] + j] = hp[i * w + j];
    }
    EXPECT_LT(rel_error(got, want_grad), 1e-6);
    auto mean_loss = [&](const std::vector<double>& l) {
      auto d = to_device<Exec>(l);
      Vec<Exec> a, b;
      sharded_forward<Exec>(as_mat<Exec>(d.data(), N, V), dt, cuts, a, b);
      double s = 0;
      for (const double x : to_host(a)) s += x * scale;
      return s;
    };
    expect_fd_matches(mean_loss, logits, got, "dlogits", 30);
  }
}

// Targets of five rows against a vocabulary shard of V columns from `begin`: in a row's first
// block, its last element, and before or past the shard's columns.
template <class Exec>
Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space> shard_targets(int V, int begin) {
  Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space> dt("targets", 5);
  auto ht = Kokkos::create_mirror_view(dt);
  const int targets[5] = {begin + 3, begin + 10, begin + V - 1, begin - 1, begin + V};
  for (int i = 0; i < 5; ++i) ht(i) = targets[i];
  Kokkos::deep_copy(dt, ht);
  return dt;
}

// bf16 runs whose products read the gradient as stored: each row's gradients rounded into
// the first half of the row's own memory, bit for bit what rounding cross_entropy_backward's
// output gives. Rows long enough for a device team to take several blocks of them and a
// host several chunks (the last one partial); shard_targets' targets.
TYPED_TEST(CrossEntropyTest, Bf16BackwardRoundsTheGradientIntoItsOwnRow) {
  using Exec = TypeParam;
  for (const int V : {13, 1000, 2500}) {
    SCOPED_TRACE(V);
    const int N = 5, begin = 2;
    const auto logits = random_vector(N * V, 52, -4, 4);
    const auto dt = shard_targets<Exec>(V, begin);
    auto dl = to_device<Exec>(logits);
    Vec<Exec> losses, lse;
    sharded_forward<Exec>(as_mat<Exec>(dl.data(), N, V), dt, {0, V}, losses, lse);
    auto want = to_device<Exec>(logits);
    cross_entropy_backward(Exec(), as_mat<Exec>(want.data(), N, V), as_mat<Exec>(want.data(), N, V), lse, dt, begin,
                           0.2f);
    cross_entropy_backward_bf16(Exec(), as_mat<Exec>(dl.data(), N, V), lse, dt, begin, 0.2f);
    const auto w = to_host(want);
    const Bf16Vec<Exec> got16(reinterpret_cast<std::uint16_t*>(dl.data()), static_cast<std::size_t>(2 * N * V));
    auto got = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got16);
    int wrong = 0;
    for (int i = 0; i < N; ++i) {
      for (int j = 0; j < V; ++j) wrong += got(2 * i * V + j) != to_bf16(static_cast<float>(w[i * V + j]));
    }
    EXPECT_EQ(wrong, 0);
  }
}

// A training step's forward pass over the logits that also writes their gradient (llm.c's
// fused classifier): the statistics, target logits and gradient the separate passes give, bit
// for bit, in fp32 and rounded to bf16 into each row's first half; shard_targets' targets.
TYPED_TEST(CrossEntropyTest, StatsAndGradientInOnePassEqualTheSeparatePasses) {
  using Exec = TypeParam;
  for (const int V : {13, 1000, 2500}) {
    SCOPED_TRACE(V);
    const int N = 5, begin = 2;
    const float scale = 0.2f;
    const auto logits = random_vector(N * V, 53, -4, 4);
    const auto dt = shard_targets<Exec>(V, begin);
    // The separate passes: statistics, target logits, the loss's log-sum-exp, then backward.
    auto want = to_device<Exec>(logits), want16 = to_device<Exec>(logits);
    const Mat<Exec> w = as_mat<Exec>(want.data(), N, V);
    Vec<Exec> mx("mx", N), sum("sum", N), tl("tl", N), losses("losses", N), lse("lse", N);
    cross_entropy_row_stats(Exec(), mx, sum, w);
    cross_entropy_target_logit(Exec(), tl, w, dt, begin);
    cross_entropy_forward(Exec(), losses, lse, mx, sum, tl);
    cross_entropy_backward(Exec(), w, w, lse, dt, begin, scale);
    cross_entropy_backward_bf16(Exec(), as_mat<Exec>(want16.data(), N, V), lse, dt, begin, scale);
    for (const bool bf16 : {false, true}) {
      SCOPED_TRACE(bf16 ? "bf16" : "fp32");
      auto got = to_device<Exec>(logits);
      Vec<Exec> mx1("mx1", N), sum1("sum1", N), tl1("tl1", N);
      cross_entropy_stats_and_gradient(Exec(), mx1, sum1, tl1, as_mat<Exec>(got.data(), N, V), dt, begin, scale, bf16);
      EXPECT_EQ(to_host(mx1), to_host(mx));
      EXPECT_EQ(to_host(sum1), to_host(sum));
      EXPECT_EQ(to_host(tl1), to_host(tl));
      int wrong = 0;
      if (bf16) {  // the first half of each row's memory, as bits
        auto bits = [&](const auto& v) {
          const Bf16Vec<Exec> b(reinterpret_cast<std::uint16_t*>(v.data()), static_cast<std::size_t>(2 * N * V));
          return Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), b);
        };
        const auto g = bits(got), r = bits(want16);
        for (int i = 0; i < N; ++i) {
          for (int j = 0; j < V; ++j) wrong += g(2 * i * V + j) != r(2 * i * V + j);
        }
      } else {
        const auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), got);
        const auto r = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), want);
        for (int k = 0; k < N * V; ++k) wrong += std::memcmp(&g(k), &r(k), sizeof(float)) != 0;
      }
      EXPECT_EQ(wrong, 0);
    }
  }
}

}  // namespace
}  // namespace lamina::test
