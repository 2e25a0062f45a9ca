#include "lamina/kernels/rmsnorm.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

struct RmsRef {
  std::vector<double> out, rstd, dinp, dw;
};

// Naive double-precision RMSNorm forward and backward; rstd_in, when given, replaces the
// computed rstd (the kernels' bf16 backward reads the rounded one).
RmsRef rmsnorm_reference(const std::vector<double>& x, const std::vector<double>& w, const std::vector<double>& dout,
                         int N, int C, double eps, const std::vector<double>& rstd_in = {}) {
  RmsRef r;
  r.out.resize(N * C);
  r.dinp.resize(N * C);
  r.dw.assign(C, 0.0);
  for (int i = 0; i < N; ++i) {
    double ms = 0;
    for (int c = 0; c < C; ++c) ms += x[i * C + c] * x[i * C + c] / C;
    const double rs = rstd_in.empty() ? 1.0 / std::sqrt(ms + eps) : rstd_in[i];
    r.rstd.push_back(rs);
    double s = 0;
    for (int c = 0; c < C; ++c) {
      const double xh = x[i * C + c] * rs;
      r.out[i * C + c] = xh * w[c];
      r.dw[c] += dout[i * C + c] * xh;
      s += dout[i * C + c] * w[c] * xh / C;
    }
    for (int c = 0; c < C; ++c) r.dinp[i * C + c] = rs * (dout[i * C + c] * w[c] - x[i * C + c] * rs * s);
  }
  return r;
}

template <class Exec>
class RmsNormTest : public ::testing::Test {};
TYPED_TEST_SUITE(RmsNormTest, ExecSpaces);

TYPED_TEST(RmsNormTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int N = 6, C = 24;
  const double eps = 1e-6;
  const auto x = random_vector(N * C, 1, -2, 2), w = random_vector(C, 2, 0.5, 1.5);
  const auto dout = random_vector(N * C, 4), skip = random_vector(N * C, 5);
  const RmsRef ref = rmsnorm_reference(x, w, dout, N, C, eps);

  auto run_forward = [&](const std::vector<double>& xv, const std::vector<double>& wv, Vec<Exec>& out,
                         Vec<Exec>& rstd) {
    auto dx = to_device<Exec>(xv), dw = to_device<Exec>(wv);
    out = Vec<Exec>("out", N * C);
    rstd = Vec<Exec>("rstd", N);
    rmsnorm_forward(Exec(), as_mat<Exec>(out.data(), N, C), rstd, as_mat<Exec>(dx.data(), N, C), dw,
                    static_cast<float>(eps));
    Kokkos::fence();
  };
  Vec<Exec> out, rstd;
  run_forward(x, w, out, rstd);
  EXPECT_LT(rel_error(to_host(out), ref.out), 1e-6);
  EXPECT_LT(rel_error(to_host(rstd), ref.rstd), 1e-6);

  auto ddin = Vec<Exec>("dinp", N * C), dwv = Vec<Exec>("dw", C);
  auto scratch = Vec<Exec>("scratch", N * C);
  Vec<Exec> partials("partials", column_partials(N, 256));
  auto dskip = to_device<Exec>(skip), ddout = to_device<Exec>(dout), dx = to_device<Exec>(x), dwt = to_device<Exec>(w);
  Kokkos::deep_copy(dwv, 0.5f);  // the weight gradient accumulates
  rmsnorm_backward(Exec(), as_mat<Exec>(ddin.data(), N, C), dwv, as_mat<Exec>(ddout.data(), N, C),
                   as_mat<Exec>(dskip.data(), N, C), as_mat<Exec>(dx.data(), N, C), dwt, rstd,
                   as_mat<Exec>(scratch.data(), N, C), partials);
  std::vector<double> want_dinp = ref.dinp, want_dw = ref.dw;
  for (int i = 0; i < N * C; ++i) want_dinp[i] += skip[i];
  for (auto& v : want_dw) v += 0.5;
  EXPECT_LT(rel_error(to_host(ddin), want_dinp), 1e-5);
  EXPECT_LT(rel_error(to_host(dwv), want_dw), 1e-5);

  // Finite differences of f = <out, dout> against the kernel's own gradients (no skip).
  auto f = [&](const std::vector<double>& xv, const std::vector<double>& wv) {
    Vec<Exec> o, r;
    run_forward(xv, wv, o, r);
    return dot(to_host(o), dout);
  };
  Kokkos::deep_copy(dwv, 0.0f);
  rmsnorm_backward(Exec(), as_mat<Exec>(ddin.data(), N, C), dwv, as_mat<Exec>(ddout.data(), N, C), ConstMat<Exec>(),
                   as_mat<Exec>(dx.data(), N, C), dwt, rstd, as_mat<Exec>(scratch.data(), N, C), partials);
  expect_fd_matches([&](const std::vector<double>& v) { return f(v, w); }, x, to_host(ddin), "dinp");
  expect_fd_matches([&](const std::vector<double>& v) { return f(x, v); }, w, to_host(dwv), "dweight");
}

// bf16 runs: the input read as stored, the output and rstd rounded into bf16 once; the
// backward reads the stored input and rstd, its gradients fp32.
TYPED_TEST(RmsNormTest, Bf16StorageIsReadAndWrittenAsStored) {
  using Exec = TypeParam;
  const int N = 6, C = 24;
  const double eps = 1e-5;
  const auto x = bf16_values(random_vector(N * C, 11, -2, 2)), w = random_vector(C, 12, 0.5, 1.5),
             dout = random_vector(N * C, 14);
  const RmsRef ref = rmsnorm_reference(x, w, dout, N, C, eps);
  auto dx = to_device_bf16<Exec>(x);
  auto dw = to_device<Exec>(w);
  Bf16Vec<Exec> out("out", N * C), rstd("rstd", N);
  rmsnorm_forward(Exec(), Mat16<Exec>(out.data(), N, C), rstd, Mat16<Exec>(dx.data(), N, C), dw,
                  static_cast<float>(eps));
  for (const auto& [got, want, name] : {std::make_tuple(widened_to_host(out), ref.out, "out"),
                                       std::make_tuple(widened_to_host(rstd), ref.rstd, "rstd")}) {
    for (std::size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], std::abs(want[i]) / 256 + 1e-7) << name;
  }
  const RmsRef back = rmsnorm_reference(x, w, dout, N, C, eps, widened_to_host(rstd));
  auto ddin = Vec<Exec>("dinp", N * C), dwv = Vec<Exec>("dw", C);
  auto scratch = Vec<Exec>("scratch", N * C);
  Vec<Exec> partials("partials", column_partials(N, 256));
  auto ddout = to_device<Exec>(dout);
  rmsnorm_backward(Exec(), as_mat<Exec>(ddin.data(), N, C), dwv, as_mat<Exec>(ddout.data(), N, C), ConstMat<Exec>(),
                   Mat16<Exec>(dx.data(), N, C), dw, rstd, as_mat<Exec>(scratch.data(), N, C), partials);
  EXPECT_LT(rel_error(to_host(ddin), back.dinp), 1e-5);
  EXPECT_LT(rel_error(to_host(dwv), back.dw), 1e-5);
}

}  // namespace
}  // namespace lamina::test
