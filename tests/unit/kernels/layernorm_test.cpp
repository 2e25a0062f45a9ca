#include "lamina/kernels/layernorm.hpp"

#include "lamina/kernels/residual.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

struct LnRef {
  std::vector<double> out, mean, rstd, dinp, dw, db;
};

// Naive double-precision LayerNorm forward and backward.
LnRef layernorm_reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& b,
                          const std::vector<double>& dout, int N, int C) {
  LnRef r;
  r.out.resize(N * C);
  r.dinp.resize(N * C);
  r.dw.assign(C, 0.0);
  r.db.assign(C, 0.0);
  for (int i = 0; i < N; ++i) {
    double m = 0, v = 0;
    for (int c = 0; c < C; ++c) m += x[i * C + c] / C;
    for (int c = 0; c < C; ++c) v += (x[i * C + c] - m) * (x[i * C + c] - m) / C;
    const double rs = 1.0 / std::sqrt(v + 1e-5);
    r.mean.push_back(m);
    r.rstd.push_back(rs);
    double s1 = 0, s2 = 0;
    for (int c = 0; c < C; ++c) {
      const double xh = (x[i * C + c] - m) * rs;
      r.out[i * C + c] = xh * w[c] + b[c];
      r.dw[c] += dout[i * C + c] * xh;
      r.db[c] += dout[i * C + c];
      s1 += dout[i * C + c] * w[c] / C;
      s2 += dout[i * C + c] * w[c] * xh / C;
    }
    for (int c = 0; c < C; ++c) {
      const double xh = (x[i * C + c] - m) * rs;
      r.dinp[i * C + c] = rs * (dout[i * C + c] * w[c] - s1 - xh * s2);
    }
  }
  return r;
}

template <class Exec>
class LayerNormTest : public ::testing::Test {};
TYPED_TEST_SUITE(LayerNormTest, ExecSpaces);

TYPED_TEST(LayerNormTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int N = 6, C = 16;
  const auto x = random_vector(N * C, 1, -2, 2), w = random_vector(C, 2, 0.5, 1.5), b = random_vector(C, 3);
  const auto dout = random_vector(N * C, 4), skip = random_vector(N * C, 5);
  const LnRef ref = layernorm_reference(x, w, b, dout, N, C);

  auto run_forward = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv,
                         Vec<Exec>& out, Vec<Exec>& mean, Vec<Exec>& rstd) {
    auto dx = to_device<Exec>(xv), dw = to_device<Exec>(wv), db = to_device<Exec>(bv);
    out = Vec<Exec>("out", N * C);
    mean = Vec<Exec>("mean", N);
    rstd = Vec<Exec>("rstd", N);
    layernorm_forward(Exec(), as_mat<Exec>(out.data(), N, C), mean, rstd, as_mat<Exec>(dx.data(), N, C), dw, db);
    Kokkos::fence();
  };
  Vec<Exec> out, mean, rstd;
  run_forward(x, w, b, out, mean, rstd);
  EXPECT_LT(rel_error(to_host(out), ref.out), 1e-6);
  EXPECT_LT(rel_error(to_host(mean), ref.mean), 1e-6);
  EXPECT_LT(rel_error(to_host(rstd), ref.rstd), 1e-6);

  auto ddin = Vec<Exec>("dinp", N * C), dwv = Vec<Exec>("dw", C), dbv = Vec<Exec>("db", C);
  auto scratch = Vec<Exec>("scratch", N * C);
  Vec<Exec> partials("partials", column_partials(N, 256));
  auto dskip = to_device<Exec>(skip), ddout = to_device<Exec>(dout), dx = to_device<Exec>(x), dwt = to_device<Exec>(w);
  // Gradients accumulate into dweight/dbias: start from a known value.
  Kokkos::deep_copy(dwv, 0.5f);
  Kokkos::deep_copy(dbv, -0.25f);
  layernorm_backward(Exec(), as_mat<Exec>(ddin.data(), N, C), dwv, dbv, as_mat<Exec>(ddout.data(), N, C),
                     as_mat<Exec>(dskip.data(), N, C), as_mat<Exec>(dx.data(), N, C), dwt, mean, rstd,
                     as_mat<Exec>(scratch.data(), N, C), partials);
  std::vector<double> want_dinp = ref.dinp, want_dw = ref.dw, want_db = ref.db;
  for (int i = 0; i < N * C; ++i) want_dinp[i] += skip[i];
  for (int c = 0; c < C; ++c) {
    want_dw[c] += 0.5;
    want_db[c] -= 0.25;
  }
  EXPECT_LT(rel_error(to_host(ddin), want_dinp), 1e-5);
  EXPECT_LT(rel_error(to_host(dwv), want_dw), 1e-5);
  EXPECT_LT(rel_error(to_host(dbv), want_db), 1e-5);

  // Finite differences of f = <out, dout> against the kernel's own gradients (no skip).
  auto f = [&](const std::vector<double>& xv, const std::vector<double>& wv, const std::vector<double>& bv) {
    Vec<Exec> o, m, r;
    run_forward(xv, wv, bv, o, m, r);
    return dot(to_host(o), dout);
  };
  Kokkos::deep_copy(dwv, 0.0f);
  Kokkos::deep_copy(dbv, 0.0f);
  layernorm_backward(Exec(), as_mat<Exec>(ddin.data(), N, C), dwv, dbv, as_mat<Exec>(ddout.data(), N, C),
                     ConstMat<Exec>(), as_mat<Exec>(dx.data(), N, C), dwt, mean, rstd,
                     as_mat<Exec>(scratch.data(), N, C), partials);
  expect_fd_matches([&](const std::vector<double>& v) { return f(v, w, b); }, x, to_host(ddin), "dinp");
  expect_fd_matches([&](const std::vector<double>& v) { return f(x, v, b); }, w, to_host(dwv), "dweight");
  expect_fd_matches([&](const std::vector<double>& v) { return f(x, w, v); }, b, to_host(dbv), "dbias");
}

// bf16 runs: the input read as stored, the output and the saved statistics rounded into
// bf16 once; the backward reads the stored input and statistics (its reference takes the
// rounded mean and rstd as they are), its gradients fp32.
TYPED_TEST(LayerNormTest, Bf16StorageIsReadAndWrittenAsStored) {
  using Exec = TypeParam;
  const int N = 6, C = 16;
  const auto x = bf16_values(random_vector(N * C, 11, -2, 2)), w = random_vector(C, 12, 0.5, 1.5),
             b = random_vector(C, 13), dout = random_vector(N * C, 14);
  const LnRef ref = layernorm_reference(x, w, b, dout, N, C);
  auto dx = to_device_bf16<Exec>(x);
  auto dw = to_device<Exec>(w), db = to_device<Exec>(b);
  Bf16Vec<Exec> out("out", N * C), mean("mean", N), rstd("rstd", N);
  layernorm_forward(Exec(), Mat16<Exec>(out.data(), N, C), mean, rstd, Mat16<Exec>(dx.data(), N, C), dw, db);
  // Rounded once: within half a bf16 step (2^-8 relative at most) of the exact values.
  for (const auto& [got, want, name] : {std::make_tuple(widened_to_host(out), ref.out, "out"),
                                       std::make_tuple(widened_to_host(mean), ref.mean, "mean"),
                                       std::make_tuple(widened_to_host(rstd), ref.rstd, "rstd")}) {
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], std::abs(want[i]) / 256 + 1e-7) << name;
  }
  const auto m = widened_to_host(mean), r = widened_to_host(rstd);
  std::vector<double> want_dinp(N * C), want_dw(C, 0.0), want_db(C, 0.0);
  for (int i = 0; i < N; ++i) {
    double s1 = 0, s2 = 0;
    for (int c = 0; c < C; ++c) {
      const double xh = (x[i * C + c] - m[i]) * r[i], d = dout[i * C + c];
      want_dw[c] += d * xh;
      want_db[c] += d;
      s1 += d * w[c] / C;
      s2 += d * w[c] * xh / C;
    }
    for (int c = 0; c < C; ++c) {
      want_dinp[i * C + c] = r[i] * (dout[i * C + c] * w[c] - s1 - (x[i * C + c] - m[i]) * r[i] * s2);
    }
  }
  auto ddin = Vec<Exec>("dinp", N * C), dwv = Vec<Exec>("dw", C), dbv = Vec<Exec>("db", C);
  auto scratch = Vec<Exec>("scratch", N * C);
  Vec<Exec> partials("partials", column_partials(N, 256));
  auto ddout = to_device<Exec>(dout);
  layernorm_backward(Exec(), as_mat<Exec>(ddin.data(), N, C), dwv, dbv, as_mat<Exec>(ddout.data(), N, C),
                     ConstMat<Exec>(), Mat16<Exec>(dx.data(), N, C), dw, mean, rstd,
                     as_mat<Exec>(scratch.data(), N, C), partials);
  EXPECT_LT(rel_error(to_host(ddin), want_dinp), 1e-5);
  EXPECT_LT(rel_error(to_host(dwv), want_dw), 1e-5);
  EXPECT_LT(rel_error(to_host(dbv), want_db), 1e-5);
}

// The residual add and the layer norm after it in one pass: bit for bit the two kernels one
// after the other, in fp32 and in bf16 storage, and (fp32) the double reference of the layer
// norm of the sum.
TYPED_TEST(LayerNormTest, ResidualAndLayerNormInOnePassEqualTheTwoPasses) {
  using Exec = TypeParam;
  const int N = 6, C = 40;
  const auto a = bf16_values(random_vector(N * C, 21, -2, 2)), b = random_vector(N * C, 22), bb = random_vector(C, 23);
  const auto w = random_vector(C, 24, 0.5, 1.5), lb = random_vector(C, 25);
  auto db = to_device<Exec>(b), dbb = to_device<Exec>(bb), dw = to_device<Exec>(w), dlb = to_device<Exec>(lb);
  const Mat<Exec> bm = as_mat<Exec>(db.data(), N, C);
  {
    auto da = to_device<Exec>(a);
    const Mat<Exec> am = as_mat<Exec>(da.data(), N, C);
    Vec<Exec> sum1("sum1", N * C), out1("out1", N * C), m1("m1", N), r1("r1", N);
    Vec<Exec> sum2("sum2", N * C), out2("out2", N * C), m2("m2", N), r2("r2", N);
    residual_layernorm_forward(Exec(), as_mat<Exec>(sum1.data(), N, C), as_mat<Exec>(out1.data(), N, C), m1, r1, am,
                               bm, dbb, dw, dlb);
    residual_forward(Exec(), as_mat<Exec>(sum2.data(), N, C), am, bm, dbb);
    layernorm_forward(Exec(), as_mat<Exec>(out2.data(), N, C), m2, r2, as_mat<Exec>(sum2.data(), N, C), dw, dlb);
    EXPECT_EQ(to_host(sum1), to_host(sum2));
    EXPECT_EQ(to_host(out1), to_host(out2));
    EXPECT_EQ(to_host(m1), to_host(m2));
    EXPECT_EQ(to_host(r1), to_host(r2));
    std::vector<double> x(N * C);
    for (int i = 0; i < N * C; ++i) x[i] = static_cast<float>(a[i]) + (static_cast<float>(b[i]) + static_cast<float>(bb[i % C]));
    const LnRef ref = layernorm_reference(x, w, lb, std::vector<double>(N * C, 0.0), N, C);
    EXPECT_LT(rel_error(to_host(out1), ref.out), 1e-6);
  }
  auto a16 = to_device_bf16<Exec>(a);
  const Mat16<Exec> am(a16.data(), N, C);
  Bf16Vec<Exec> sum1("sum1", N * C), out1("out1", N * C), m1("m1", N), r1("r1", N);
  Bf16Vec<Exec> sum2("sum2", N * C), out2("out2", N * C), m2("m2", N), r2("r2", N);
  residual_layernorm_forward(Exec(), Mat16<Exec>(sum1.data(), N, C), Mat16<Exec>(out1.data(), N, C), m1, r1, am, bm,
                             dbb, dw, dlb);
  residual_forward(Exec(), Mat16<Exec>(sum2.data(), N, C), am, bm, dbb);
  layernorm_forward(Exec(), Mat16<Exec>(out2.data(), N, C), m2, r2, Mat16<Exec>(sum2.data(), N, C), dw, dlb);
  EXPECT_EQ(to_host(sum1), to_host(sum2));
  EXPECT_EQ(to_host(out1), to_host(out2));
  EXPECT_EQ(to_host(m1), to_host(m2));
  EXPECT_EQ(to_host(r1), to_host(r2));
  // The branch summed over tensor-parallel shards in bf16 (parallel.tp_sums), read as it is:
  // the bits of an fp32 branch holding its values.
  const auto b16 = bf16_values(b);
  auto db16 = to_device_bf16<Exec>(b16);
  auto db16w = to_device<Exec>(b16);
  Bf16Vec<Exec> sum3("sum3", N * C), out3("out3", N * C), m3("m3", N), r3("r3", N);
  residual_layernorm_forward(Exec(), Mat16<Exec>(sum1.data(), N, C), Mat16<Exec>(out1.data(), N, C), m1, r1, am,
                             as_mat<Exec>(db16w.data(), N, C), dbb, dw, dlb);
  residual_layernorm_forward(Exec(), Mat16<Exec>(sum3.data(), N, C), Mat16<Exec>(out3.data(), N, C), m3, r3, am,
                             ConstMat16<Exec>(db16.data(), N, C), dbb, dw, dlb);
  EXPECT_EQ(to_host(sum3), to_host(sum1));
  EXPECT_EQ(to_host(out3), to_host(out1));
  EXPECT_EQ(to_host(m3), to_host(m1));
  EXPECT_EQ(to_host(r3), to_host(r1));
}

}  // namespace
}  // namespace lamina::test
