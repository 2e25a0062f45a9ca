#include "lamina/kernels/linear.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class LinearTest : public ::testing::Test {};
TYPED_TEST_SUITE(LinearTest, ExecSpaces);

TYPED_TEST(LinearTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int N = 7, IC = 6, OC = 9;
  const auto x = random_vector(N * IC, 21), w = random_vector(IC * OC, 22), b = random_vector(OC, 23);
  const auto dout = random_vector(N * OC, 24);
  auto run = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
    auto dx = to_device<Exec>(xv), dw = to_device<Exec>(wv), db = to_device<Exec>(bv);
    Vec<Exec> out("out", N * OC);
    linear_forward(Exec(), as_mat<Exec>(out.data(), N, OC), as_mat<Exec>(dx.data(), N, IC),
                   as_mat<Exec>(dw.data(), IC, OC), db, ProductMath::fp32);
    return to_host(out);
  };
  std::vector<double> want(N * OC), want_dx(N * IC, 0.0), want_dw(IC * OC, 0.0), want_db(OC, 0.0);
  for (int i = 0; i < N; ++i) {
    for (int o = 0; o < OC; ++o) {
      double s = b[o];
      for (int k = 0; k < IC; ++k) {
        s += x[i * IC + k] * w[k * OC + o];
        want_dx[i * IC + k] += dout[i * OC + o] * w[k * OC + o];
        want_dw[k * OC + o] += x[i * IC + k] * dout[i * OC + o];
      }
      want[i * OC + o] = s;
      want_db[o] += dout[i * OC + o];
    }
  }
  EXPECT_LT(rel_error(run(x, w, b), want), 1e-6);

  auto dx = to_device<Exec>(x), dw = to_device<Exec>(w), ddout = to_device<Exec>(dout);
  Vec<Exec> partials("partials", column_partials(N, 256));
  Vec<Exec> gx("gx", N * IC), gw("gw", IC * OC), gb("gb", OC);
  linear_backward(Exec(), as_mat<Exec>(gx.data(), N, IC), as_mat<Exec>(gw.data(), IC, OC), gb,
                  as_mat<Exec>(ddout.data(), N, OC), as_mat<Exec>(dx.data(), N, IC), as_mat<Exec>(dw.data(), IC, OC),
                  partials, ProductMath::fp32);
  EXPECT_LT(rel_error(to_host(gx), want_dx), 1e-6);
  EXPECT_LT(rel_error(to_host(gw), want_dw), 1e-6);
  EXPECT_LT(rel_error(to_host(gb), want_db), 1e-6);
  // Parameter gradients accumulate: a second backward doubles them, dinp is overwritten.
  linear_backward(Exec(), as_mat<Exec>(gx.data(), N, IC), as_mat<Exec>(gw.data(), IC, OC), gb,
                  as_mat<Exec>(ddout.data(), N, OC), as_mat<Exec>(dx.data(), N, IC), as_mat<Exec>(dw.data(), IC, OC),
                  partials, ProductMath::fp32);
  auto twice = [](std::vector<double> v) {
    for (auto& e : v) e *= 2;
    return v;
  };
  EXPECT_LT(rel_error(to_host(gx), want_dx), 1e-6);
  EXPECT_LT(rel_error(to_host(gw), twice(want_dw)), 1e-6);
  EXPECT_LT(rel_error(to_host(gb), twice(want_db)), 1e-6);

  auto f = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
    return dot(run(xv, wv, bv), dout);
  };
  expect_fd_matches([&](const std::vector<double>& v) { return f(v, w, b); }, x, want_dx, "dinp");
  expect_fd_matches([&](const std::vector<double>& v) { return f(x, v, b); }, w, want_dw, "dweight");
  expect_fd_matches([&](const std::vector<double>& v) { return f(x, w, v); }, b, want_db, "dbias");
}

TYPED_TEST(LinearTest, TiedHeadMatchesDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int N = 5, C = 6, V = 11;
  const auto x = random_vector(N * C, 31), e = random_vector(V * C, 32), dout = random_vector(N * V, 33);
  auto run = [&](const std::vector<double>& xv, const std::vector<double>& ev) {
    auto dx = to_device<Exec>(xv), de = to_device<Exec>(ev);
    Vec<Exec> out("logits", N * V);
    tied_head_forward(Exec(), as_mat<Exec>(out.data(), N, V), as_mat<Exec>(dx.data(), N, C),
                      as_mat<Exec>(de.data(), V, C), ProductMath::fp32);
    return to_host(out);
  };
  std::vector<double> want(N * V, 0.0), want_dx(N * C, 0.0), want_de(V * C, 0.0);
  for (int i = 0; i < N; ++i) {
    for (int v = 0; v < V; ++v) {
      for (int c = 0; c < C; ++c) {
        want[i * V + v] += x[i * C + c] * e[v * C + c];
        want_dx[i * C + c] += dout[i * V + v] * e[v * C + c];
        want_de[v * C + c] += dout[i * V + v] * x[i * C + c];
      }
    }
  }
  EXPECT_LT(rel_error(run(x, e), want), 1e-6);
  auto dx = to_device<Exec>(x), de = to_device<Exec>(e), dd = to_device<Exec>(dout);
  Vec<Exec> gx("gx", N * C), ge("ge", V * C);
  tied_head_backward(Exec(), as_mat<Exec>(gx.data(), N, C), as_mat<Exec>(ge.data(), V, C),
                     as_mat<Exec>(dd.data(), N, V), as_mat<Exec>(dx.data(), N, C), as_mat<Exec>(de.data(), V, C),
                     ProductMath::fp32);
  EXPECT_LT(rel_error(to_host(gx), want_dx), 1e-6);
  EXPECT_LT(rel_error(to_host(ge), want_de), 1e-6);
  expect_fd_matches([&](const std::vector<double>& v) { return dot(run(v, e), dout); }, x, want_dx, "dinp");
  expect_fd_matches([&](const std::vector<double>& v) { return dot(run(x, v), dout); }, e, want_de, "dembedding");
}

// Both backward products in bf16 math with the weight stored in bf16, for a linear layer
// (W: in x out) and the tied head (E: V x C): against a double reference of the rounded
// operands where the execution space has a bf16 engine (dY and X rounded once per block
// of rows, the scratch holding 3 rows: 7 rows make blocks of 3, 3, 1), else of the stored
// weight with fp32 operands. Weight gradients accumulate onto what they held.
TYPED_TEST(LinearTest, Bf16BackwardProductsMatchAReferenceOfTheRoundedOperands) {
  using Exec = TypeParam;
  const int N = 7, IN = 6, OUT = 9;
  const bool engine = product_math<Exec>(Precision::bf16) == ProductMath::bf16;
  for (const WeightGradient form : {WeightGradient::xt_dy, WeightGradient::dyt_x}) {
    const bool linear = form == WeightGradient::xt_dy;
    SCOPED_TRACE(linear ? "linear" : "tied head");
    // Stored weight: (IN, OUT) for the linear layer, (OUT, IN) (vocabulary-major) for the head.
    const auto w = bf16_values(random_vector(IN * OUT, 91));
    const auto x = random_vector(N * IN, 92), dy = random_vector(N * OUT, 93), w0 = random_vector(IN * OUT, 94);
    const auto xr = engine ? bf16_values(x) : x, dyr = engine ? bf16_values(dy) : dy;
    std::vector<double> want_dx(N * IN, 0.0), want_dw = w0;
    for (int i = 0; i < N; ++i) {
      for (int o = 0; o < OUT; ++o) {
        for (int k = 0; k < IN; ++k) {
          const int at = linear ? k * OUT + o : o * IN + k;
          want_dx[i * IN + k] += dyr[i * OUT + o] * w[at];
          want_dw[at] += xr[i * IN + k] * dyr[i * OUT + o];
        }
      }
    }
    Bf16Vec<Exec> w16("w16", w.size());
    auto h16 = Kokkos::create_mirror_view(w16);
    for (std::size_t i = 0; i < w.size(); ++i) h16(i) = to_bf16(static_cast<float>(w[i]));
    Kokkos::deep_copy(w16, h16);
    const ConstMat16<Exec> weight(w16.data(), linear ? IN : OUT, linear ? OUT : IN);
    auto dx = to_device<Exec>(x), ddy = to_device<Exec>(dy), dw = to_device<Exec>(w0);
    auto gx = to_device<Exec>(std::vector<double>(N * IN, NAN));
    const std::int64_t room = engine ? 3 * (IN + OUT) / 2 : product_scratch<Exec>(IN * OUT, IN);
    auto scratch = to_device<Exec>(std::vector<double>(static_cast<std::size_t>(room), NAN));
    const Mat<Exec> gxm = as_mat<Exec>(gx.data(), N, IN), dwm = as_mat<Exec>(dw.data(), linear ? IN : OUT, linear ? OUT : IN);
    if (linear) {
      // The bias gradient (+=) sums dy as computed, not rounded: on a host's engine in the
      // pass that rounds each block of its rows (3, 3, 1 here), elsewhere by a product.
      const auto b0 = random_vector(OUT, 95);
      std::vector<double> want_db = b0;
      for (int i = 0; i < N; ++i)
        for (int o = 0; o < OUT; ++o) want_db[o] += dy[i * OUT + o];
      auto db = to_device<Exec>(b0);
      Vec<Exec> partials("partials", column_partials(N, 256));
      linear_backward(Exec(), gxm, dwm, db, as_mat<Exec>(ddy.data(), N, OUT), as_mat<Exec>(dx.data(), N, IN),
                      MatRef<Exec>(weight), partials, ProductMath::bf16, scratch);
      EXPECT_LT(rel_error(to_host(db), want_db), 1e-6);
    } else {
      tied_head_backward(Exec(), gxm, dwm, as_mat<Exec>(ddy.data(), N, OUT), as_mat<Exec>(dx.data(), N, IN),
                         MatRef<Exec>(weight), ProductMath::bf16, scratch);
    }
    EXPECT_LT(rel_error(to_host(gx), want_dx), 1e-6);
    EXPECT_LT(rel_error(to_host(dw), want_dw), 1e-6);
  }
}

// A linear layer's backward in double: dx = g W^T and dw = w0 + x^T g (W: in x out, g: the
// output gradient as the products read it, N x out).
struct BackwardReference {
  std::vector<double> dx, dw;
};
BackwardReference backward_reference(int N, int IN, int OUT, const std::vector<double>& x, const std::vector<double>& w,
                                     const std::vector<double>& g, const std::vector<double>& w0) {
  BackwardReference r{std::vector<double>(N * IN, 0.0), w0};
  for (int i = 0; i < N; ++i) {
    for (int o = 0; o < OUT; ++o) {
      for (int k = 0; k < IN; ++k) {
        r.dx[i * IN + k] += g[i * OUT + o] * w[k * OUT + o];
        r.dw[k * OUT + o] += x[i * IN + k] * g[i * OUT + o];
      }
    }
  }
  return r;
}

// The MLP's first layer backward through its GELU (linear_gelu_backward), with and without a
// bias: against a double reference (the exact derivative at the stored bf16 pre-activation,
// the products on the operand rounded where the space has a bf16 engine, the bias gradient
// summed unrounded), and bit for bit against the unfused sequence, gelu_backward then
// linear_backward (as more threads run it), but for a device's bias gradient, whose compiler
// may fuse the derivative's product into the sum (within fp32 rounding).
// Where the rounding pass applies the derivative (a bf16 engine), the activation's gradient
// is left as it was; elsewhere it becomes the pre-activation's.
TYPED_TEST(LinearTest, GeluBackwardRidesThePassThatRoundsTheOutputGradient) {
  using Exec = TypeParam;
  const int N = 7, IN = 6, OUT = 9;
  const bool engine = product_math<Exec>(Precision::bf16) == ProductMath::bf16;
  const auto x = bf16_values(random_vector(N * IN, 111)), w = bf16_values(random_vector(IN * OUT, 112));
  const auto pre = bf16_values(random_vector(N * OUT, 113, -3.0, 3.0)), dact = random_vector(N * OUT, 114);
  const auto w0 = random_vector(IN * OUT, 115), b0 = random_vector(OUT, 116);
  std::vector<double> g(N * OUT);
  for (int e = 0; e < N * OUT; ++e) {
    const double v = pre[e], s = 0.7978845608028654, c = 0.044715;
    const double th = std::tanh(s * (v + c * v * v * v));
    g[e] = (0.5 * (1.0 + th) + 0.5 * v * s * (1.0 + 3.0 * c * v * v) * (1.0 - th * th)) * dact[e];
  }
  const auto gr = engine ? bf16_values(g) : g;
  const BackwardReference want = backward_reference(N, IN, OUT, x, w, gr, w0);
  std::vector<double> want_db = b0;
  for (int i = 0; i < N; ++i)
    for (int o = 0; o < OUT; ++o) want_db[o] += g[i * OUT + o];
  auto x16 = to_device_bf16<Exec>(x), w16 = to_device_bf16<Exec>(w), pre16 = to_device_bf16<Exec>(pre);
  const ConstMat16<Exec> xm(x16.data(), N, IN), prem(pre16.data(), N, OUT);
  const MatRef<Exec> weight(ConstMat16<Exec>(w16.data(), IN, OUT));
  Vec<Exec> partials("partials", column_partials(N, 256));
  auto scratch = to_device<Exec>(std::vector<double>(static_cast<std::size_t>(product_scratch<Exec>(N * OUT, OUT)), NAN));
  for (const bool bias : {true, false}) {
    SCOPED_TRACE(bias ? "with a bias" : "without a bias");
    // result[0]: fused where it can be; result[1]: the unfused sequence.
    std::vector<double> dx[2], dw[2], db[2], da[2];
    for (int unfused = 0; unfused < 2; ++unfused) {
      auto gx = to_device<Exec>(std::vector<double>(N * IN, NAN)), gw = to_device<Exec>(w0);
      const Vec<Exec> gb = bias ? to_device<Exec>(b0) : Vec<Exec>();
      auto ga = to_device<Exec>(dact);
      const Mat<Exec> gam = as_mat<Exec>(ga.data(), N, OUT);
      if (unfused) {
        gelu_backward(Exec(), ga, Kokkos::View<const std::uint16_t*, typename Exec::memory_space>(pre16),
                      ConstVec<Exec>(ga));
        linear_backward(Exec(), as_mat<Exec>(gx.data(), N, IN), as_mat<Exec>(gw.data(), IN, OUT), gb, gam, xm, weight,
                        partials, ProductMath::bf16, scratch);
      } else {
        linear_gelu_backward(Exec(), as_mat<Exec>(gx.data(), N, IN), as_mat<Exec>(gw.data(), IN, OUT), gb, gam, prem,
                             xm, weight, partials, ProductMath::bf16, scratch);
      }
      dx[unfused] = to_host(gx);
      dw[unfused] = to_host(gw);
      if (bias) db[unfused] = to_host(gb);
      da[unfused] = to_host(ga);
    }
    EXPECT_LT(rel_error(dx[0], want.dx), engine ? 2e-3 : 1e-5);
    EXPECT_LT(rel_error(dw[0], want.dw), engine ? 2e-3 : 1e-5);
    if (bias) {
      EXPECT_LT(rel_error(db[0], want_db), 1e-5);
    }
    EXPECT_EQ(dx[0], dx[1]);
    EXPECT_EQ(dw[0], dw[1]);
    if (lamina::detail::kOnHost<Exec>) {
      EXPECT_EQ(db[0], db[1]);
    } else if (bias) {
      EXPECT_LT(rel_error(db[0], db[1]), 1e-6);
    }
    EXPECT_EQ(da[0] == dact, engine);
  }
}

// The MLP's first layer backward through SwiGLU (linear_swiglu_backward, no bias as Llama's):
// against a double reference (the exact derivatives at the stored bf16 [gate | up], the
// products on [dgate | dup] rounded where the space has a bf16 engine), and bit for bit
// against the sequence without the engine's path, swiglu_backward in fp32 then
// linear_backward rounding it (one block of rows here, so the products sum alike). On the
// engine [dgate | dup] is written in bf16 into the first half of the fp32 workspace's bytes,
// the rest left as it was.
TYPED_TEST(LinearTest, SwigluBackwardWritesTheOutputGradientTheProductsRead) {
  using Exec = TypeParam;
  const int N = 7, IN = 6, F = 5, OUT = 2 * F;
  const bool engine = product_math<Exec>(Precision::bf16) == ProductMath::bf16;
  const auto x = bf16_values(random_vector(N * IN, 121)), w = bf16_values(random_vector(IN * OUT, 122));
  const auto pre = bf16_values(random_vector(N * OUT, 123, -3.0, 3.0)), dact = random_vector(N * F, 124);
  const auto w0 = random_vector(IN * OUT, 125);
  std::vector<double> g(N * OUT);
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < F; ++j) {
      const double gate = pre[i * OUT + j], up = pre[i * OUT + F + j], sg = 1.0 / (1.0 + std::exp(-gate));
      g[i * OUT + j] = dact[i * F + j] * up * sg * (1.0 + gate * (1.0 - sg));
      g[i * OUT + F + j] = dact[i * F + j] * gate * sg;
    }
  }
  const BackwardReference want = backward_reference(N, IN, OUT, x, w, engine ? bf16_values(g) : g, w0);
  auto x16 = to_device_bf16<Exec>(x), w16 = to_device_bf16<Exec>(w), pre16 = to_device_bf16<Exec>(pre);
  const ConstMat16<Exec> xm(x16.data(), N, IN), prem(pre16.data(), N, OUT);
  const MatRef<Exec> weight(ConstMat16<Exec>(w16.data(), IN, OUT));
  Vec<Exec> partials("partials", column_partials(N, 256));
  auto scratch = to_device<Exec>(std::vector<double>(static_cast<std::size_t>(product_scratch<Exec>(N * OUT, OUT)), NAN));
  auto ga = to_device<Exec>(dact);
  const ConstMat<Exec> gam = as_mat<Exec>(ga.data(), N, F);
  // result[0]: linear_swiglu_backward; result[1]: swiglu_backward in fp32, then linear_backward.
  std::vector<double> dx[2], dw[2], dpre[2];
  for (int unfused = 0; unfused < 2; ++unfused) {
    auto gx = to_device<Exec>(std::vector<double>(N * IN, NAN)), gw = to_device<Exec>(w0);
    auto gp = to_device<Exec>(std::vector<double>(N * OUT, 5.0));
    const Mat<Exec> gpm = as_mat<Exec>(gp.data(), N, OUT);
    if (unfused) {
      swiglu_backward(Exec(), gpm, prem, gam);
      linear_backward(Exec(), as_mat<Exec>(gx.data(), N, IN), as_mat<Exec>(gw.data(), IN, OUT), Vec<Exec>(), gpm, xm,
                      weight, partials, ProductMath::bf16, scratch);
    } else {
      linear_swiglu_backward(Exec(), as_mat<Exec>(gx.data(), N, IN), as_mat<Exec>(gw.data(), IN, OUT), Vec<Exec>(), gpm,
                             gam, prem, xm, weight, partials, ProductMath::bf16, scratch);
    }
    dx[unfused] = to_host(gx);
    dw[unfused] = to_host(gw);
    dpre[unfused] = to_host(gp);
  }
  EXPECT_LT(rel_error(dx[0], want.dx), engine ? 2e-3 : 1e-5);
  EXPECT_LT(rel_error(dw[0], want.dw), engine ? 2e-3 : 1e-5);
  EXPECT_EQ(dx[0], dx[1]);
  EXPECT_EQ(dw[0], dw[1]);
  if (engine) {
    // The bf16 gradient in the first N * OUT / 2 floats' bytes: each the fp32 path's value rounded.
    Kokkos::View<float*, Kokkos::HostSpace> bytes("bytes", N * OUT);
    for (int e = 0; e < N * OUT; ++e) bytes(e) = static_cast<float>(dpre[0][e]);
    const auto* got = reinterpret_cast<const std::uint16_t*>(bytes.data());
    for (int e = 0; e < N * OUT; ++e) EXPECT_EQ(got[e], to_bf16(static_cast<float>(dpre[1][e]))) << e;
    for (int e = N * OUT / 2; e < N * OUT; ++e) EXPECT_EQ(dpre[0][e], 5.0) << e;
  } else {
    EXPECT_EQ(dpre[0], dpre[1]);
  }
}

// The LM head's backward on a bf16 engine with its logit gradients already in bf16, rows 2 V
// apart (cross_entropy_backward_bf16's, the rest of each row NaN): against a double reference
// of them, the stored weight and X rounded; an fp32 X in blocks of 3 rows (7 rows: 3, 3, 1),
// a bf16 X (a bf16 run's final norm output) read as stored, the scratch left alone.
TYPED_TEST(LinearTest, HeadBackwardReadsBf16LogitGradientsAsStored) {
  using Exec = TypeParam;
  if (product_math<Exec>(Precision::bf16) != ProductMath::bf16) GTEST_SKIP() << "no bf16 engine on this space";
  const int N = 7, C = 6, V = 9;
  const auto w = bf16_values(random_vector(V * C, 101)), dy = bf16_values(random_vector(N * V, 102));
  const auto x = random_vector(N * C, 103), w0 = random_vector(V * C, 104), xr = bf16_values(x);
  std::vector<double> want_dx(N * C, 0.0), want_dw = w0;
  for (int i = 0; i < N; ++i) {
    for (int v = 0; v < V; ++v) {
      for (int c = 0; c < C; ++c) {
        want_dx[i * C + c] += dy[i * V + v] * w[v * C + c];
        want_dw[v * C + c] += dy[i * V + v] * xr[i * C + c];
      }
    }
  }
  std::vector<double> dy_rows(2 * N * V, NAN), w_rows(w);
  for (int i = 0; i < N; ++i) std::copy(dy.begin() + i * V, dy.begin() + (i + 1) * V, dy_rows.begin() + 2 * i * V);
  auto dy16 = to_device_bf16<Exec>(dy_rows);
  auto w16 = to_device_bf16<Exec>(w_rows);
  auto dx = to_device<Exec>(x), dw = to_device<Exec>(w0), gx = to_device<Exec>(std::vector<double>(N * C, NAN));
  auto scratch = to_device<Exec>(std::vector<double>(3 * C / 2, NAN));
  head_backward_products_bf16(Exec(), dy16.data(), 2 * V, MatRef<Exec>(ConstMat16<Exec>(w16.data(), V, C)),
                              as_mat<Exec>(dx.data(), N, C), as_mat<Exec>(gx.data(), N, C),
                              as_mat<Exec>(dw.data(), V, C), scratch);
  EXPECT_LT(rel_error(to_host(gx), want_dx), 1e-6);
  EXPECT_LT(rel_error(to_host(dw), want_dw), 1e-6);
  auto x16 = to_device_bf16<Exec>(xr);
  auto dw2 = to_device<Exec>(w0);
  auto gx2 = to_device<Exec>(std::vector<double>(N * C, NAN));
  head_backward_products_bf16(Exec(), dy16.data(), 2 * V, MatRef<Exec>(ConstMat16<Exec>(w16.data(), V, C)),
                              ConstMat16<Exec>(x16.data(), N, C), as_mat<Exec>(gx2.data(), N, C),
                              as_mat<Exec>(dw2.data(), V, C), Vec<Exec>());
  EXPECT_LT(rel_error(to_host(gx2), want_dx), 1e-6);
  EXPECT_LT(rel_error(to_host(dw2), want_dw), 1e-6);
}

// A bf16 run's products on stored bf16 activations and weights: forward into fp32 (the
// projections) and into bf16 with the bias added as it is rounded (the QKV projection), and
// both backward products with X read as stored. Against a double reference of the stored
// values and, where the execution space has a bf16 engine, of dY rounded. Scratch for a few
// rows or columns at a time, so that the products without an engine run in blocks.
TYPED_TEST(LinearTest, ProductsReadStoredBf16Activations) {
  using Exec = TypeParam;
  const int N = 7, IN = 6, OUT = 9;
  const bool engine = product_math<Exec>(Precision::bf16) == ProductMath::bf16;
  const auto x = bf16_values(random_vector(N * IN, 95)), w = bf16_values(random_vector(IN * OUT, 96));
  const auto bias = random_vector(OUT, 97), dy = random_vector(N * OUT, 98), w0 = random_vector(IN * OUT, 99);
  const auto dyr = engine ? bf16_values(dy) : dy;
  std::vector<double> want_y(N * OUT, 0.0), want_yb(N * OUT), want_dx(N * IN, 0.0), want_dw = w0;
  for (int i = 0; i < N; ++i) {
    for (int o = 0; o < OUT; ++o) {
      for (int k = 0; k < IN; ++k) {
        want_y[i * OUT + o] += x[i * IN + k] * w[k * OUT + o];
        want_dx[i * IN + k] += dyr[i * OUT + o] * w[k * OUT + o];
        want_dw[k * OUT + o] += x[i * IN + k] * dyr[i * OUT + o];
      }
      want_yb[i * OUT + o] = want_y[i * OUT + o] + static_cast<float>(bias[o]);
    }
  }
  auto x16 = to_device_bf16<Exec>(x), w16 = to_device_bf16<Exec>(w);
  const Mat16<Exec> xm(x16.data(), N, IN);
  const MatRef<Exec> weight(ConstMat16<Exec>(w16.data(), IN, OUT));
  auto scratch = to_device<Exec>(std::vector<double>(engine ? 14 : 36, NAN));
  auto dbias = to_device<Exec>(bias), ddy = to_device<Exec>(dy), dw = to_device<Exec>(w0);
  auto y = to_device<Exec>(std::vector<double>(N * OUT, NAN)), stage = to_device<Exec>(std::vector<double>(N * OUT, NAN));
  linear_forward(Exec(), as_mat<Exec>(y.data(), N, OUT), xm, weight, ConstVec<Exec>(), ProductMath::bf16, scratch);
  EXPECT_LT(rel_error(to_host(y), want_y), 1e-6);
  Bf16Vec<Exec> y16("y16", N * OUT);
  linear_forward(Exec(), Mat16<Exec>(y16.data(), N, OUT), xm, weight, dbias, ProductMath::bf16, scratch,
                 as_mat<Exec>(stage.data(), N, OUT));
  const auto got = widened_to_host(y16);
  for (int i = 0; i < N * OUT; ++i) EXPECT_NEAR(got[i], want_yb[i], std::abs(want_yb[i]) / 256 + 1e-6) << i;
  auto gx = to_device<Exec>(std::vector<double>(N * IN, NAN));
  Vec<Exec> partials("partials", column_partials(N, 256));
  linear_backward(Exec(), as_mat<Exec>(gx.data(), N, IN), as_mat<Exec>(dw.data(), IN, OUT), Vec<Exec>(),
                  as_mat<Exec>(ddy.data(), N, OUT), xm, weight, partials, ProductMath::bf16, scratch);
  EXPECT_LT(rel_error(to_host(gx), want_dx), 1e-6);
  EXPECT_LT(rel_error(to_host(dw), want_dw), 1e-6);
  // The tied head (E: OUT x IN, vocabulary-major) on the same stored X, as a bf16 run keeps
  // its final norm's output: logits = X E^T, dX = dY E, dE += dY^T X.
  const auto e = bf16_values(random_vector(OUT * IN, 100)), e0 = random_vector(OUT * IN, 101);
  std::vector<double> want_logits(N * OUT, 0.0), want_hdx(N * IN, 0.0), want_de = e0;
  for (int i = 0; i < N; ++i) {
    for (int o = 0; o < OUT; ++o) {
      for (int k = 0; k < IN; ++k) {
        want_logits[i * OUT + o] += x[i * IN + k] * e[o * IN + k];
        want_hdx[i * IN + k] += dyr[i * OUT + o] * e[o * IN + k];
        want_de[o * IN + k] += dyr[i * OUT + o] * x[i * IN + k];
      }
    }
  }
  auto e16 = to_device_bf16<Exec>(e);
  const MatRef<Exec> embedding(ConstMat16<Exec>(e16.data(), OUT, IN));
  auto logits = to_device<Exec>(std::vector<double>(N * OUT, NAN));
  auto hgx = to_device<Exec>(std::vector<double>(N * IN, NAN)), de = to_device<Exec>(e0);
  tied_head_forward(Exec(), as_mat<Exec>(logits.data(), N, OUT), ConstMat16<Exec>(xm), embedding, ProductMath::bf16,
                    scratch);
  EXPECT_LT(rel_error(to_host(logits), want_logits), 1e-6);
  tied_head_backward(Exec(), as_mat<Exec>(hgx.data(), N, IN), as_mat<Exec>(de.data(), OUT, IN),
                     as_mat<Exec>(ddy.data(), N, OUT), ConstMat16<Exec>(xm), embedding, ProductMath::bf16, scratch);
  EXPECT_LT(rel_error(to_host(hgx), want_hdx), 1e-6);
  EXPECT_LT(rel_error(to_host(de), want_de), 1e-6);
}

// The MLP's first layer with GELU stored in bf16 (linear_gelu_forward), as this space runs it:
// one product with bias and GELU as its epilogue (cuBLASLt), the product with its bias and a
// GELU pass (a host's oneDNN), or an fp32 product and one pass. The kept pre-activation is
// the exact sum of the bf16 operands plus the fp32 bias rounded to nearest, within the fp32
// sums' own error (a bf16 step); the output is GELU of it within a bf16 step of the output
// and GELU's change over a step of its input (the epilogue takes GELU of the fp32 sums, the
// passes of the stored ones). Rows of 24 (a multiple of 8, as cuBLASLt keeps GELU's input).
TYPED_TEST(LinearTest, GeluLayerWritesItsPreActivationAndOutputInBf16) {
  using Exec = TypeParam;
  const int N = 9, IN = 40, F = 24;
  const auto x = bf16_values(random_vector(N * IN, 141)), w = bf16_values(random_vector(IN * F, 142));
  const auto bias = random_vector(F, 143);
  auto x16 = to_device_bf16<Exec>(x), w16 = to_device_bf16<Exec>(w);
  auto dbias = to_device<Exec>(bias);
  auto scratch = to_device<Exec>(std::vector<double>(static_cast<std::size_t>(product_scratch<Exec>(N * IN, IN)), NAN));
  auto stage = to_device<Exec>(std::vector<double>(N * F, NAN));
  Bf16Vec<Exec> pre16("pre16", N * F), out16("out16", N * F);
  linear_gelu_forward(Exec(), Mat16<Exec>(pre16.data(), N, F), Mat16<Exec>(out16.data(), N, F),
                      ConstMat16<Exec>(x16.data(), N, IN), MatRef<Exec>(ConstMat16<Exec>(w16.data(), IN, F)), dbias,
                      ProductMath::bf16, scratch, as_mat<Exec>(stage.data(), N, F));
  const auto pre = widened_to_host(pre16), out = widened_to_host(out16);
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < F; ++j) {
      double s = static_cast<float>(bias[j]);
      for (int l = 0; l < IN; ++l) s += x[i * IN + l] * w[l * F + j];
      const int e = i * F + j;
      ASSERT_LE(std::abs(pre[e] - s), std::abs(s) / 128 + 1e-6) << i << ", " << j;
      const double want = gelu_reference(s);
      ASSERT_LE(std::abs(out[e] - want), std::abs(want) / 128 + 1.2 * std::abs(s) / 128 + 1e-6) << i << ", " << j;
    }
  }
}

// The column-parallel layers' input gradients written in bf16 for a bf16 tensor-parallel sum
// (dinp a Mat16, where rounds_input_gradient): for a linear layer with a bias (its rows in
// blocks of 3, 3, 1 through the scratch), the GELU-gated and the SwiGLU layer, each value
// is the fp32 path's rounded to nearest, within that fp32 sum's own error (which can tip a
// value onto the neighbouring bf16 one); the weight and bias gradients are bit for bit the
// fp32 path's.
TYPED_TEST(LinearTest, InputGradientsWrittenInBf16AreTheFp32OnesRounded) {
  using Exec = TypeParam;
  const int N = 7, IN = 6, F = 5, OUT = 2 * F;
  const auto x = bf16_values(random_vector(N * IN, 131)), w = bf16_values(random_vector(IN * OUT, 132));
  const auto pre = bf16_values(random_vector(N * OUT, 133, -3.0, 3.0)), dy = random_vector(N * OUT, 134);
  const auto w0 = random_vector(IN * OUT, 135), b0 = random_vector(OUT, 136);
  auto x16 = to_device_bf16<Exec>(x), w16 = to_device_bf16<Exec>(w), pre16 = to_device_bf16<Exec>(pre);
  const ConstMat16<Exec> xm(x16.data(), N, IN), prem(pre16.data(), N, OUT);
  const MatRef<Exec> weight(ConstMat16<Exec>(w16.data(), IN, OUT));
  if (!rounds_input_gradient<Exec>(ProductMath::bf16, weight)) GTEST_SKIP() << "products on this space do not write bf16";
  Vec<Exec> partials("partials", column_partials(N, 256));
  for (const char* layer : {"linear", "gelu", "swiglu"}) {
    SCOPED_TRACE(layer);
    const std::string form = layer;
    const bool bias = form == "linear";
    const std::int64_t room = form == "linear" ? 3 * OUT / 2 : product_scratch<Exec>(N * OUT, OUT);
    // [0]: dinp in fp32; [1]: in bf16.
    std::vector<double> dx[2], dw[2], db[2];
    for (int written16 = 0; written16 < 2; ++written16) {
      auto scratch = to_device<Exec>(std::vector<double>(static_cast<std::size_t>(room), NAN));
      auto gw = to_device<Exec>(w0), gd = to_device<Exec>(dy);
      const Vec<Exec> gb = bias ? to_device<Exec>(b0) : Vec<Exec>();
      auto gp = to_device<Exec>(std::vector<double>(N * OUT, NAN));
      const Mat<Exec> gdm = as_mat<Exec>(gd.data(), N, OUT), gwm = as_mat<Exec>(gw.data(), IN, OUT);
      auto backward = [&](const auto& dinp) {
        if (form == "linear") {
          linear_backward(Exec(), dinp, gwm, gb, gdm, xm, weight, partials, ProductMath::bf16, scratch);
        } else if (form == "gelu") {
          linear_gelu_backward(Exec(), dinp, gwm, gb, gdm, prem, xm, weight, partials, ProductMath::bf16, scratch);
        } else {
          linear_swiglu_backward(Exec(), dinp, gwm, gb, as_mat<Exec>(gp.data(), N, OUT),
                                 ConstMat<Exec>(as_mat<Exec>(gd.data(), N, F)), prem, xm, weight, partials,
                                 ProductMath::bf16, scratch);
        }
      };
      if (written16) {
        Bf16Vec<Exec> g16("g16", N * IN);
        backward(Mat16<Exec>(g16.data(), N, IN));
        dx[1] = widened_to_host(g16);
      } else {
        auto gx = to_device<Exec>(std::vector<double>(N * IN, NAN));
        backward(as_mat<Exec>(gx.data(), N, IN));
        dx[0] = to_host(gx);
      }
      dw[written16] = to_host(gw);
      if (bias) db[written16] = to_host(gb);
    }
    EXPECT_EQ(dw[0], dw[1]);
    EXPECT_EQ(db[0], db[1]);
    int off_by_a_step = 0;
    for (int e = 0; e < N * IN; ++e) {
      const double want = from_bf16(to_bf16(static_cast<float>(dx[0][e])));
      const double step = std::abs(want) / 128 + 1e-30, err = std::abs(dx[1][e] - want);
      ASSERT_LE(err, step) << e << ": " << dx[1][e] << " against " << dx[0][e];
      if (err > 0) ++off_by_a_step;
    }
    EXPECT_LE(off_by_a_step, N * IN / 10) << "values a bf16 step from the fp32 path's rounded";
  }
}

}  // namespace
}  // namespace lamina::test
