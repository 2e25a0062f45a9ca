#include "lamina/kernels/embedding.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class EmbeddingTest : public ::testing::Test {};
TYPED_TEST_SUITE(EmbeddingTest, ExecSpaces);

template <class Exec>
Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space> device_tokens(
    const std::vector<std::int32_t>& tokens) {
  Kokkos::View<std::int32_t*, Kokkos::LayoutRight, typename Exec::memory_space> d("tok", tokens.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < tokens.size(); ++i) h(i) = tokens[i];
  Kokkos::deep_copy(d, h);
  return d;
}

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
    position_embedding_forward(Exec(), as_mat<Exec>(out.data(), N, C), as_mat<Exec>(dp.data(), T, C), T);
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
  token_embedding_backward(Exec(), as_mat<Exec>(dwte.data(), V, C), as_mat<Exec>(ddout.data(), N, C), dtok, 0);
  position_embedding_backward(Exec(), as_mat<Exec>(dwpe.data(), T, C), as_mat<Exec>(ddout.data(), N, C), T);
  EXPECT_LT(rel_error(to_host(dwte), want_dwte), 1e-6);
  EXPECT_LT(rel_error(to_host(dwpe), want_dwpe), 1e-6);
  expect_fd_matches([&](const std::vector<double>& v) { return dot(run(v, wpe), dout); }, wte, to_host(dwte), "dwte");
  expect_fd_matches([&](const std::vector<double>& v) { return dot(run(wte, v), dout); }, wpe, to_host(dwpe), "dwpe");
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
  Vec<Exec> g("g", V * C);
  token_embedding_backward(Exec(), as_mat<Exec>(g.data(), V, C), as_mat<Exec>(ddout.data(), N, C), dtok, 0);
  Vec<Exec> g2("g2", V * C);
  token_embedding_backward(Exec(), as_mat<Exec>(g2.data(), split, C), as_mat<Exec>(ddout.data(), N, C), dtok, 0);
  token_embedding_backward(Exec(), as_mat<Exec>(g2.data() + split * C, V - split, C), as_mat<Exec>(ddout.data(), N, C),
                           dtok, split);
  EXPECT_EQ(to_host(g), to_host(g2));
}

}  // namespace
}  // namespace lamina::test
