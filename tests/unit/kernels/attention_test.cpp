#include "lamina/kernels/attention.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

// Naive double-precision causal attention on qkv (B*T, 3C): returns out (B*T, C) and,
// given dout, dqkv.
void attention_reference(const std::vector<double>& qkv, const std::vector<double>& dout, int B, int T, int C, int NH,
                         std::vector<double>& out, std::vector<double>& dqkv) {
  const int hd = C / NH;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  out.assign(B * T * C, 0.0);
  dqkv.assign(B * T * 3 * C, 0.0);
  auto at = [&](int b, int t, int part, int h, int d) { return (b * T + t) * 3 * C + part * C + h * hd + d; };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      std::vector<double> P(T * T, 0.0), dP(T * T, 0.0);
      for (int t = 0; t < T; ++t) {
        double mx = -1e300;
        std::vector<double> s(T, 0.0);
        for (int j = 0; j <= t; ++j) {
          for (int d = 0; d < hd; ++d) s[j] += qkv[at(b, t, 0, h, d)] * qkv[at(b, j, 1, h, d)] * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += std::exp(s[j] - mx);
        for (int j = 0; j <= t; ++j) P[t * T + j] = std::exp(s[j] - mx) / z;
        for (int d = 0; d < hd; ++d) {
          double y = 0;
          for (int j = 0; j <= t; ++j) y += P[t * T + j] * qkv[at(b, j, 2, h, d)];
          out[(b * T + t) * C + h * hd + d] = y;
        }
      }
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j <= t; ++j) {
          for (int d = 0; d < hd; ++d) {
            const double dy = dout[(b * T + t) * C + h * hd + d];
            dP[t * T + j] += dy * qkv[at(b, j, 2, h, d)];
            dqkv[at(b, j, 2, h, d)] += P[t * T + j] * dy;
          }
        }
        double dotp = 0;
        for (int j = 0; j <= t; ++j) dotp += P[t * T + j] * dP[t * T + j];
        for (int j = 0; j <= t; ++j) {
          const double dS = P[t * T + j] * (dP[t * T + j] - dotp) * scale;
          for (int d = 0; d < hd; ++d) {
            dqkv[at(b, t, 0, h, d)] += dS * qkv[at(b, j, 1, h, d)];
            dqkv[at(b, j, 1, h, d)] += dS * qkv[at(b, t, 0, h, d)];
          }
        }
      }
    }
  }
}

template <class Exec>
class AttentionTest : public ::testing::Test {};
TYPED_TEST_SUITE(AttentionTest, ExecSpaces);

TYPED_TEST(AttentionTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int B = 2, T = 5, C = 8, NH = 2, hd = C / NH, N = B * T, BNH = B * NH;
  const auto qkv = random_vector(N * 3 * C, 41, -1.5, 1.5), dout = random_vector(N * C, 42);
  std::vector<double> want, want_dqkv;
  attention_reference(qkv, dout, B, T, C, NH, want, want_dqkv);

  Vec<Exec> q("q", N * C), k("k", N * C), v("v", N * C), att("att", BNH * T * T), y("y", N * C), out("out", N * C);
  auto heads = [&](const Vec<Exec>& s) { return as_mats<Exec>(s.data(), BNH, T, hd); };
  auto run = [&](const std::vector<double>& in) {
    auto d = to_device<Exec>(in);
    attention_forward(Exec(), as_mat<Exec>(out.data(), N, C), heads(q), heads(k), heads(v),
                      as_mats<Exec>(att.data(), BNH, T, T), heads(y), as_mat<Exec>(d.data(), N, 3 * C), NH);
    return to_host(out);
  };
  EXPECT_LT(rel_error(run(qkv), want), 1e-6);

  auto dd = to_device<Exec>(dout);
  Vec<Exec> dqkv("dqkv", N * 3 * C), dq("dq", N * C), dk("dk", N * C), dv("dv", N * C), dy("dy", N * C),
      datt("datt", BNH * T * T);
  attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, 3 * C), heads(dq), heads(dk), heads(dv),
                     as_mats<Exec>(datt.data(), BNH, T, T), heads(dy), as_mat<Exec>(dd.data(), N, C), heads(q),
                     heads(k), heads(v), as_mats<Exec>(att.data(), BNH, T, T), NH);
  const auto got = to_host(dqkv);
  EXPECT_LT(rel_error(got, want_dqkv), 1e-5);
  expect_fd_matches([&](const std::vector<double>& in) { return dot(run(in), dout); }, qkv, got, "dqkv", 30);
}

// Long enough for the host path's row blocks of 64 (two whole, one partial); the score
// buffers start as NaN, so reading any entry the causal products skip would show.
TYPED_TEST(AttentionTest, LongSequencesMatchDoubleReferenceWithoutReadingMaskedScores) {
  using Exec = TypeParam;
  const int B = 1, T = 150, C = 16, NH = 2, hd = C / NH, N = B * T, BNH = B * NH;
  const auto qkv = random_vector(N * 3 * C, 45, -1.5, 1.5), dout = random_vector(N * C, 46);
  std::vector<double> want, want_dqkv;
  attention_reference(qkv, dout, B, T, C, NH, want, want_dqkv);
  const std::vector<double> nan(BNH * T * T, std::nan(""));
  auto att = to_device<Exec>(nan), datt = to_device<Exec>(nan), dqkv_in = to_device<Exec>(qkv),
       dd = to_device<Exec>(dout);
  Vec<Exec> q("q", N * C), k("k", N * C), v("v", N * C), y("y", N * C), out("out", N * C), dqkv("dqkv", N * 3 * C),
      dq("dq", N * C), dk("dk", N * C), dv("dv", N * C), dy("dy", N * C);
  auto heads = [&](const Vec<Exec>& s) { return as_mats<Exec>(s.data(), BNH, T, hd); };
  attention_forward(Exec(), as_mat<Exec>(out.data(), N, C), heads(q), heads(k), heads(v),
                    as_mats<Exec>(att.data(), BNH, T, T), heads(y), as_mat<Exec>(dqkv_in.data(), N, 3 * C), NH);
  EXPECT_LT(rel_error(to_host(out), want), 1e-5);
  attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, 3 * C), heads(dq), heads(dk), heads(dv),
                     as_mats<Exec>(datt.data(), BNH, T, T), heads(dy), as_mat<Exec>(dd.data(), N, C), heads(q),
                     heads(k), heads(v), as_mats<Exec>(att.data(), BNH, T, T), NH);
  EXPECT_LT(rel_error(to_host(dqkv), want_dqkv), 1e-5);
}

TYPED_TEST(AttentionTest, QkvBiasGradientSumsQAndVAndLeavesKExactlyZero) {
  using Exec = TypeParam;
  const int B = 2, T = 5, C = 8, NH = 2, N = B * T;
  const auto qkv = random_vector(N * 3 * C, 43, -1.5, 1.5), dout = random_vector(N * C, 44);
  std::vector<double> out, dqkv;
  attention_reference(qkv, dout, B, T, C, NH, out, dqkv);
  std::vector<double> want(3 * C, 0.25);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < 3 * C; ++j) want[j] += dqkv[i * 3 * C + j];
  for (int j = C; j < 2 * C; ++j) EXPECT_NEAR(want[j], 0.25, 1e-12) << "k bias gradient is not zero in the reference";
  auto dd = to_device<Exec>(dqkv), ones = to_device<Exec>(std::vector<double>(N, 1.0));
  auto dbias = to_device<Exec>(std::vector<double>(3 * C, 0.25));
  Vec<Exec> sums("sums", 3 * C);
  qkv_bias_backward(Exec(), dbias, as_mat<Exec>(dd.data(), N, 3 * C), sums, ones);
  const auto got = to_host(dbias);
  EXPECT_LT(rel_error(got, want), 1e-6);
  for (int j = C; j < 2 * C; ++j) EXPECT_EQ(got[j], 0.25);
}

}  // namespace
}  // namespace lamina::test
