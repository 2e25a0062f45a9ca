#include "lamina/kernels/host_dnnl.hpp"

#include <cmath>
#include <stdexcept>
#include <vector>

#include "lamina/kernels/bf16.hpp"

#include "test_util.hpp"

namespace lamina::test {
namespace {

// A batch of rounding products over (sequence, head), each writing its head's columns of
// shared rows as attention's output products do (C rows A = heads x n wide, a sequence T rows
// further): every output is the exact sum of the bf16 operands rounded to nearest, within
// the fp32 sums' own error, which can tip a value onto the neighbouring bf16 one. Columns
// between the heads' outputs are left as they were.
TEST(HostDnnl, BatchedRoundingProductsWriteEachHeadsSumRoundedToBf16) {
  if (!host_bf16_products()) GTEST_SKIP() << "no bf16 products on this host";
  const std::int64_t S = 2, H = 3, m = 17, n = 8, k = 45, T = 20, ld = H * n + 4;
  const auto a = bf16_values(random_vector(S * H * m * k, 91)), b = bf16_values(random_vector(S * H * k * n, 92));
  std::vector<std::uint16_t> a16(a.size()), b16(b.size()), c16(S * T * ld, to_bf16(7.0f));
  for (std::size_t i = 0; i < a.size(); ++i) a16[i] = to_bf16(static_cast<float>(a[i]));
  for (std::size_t i = 0; i < b.size(); ++i) b16[i] = to_bf16(static_cast<float>(b[i]));
  RowMajorGemm g;
  g.ta = 'N';
  g.tb = 'N';
  g.m = m;
  g.n = n;
  g.k = k;
  g.lda = k;
  g.ldb = n;
  g.ldc = ld;
  HeadBatch batch;
  batch.sequences = S;
  batch.heads = H;
  batch.a = {H * m * k, m * k};
  batch.b = {H * k * n, k * n};
  batch.c = {T * ld, n};
  host_gemm_bf16_rounded(g, a16.data(), b16.data(), c16.data(), nullptr, batch);
  int off_by_a_step = 0;
  for (std::int64_t s = 0; s < S; ++s) {
    for (std::int64_t h = 0; h < H; ++h) {
      for (std::int64_t i = 0; i < m; ++i) {
        for (std::int64_t j = 0; j < n; ++j) {
          double sum = 0;
          const std::int64_t p = s * H + h;
          for (std::int64_t l = 0; l < k; ++l) sum += a[(p * m + i) * k + l] * b[(p * k + l) * n + j];
          const double want = from_bf16(to_bf16(static_cast<float>(sum))), step = std::abs(want) / 128 + 1e-30;
          const double got = from_bf16(c16[s * T * ld + i * ld + h * n + j]);
          const double e = std::abs(got - want);
          ASSERT_LE(e, step) << s << ", " << h << ", " << i << ", " << j << ": " << got << " against " << sum;
          if (e > 0) ++off_by_a_step;
        }
      }
    }
  }
  EXPECT_LE(off_by_a_step, S * H * m * n / 50) << "values a bf16 step from the rounded exact sum";
  for (std::int64_t s = 0; s < S; ++s) {
    for (std::int64_t i = 0; i < T; ++i) {
      for (std::int64_t j = H * n; j < ld; ++j) EXPECT_EQ(from_bf16(c16[s * T * ld + i * ld + j]), 7.0f);
      if (i >= m) {
        for (std::int64_t j = 0; j < H * n; ++j) EXPECT_EQ(from_bf16(c16[s * T * ld + i * ld + j]), 7.0f);
      }
    }
  }
  // A batch shares no bias: refused rather than added to one head.
  const std::vector<float> bias(n, 1.0f);
  EXPECT_THROW(host_gemm_bf16_rounded(g, a16.data(), b16.data(), c16.data(), bias.data(), batch), std::logic_error);
}

}  // namespace
}  // namespace lamina::test
