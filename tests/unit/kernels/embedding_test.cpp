#include "lamina/kernels/embedding.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

template <class Exec>
Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space> device_tokens(
    const std::vector<std::int32_t>& tokens) {
  Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space> d("tok", tokens.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < tokens.size(); ++i) h(i) = tokens[i];
  Kokkos::deep_copy(d, h);
  return d;
}

// The token embedding's backward input: positions grouped by token, as the executor builds them.
template <class Exec>
struct DeviceRuns {
  Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space> order, starts;
  std::int64_t runs = 0;
  TokenRuns<Exec> get() const { return {order, starts, runs}; }
};
template <class Exec>
DeviceRuns<Exec> device_runs(const std::vector<std::int32_t>& tokens) {
  const std::int64_t n = static_cast<std::int64_t>(tokens.size());
  std::vector<std::int32_t> order(static_cast<std::size_t>(n)), starts(static_cast<std::size_t>(n + 1));
  DeviceRuns<Exec> r;
  r.runs = build_token_runs(tokens.data(), n, order.data(), starts.data());
  r.order = device_tokens<Exec>(order);
  r.starts = device_tokens<Exec>(starts);
  return r;
}

template <class Exec>
class EmbeddingTest : public ::testing::Test {};
TYPED_TEST_SUITE(EmbeddingTest, ExecSpaces);

TYPED_TEST(EmbeddingTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int B = 3, T = 4, C = 5, V = 7, N = B * T;
  const std::vector<std::int32_t> tokens = {1, 3, 3, 0, 6, 1, 1, 2, 5, 3, 0, 4};  // repeats exercise accumulation
  const auto wte = random_vector(V * C, 11), wpe = random_vector(T * C, 12), dout = random_vector(N * C, 13);
  auto dtok = device_tokens<Exec>(tokens);
  auto run = [&](const std::vector<double>& e, const std::vector<double>& p) {
    auto de = to_device<Exec>(e), dp = to_device<Exec>(p);
    Vec<Exec> out("out", N * C);
    token_embedding_forward(Exec(), as_mat<Exec>(out.data(), N, C), dtok, as_mat<Exec>(de.data(), V, C), 0);
    position_embedding_forward(Exec(), as_mat<Exec>(out.data(), N, C), as_mat<Exec>(dp.data(), T, C),
                               ContextChunks{T});
    return to_host(out);
  };
  std::vector<double> want(N * C), want_dwte(V * C, 0.0), want_dwpe(T * C, 0.0);
  for (int i = 0; i < N; ++i) {
    for (int c = 0; c < C; ++c) {
      want[i * C + c] = wte[tokens[i] * C + c] + wpe[(i % T) * C + c];
      want_dwte[tokens[i] * C + c] += dout[i * C + c];
      want_dwpe[(i % T) * C + c] += dout[i * C + c];
    }
  }
  EXPECT_LT(rel_error(run(wte, wpe), want), 1e-7);

  auto ddout = to_device<Exec>(dout);
  Vec<Exec> dwte("dwte", V * C), dwpe("dwpe", T * C);
  const DeviceRuns<Exec> runs = device_runs<Exec>(tokens);
  token_embedding_backward(Exec(), as_mat<Exec>(dwte.data(), V, C), as_mat<Exec>(ddout.data(), N, C), dtok,
                           runs.get(), 0);
  position_embedding_backward(Exec(), as_mat<Exec>(dwpe.data(), T, C), as_mat<Exec>(ddout.data(), N, C),
                              ContextChunks{T});
  EXPECT_LT(rel_error(to_host(dwte), want_dwte), 1e-6);
  EXPECT_LT(rel_error(to_host(dwpe), want_dwpe), 1e-6);
  expect_fd_matches([&](const std::vector<double>& v) { return dot(run(v, wpe), dout); }, wte, to_host(dwte), "dwte");
  expect_fd_matches([&](const std::vector<double>& v) { return dot(run(wte, v), dout); }, wpe, to_host(dwpe), "dwpe");
}

// A context-parallel rank's rows (T = 8 over cp 2: rank 1 holds positions 2-5) read and
// accumulate their positions' rows of the table; the other rows get no gradient.
TYPED_TEST(EmbeddingTest, AContextParallelRankUsesItsRowsPositions) {
  using Exec = TypeParam;
  const int B = 2, T = 8, C = 3, R = 4, N = B * R;
  const ContextChunks where{T, 2, 1};
  const auto wpe = random_vector(T * C, 21), dout = random_vector(N * C, 22);
  auto dp = to_device<Exec>(wpe), dd = to_device<Exec>(dout);
  Vec<Exec> out("out", N * C), dwpe("dwpe", T * C);
  position_embedding_forward(Exec(), as_mat<Exec>(out.data(), N, C), as_mat<Exec>(dp.data(), T, C), where);
  position_embedding_backward(Exec(), as_mat<Exec>(dwpe.data(), T, C), as_mat<Exec>(dd.data(), N, C), where);
  std::vector<double> want(N * C), want_dwpe(T * C, 0.0);
  for (int i = 0; i < N; ++i) {
    for (int c = 0; c < C; ++c) {
      const int position = 2 + i % R;
      want[i * C + c] = wpe[position * C + c];
      want_dwpe[position * C + c] += dout[i * C + c];
    }
  }
  EXPECT_EQ(to_host(out), want);
  EXPECT_LT(rel_error(to_host(dwpe), want_dwpe), 1e-7);
  for (const int untouched : {0, 1, 6, 7}) EXPECT_EQ(to_host(dwpe)[untouched * C], 0.0);
}

TYPED_TEST(EmbeddingTest, VocabularyShardsSumToTheFullTable) {
  using Exec = TypeParam;
  const int N = 12, C = 5, V = 7, split = 4;
  const std::vector<std::int32_t> tokens = {1, 3, 3, 0, 6, 1, 1, 2, 5, 3, 0, 4};
  const auto wte = random_vector(V * C, 14), dout = random_vector(N * C, 15);
  auto dtok = device_tokens<Exec>(tokens);
  auto dwte_full = to_device<Exec>(wte), ddout = to_device<Exec>(dout);
  Vec<Exec> full("full", N * C), a("a", N * C), b("b", N * C);
  token_embedding_forward(Exec(), as_mat<Exec>(full.data(), N, C), dtok, as_mat<Exec>(dwte_full.data(), V, C), 0);
  token_embedding_forward(Exec(), as_mat<Exec>(a.data(), N, C), dtok, as_mat<Exec>(dwte_full.data(), split, C), 0);
  token_embedding_forward(Exec(), as_mat<Exec>(b.data(), N, C), dtok,
                          as_mat<Exec>(dwte_full.data() + split * C, V - split, C), split);
  const auto hf = to_host(full), ha = to_host(a), hb = to_host(b);
  for (int i = 0; i < N * C; ++i) EXPECT_EQ(hf[i], ha[i] + hb[i]);
  const DeviceRuns<Exec> runs = device_runs<Exec>(tokens);
  Vec<Exec> g("g", V * C);
  token_embedding_backward(Exec(), as_mat<Exec>(g.data(), V, C), as_mat<Exec>(ddout.data(), N, C), dtok, runs.get(), 0);
  Vec<Exec> g2("g2", V * C);
  token_embedding_backward(Exec(), as_mat<Exec>(g2.data(), split, C), as_mat<Exec>(ddout.data(), N, C), dtok,
                           runs.get(), 0);
  token_embedding_backward(Exec(), as_mat<Exec>(g2.data() + split * C, V - split, C), as_mat<Exec>(ddout.data(), N, C),
                           dtok, runs.get(), split);
  EXPECT_EQ(to_host(g), to_host(g2));
}

// The one-pass lookup (embedding_forward) into fp32 and into bf16: bit for bit the token and
// position passes (and, into bf16, the rounding of their fp32 sum), for fp32 and bf16 tables,
// with learned positions at a context-parallel rank's rows and without (rotary), for a shard
// of the vocabulary (ids outside it: zeros, plus the position).
TYPED_TEST(EmbeddingTest, OnePassLookupIsThePassesItReplaces) {
  using Exec = TypeParam;
  const int B = 2, T = 8, C = 5, R = 4, N = B * R, V = 7, begin = 2;
  const ContextChunks where{T, 2, 1};
  const std::vector<std::int32_t> tokens = {1, 3, 3, 0, 6, 8, 2, 5};
  const auto wte = bf16_values(random_vector(V * C, 31)), wpe = bf16_values(random_vector(T * C, 32));
  auto dtok = device_tokens<Exec>(tokens);
  auto te = to_device<Exec>(wte), tp = to_device<Exec>(wpe);
  auto te16 = to_device_bf16<Exec>(wte), tp16 = to_device_bf16<Exec>(wpe);
  for (const bool bf16_tables : {false, true}) {
    for (const bool learned : {true, false}) {
      SCOPED_TRACE(std::string(bf16_tables ? "bf16" : "fp32") + " tables, " + (learned ? "learned" : "no") +
                   " positions");
      const MatRef<Exec> e = bf16_tables ? MatRef<Exec>(ConstMat16<Exec>(te16.data(), V, C))
                                         : MatRef<Exec>(as_mat<Exec>(te.data(), V, C));
      const MatRef<Exec> p = !learned     ? MatRef<Exec>()
                             : bf16_tables ? MatRef<Exec>(ConstMat16<Exec>(tp16.data(), T, C))
                                           : MatRef<Exec>(as_mat<Exec>(tp.data(), T, C));
      Vec<Exec> passes("passes", N * C), fused("fused", N * C);
      Kokkos::View<std::uint16_t*, typename Exec::memory_space> rounded("rounded", N * C), fused16("fused16", N * C);
      token_embedding_forward(Exec(), as_mat<Exec>(passes.data(), N, C), dtok, e, begin);
      if (learned) position_embedding_forward(Exec(), as_mat<Exec>(passes.data(), N, C), p, where);
      to_bf16(Exec(), Bf16Vec<Exec>(rounded.data(), N * C), ConstVec<Exec>(passes));
      embedding_forward(Exec(), as_mat<Exec>(fused.data(), N, C), dtok, e, p, where, 0, begin);
      embedding_forward(Exec(), Mat16<Exec>(fused16.data(), N, C), dtok, e, p, where, 0, begin);
      const auto want = to_host(passes), got = to_host(fused);
      EXPECT_EQ(got, want);
      auto r = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), rounded);
      auto f = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), fused16);
      for (int k = 0; k < N * C; ++k) ASSERT_EQ(f(k), r(k)) << k;
      for (int i = 0; i < N; ++i) {
        const int row = tokens[i] - begin;
        const double token = row >= 0 && row < V ? wte[row * C] : 0.0;
        EXPECT_NEAR(want[i * C], token + (learned ? wpe[(2 + i % R) * C] : 0.0), 1e-6) << i;
      }
    }
  }
}

// Positions grouped by token: every position once, each run one token in position order.
TEST(TokenRuns, GroupEveryPositionByTokenInPositionOrder) {
  const std::vector<std::int32_t> tokens = {5, 1, 5, 5, 0, 1, 9, 0, 5};
  std::vector<std::int32_t> order(tokens.size()), starts(tokens.size() + 1);
  const std::int64_t runs = build_token_runs(tokens.data(), static_cast<std::int64_t>(tokens.size()), order.data(),
                                             starts.data());
  EXPECT_EQ(runs, 4);
  EXPECT_EQ(order, (std::vector<std::int32_t>{4, 7, 1, 5, 0, 2, 3, 8, 6}));
  EXPECT_EQ(std::vector<std::int32_t>(starts.begin(), starts.begin() + runs + 1), (std::vector<std::int32_t>{0, 2, 4, 8, 9}));
  // One token everywhere: one run over all positions.
  const std::vector<std::int32_t> same(6, 3);
  EXPECT_EQ(build_token_runs(same.data(), 6, order.data(), starts.data()), 1);
}

}  // namespace
}  // namespace lamina::test
