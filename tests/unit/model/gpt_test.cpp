// The transformer block built from Llama's parts (RMSNorm, rotary positions on q and k,
// grouped-query attention, SwiGLU, no biases) against a naive double-precision Llama block
// (HuggingFace's LlamaDecoderLayer, written out) and, backward, against finite differences of
// its own forward pass: the input's gradient and every weight's.
#include "lamina/model/gpt.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/fd_check.hpp"
#include "lamina/core/memory_tracker.hpp"

namespace lamina::test {
namespace {

struct Shape {
  int B = 2, T = 7, C = 16, NH = 4, NKV = 2, F = 24;
  double eps = 1e-5, theta = 500.0;
  int hd() const { return C / NH; }
  int A() const { return NH * hd(); }
  int W() const { return (NH + 2 * NKV) * hd(); }
  int N() const { return B * T; }
};

// The block's weights, flat and row-major in lamina's (in, out) layout.
struct Weights {
  std::vector<double> ln1, qkv, proj, ln2, fc, down;
};

Weights random_weights(const Shape& s, std::uint32_t seed) {
  const double r = 0.4;
  return {random_vector(s.C, seed, 0.5, 1.5),
          random_vector(static_cast<std::size_t>(s.C * s.W()), seed + 1, -r, r),
          random_vector(static_cast<std::size_t>(s.A() * s.C), seed + 2, -r, r),
          random_vector(s.C, seed + 3, 0.5, 1.5),
          random_vector(static_cast<std::size_t>(s.C * 2 * s.F), seed + 4, -r, r),
          random_vector(static_cast<std::size_t>(s.F * s.C), seed + 5, -r, r)};
}

// y (n x m) = x (n x k) @ w (k x m)
std::vector<double> matmul(const std::vector<double>& x, const std::vector<double>& w, int n, int k, int m) {
  std::vector<double> y(static_cast<std::size_t>(n * m), 0.0);
  for (int i = 0; i < n; ++i)
    for (int p = 0; p < k; ++p)
      for (int j = 0; j < m; ++j) y[i * m + j] += x[i * k + p] * w[p * m + j];
  return y;
}

std::vector<double> rmsnorm(const std::vector<double>& x, const std::vector<double>& g, int n, int c, double eps) {
  std::vector<double> y(x.size());
  for (int i = 0; i < n; ++i) {
    double ss = 0.0;
    for (int j = 0; j < c; ++j) ss += x[i * c + j] * x[i * c + j];
    const double r = 1.0 / std::sqrt(ss / c + eps);
    for (int j = 0; j < c; ++j) y[i * c + j] = x[i * c + j] * r * g[j];
  }
  return y;
}

std::vector<double> reference_block(const std::vector<double>& x, const Weights& w, const Shape& s) {
  const int N = s.N(), C = s.C, hd = s.hd(), W = s.W(), G = s.NH / s.NKV, F = s.F;
  std::vector<double> qkv = matmul(rmsnorm(x, w.ln1, N, C, s.eps), w.qkv, N, C, W);
  // Rotary: pairs (i, i + hd/2) of every q and k head, angle position * inv_freq[i].
  const std::vector<double> inv = rotary_inverse_frequencies(hd, s.theta);
  for (int n = 0; n < N; ++n) {
    const int pos = n % s.T;
    for (int h = 0; h < s.NH + s.NKV; ++h) {
      for (int i = 0; i < hd / 2; ++i) {
        double& a = qkv[n * W + h * hd + i];
        double& b = qkv[n * W + h * hd + i + hd / 2];
        const double c = std::cos(pos * inv[i]), sn = std::sin(pos * inv[i]), a0 = a, b0 = b;
        a = a0 * c - b0 * sn;
        b = b0 * c + a0 * sn;
      }
    }
  }
  std::vector<double> atty(static_cast<std::size_t>(N * s.A()), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int b = 0; b < s.B; ++b) {
    for (int h = 0; h < s.NH; ++h) {
      const int kc = s.NH * hd + h / G * hd, vc = (s.NH + s.NKV) * hd + h / G * hd;
      for (int t = 0; t < s.T; ++t) {
        std::vector<double> p(static_cast<std::size_t>(t + 1));
        double mx = -1e300, z = 0.0;
        for (int j = 0; j <= t; ++j) {
          double d = 0.0;
          for (int e = 0; e < hd; ++e) d += qkv[(b * s.T + t) * W + h * hd + e] * qkv[(b * s.T + j) * W + kc + e];
          p[j] = d * scale;
          mx = std::max(mx, p[j]);
        }
        for (double& v : p) z += (v = std::exp(v - mx));
        for (int e = 0; e < hd; ++e) {
          double y = 0.0;
          for (int j = 0; j <= t; ++j) y += p[j] / z * qkv[(b * s.T + j) * W + vc + e];
          atty[(b * s.T + t) * s.A() + h * hd + e] = y;
        }
      }
    }
  }
  std::vector<double> x2 = matmul(atty, w.proj, N, s.A(), C);
  for (int i = 0; i < N * C; ++i) x2[i] += x[i];
  const std::vector<double> gu = matmul(rmsnorm(x2, w.ln2, N, C, s.eps), w.fc, N, C, 2 * F);
  std::vector<double> act(static_cast<std::size_t>(N * F));
  for (int n = 0; n < N; ++n) {
    for (int j = 0; j < F; ++j) {
      const double g = gu[n * 2 * F + j];
      act[n * F + j] = g / (1.0 + std::exp(-g)) * gu[n * 2 * F + F + j];
    }
  }
  std::vector<double> out = matmul(act, w.down, N, F, C);
  for (int i = 0; i < N * C; ++i) out[i] += x2[i];
  return out;
}

template <class Exec>
class LlamaBlockTest : public ::testing::Test {};
TYPED_TEST_SUITE(LlamaBlockTest, ExecSpaces);

TYPED_TEST(LlamaBlockTest, ForwardMatchesDoubleReferenceAndBackwardFiniteDifferences) {
  using Exec = TypeParam;
  const Shape sh;
  ModelConfig m;
  m.layers = 1;
  m.d_model = sh.C;
  m.heads = sh.NH;
  m.kv_heads = sh.NKV;
  m.ffn_hidden = sh.F;
  m.seq_len = sh.T;
  m.vocab_size = 32;
  m.parts.norm = NormKind::rmsnorm;
  m.parts.norm_eps = sh.eps;
  m.parts.position = PositionKind::rotary;
  m.parts.rope_theta = sh.theta;
  m.parts.mlp = MlpKind::swiglu;
  m.parts.bias = false;
  for (const AttentionProducts how :
       {AttentionProducts::in_place, AttentionProducts::staged, AttentionProducts::fused}) {
    if (how == AttentionProducts::in_place && !kAttentionInPlace<Exec>) continue;
    SCOPED_TRACE(attention_products_name(how));
    m.attention = how;
    const Dims d = Dims::of<Exec>(m, sh.B);  // Exec need not be the build's default space
    ASSERT_EQ(d.qkv_width(), sh.W());
    MemoryTracker tracker;
    WorkspaceBuffers<Exec> buffers(tracker, d);
    const Workspace<Exec>& ws = buffers.ws;
    const ActivationSizes sizes = activation_sizes(d);
    Vec<Exec> inner("inner", sizes.inner), out("out", sh.N() * sh.C);
    const BlockActs<Exec, float> acts =
        bind_block_acts<Exec, float>(inner.data(), as_mat<Exec>(out.data(), sh.N(), sh.C), d);
    const Weights w0 = random_weights(sh, 61);
    const auto x0 = random_vector(static_cast<std::size_t>(sh.N() * sh.C), 67, -1.5, 1.5);
    const auto dout = random_vector(static_cast<std::size_t>(sh.N() * sh.C), 68);

    // The device copies of a set of weights, bound as the block reads them.
    struct Bound {
      Vec<Exec> ln1, qkv, proj, ln2, fc, down;
      BlockWeights<Exec> w;
    };
    auto bind = [&](const Weights& w) {
      Bound b{to_device<Exec>(w.ln1), to_device<Exec>(w.qkv), to_device<Exec>(w.proj),
              to_device<Exec>(w.ln2), to_device<Exec>(w.fc),  to_device<Exec>(w.down), {}};
      b.w.ln1_w = b.ln1;
      b.w.qkv_w = ConstMat<Exec>(b.qkv.data(), sh.C, sh.W());
      b.w.proj_w = ConstMat<Exec>(b.proj.data(), sh.A(), sh.C);
      b.w.ln2_w = b.ln2;
      b.w.fc_w = ConstMat<Exec>(b.fc.data(), sh.C, 2 * sh.F);
      b.w.fcproj_w = ConstMat<Exec>(b.down.data(), sh.F, sh.C);
      return b;
    };
    auto forward = [&](const std::vector<double>& x, const Weights& w) {
      const Bound b = bind(w);
      auto xd = to_device<Exec>(x);
      block_forward(Exec(), b.w, acts, as_mat<Exec>(xd.data(), sh.N(), sh.C), d, ws, ShardCombine{});
      return to_host(out);
    };
    EXPECT_LT(rel_error(forward(x0, w0), reference_block(x0, w0, sh)), 1e-5);

    // Backward from the last forward pass's activations (of x0, w0).
    const Bound b = bind(w0);
    auto xd = to_device<Exec>(x0);
    const Mat<Exec> x = as_mat<Exec>(xd.data(), sh.N(), sh.C);
    block_forward(Exec(), b.w, acts, x, d, ws, ShardCombine{});
    Vec<Exec> gln1("gln1", sh.C), gqkv("gqkv", sh.C * sh.W()), gproj("gproj", sh.A() * sh.C), gln2("gln2", sh.C),
        gfc("gfc", sh.C * 2 * sh.F), gdown("gdown", sh.F * sh.C);
    BlockTensors<Exec> g;
    g.ln1_w = gln1;
    g.qkv_w = as_mat<Exec>(gqkv.data(), sh.C, sh.W());
    g.proj_w = as_mat<Exec>(gproj.data(), sh.A(), sh.C);
    g.ln2_w = gln2;
    g.fc_w = as_mat<Exec>(gfc.data(), sh.C, 2 * sh.F);
    g.fcproj_w = as_mat<Exec>(gdown.data(), sh.F, sh.C);
    auto dres = to_device<Exec>(dout);
    block_backward(Exec(), g, b.w, acts, x, as_mat<Exec>(dres.data(), sh.N(), sh.C), d, ws, ShardCombine{});
    auto loss = [&](const std::vector<double>& xs, const Weights& ws_) { return dot(forward(xs, ws_), dout); };
    expect_fd_matches([&](const std::vector<double>& v) { return loss(v, w0); }, x0, to_host(dres), "x", 20);
    const std::pair<std::vector<double> Weights::*, Vec<Exec>*> grads[] = {
        {&Weights::ln1, &gln1}, {&Weights::qkv, &gqkv}, {&Weights::proj, &gproj},
        {&Weights::ln2, &gln2}, {&Weights::fc, &gfc},   {&Weights::down, &gdown}};
    const char* names[] = {"ln1", "qkv", "proj", "ln2", "fc", "down"};
    for (std::size_t i = 0; i < 6; ++i) {
      const auto member = grads[i].first;
      expect_fd_matches(
          [&](const std::vector<double>& v) {
            Weights w = w0;
            w.*member = v;
            return loss(x0, w);
          },
          w0.*member, to_host(*grads[i].second), names[i], 12);
    }
  }
}

}  // namespace
}  // namespace lamina::test
