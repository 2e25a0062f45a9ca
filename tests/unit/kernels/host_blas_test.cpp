#include "lamina/kernels/host_blas.hpp"

#include <cstdlib>
#include <set>

#include "lamina/kernels/host_dnnl.hpp"
#include "test_util.hpp"

namespace lamina::test {
namespace {

// A row-major matrix of `rows` x `cols` inside one with row stride `ld` (>= cols), so that
// leading dimensions other than the width are exercised.
struct Strided {
  std::int64_t rows, cols, ld;
  std::vector<double> values;
  std::vector<float> data;
  Strided(std::int64_t r, std::int64_t c, std::int64_t pad, std::uint32_t seed)
      : rows(r), cols(c), ld(c + pad), values(random_vector(static_cast<std::size_t>(r * (c + pad)), seed)),
        data(values.begin(), values.end()) {}
  double at(std::int64_t i, std::int64_t j) const { return values[static_cast<std::size_t>(i * ld + j)]; }
};

// The same product once and cut into `count` tiles, against a double-precision reference.
double tiled_error(char ta, char tb, std::int64_t m, std::int64_t n, std::int64_t k, int count) {
  const Strided a(ta == 'N' ? m : k, ta == 'N' ? k : m, 3, 81), b(tb == 'N' ? k : n, tb == 'N' ? n : k, 5, 82);
  Strided c(m, n, 2, 83);
  RowMajorGemm g;
  g.ta = ta;
  g.tb = tb;
  g.m = m;
  g.n = n;
  g.k = k;
  g.alpha = 0.5f;
  g.a = a.data.data();
  g.lda = a.ld;
  g.b = b.data.data();
  g.ldb = b.ld;
  g.beta = 2.0f;
  g.c = c.data.data();
  g.ldc = c.ld;
  for (int t = 0; t < count; ++t) host_sgemm(gemm_tile(g, t, count));
  std::vector<double> got, want;
  for (std::int64_t i = 0; i < c.rows; ++i) {
    for (std::int64_t j = 0; j < c.ld; ++j) {
      double s = 0;
      for (std::int64_t l = 0; l < k && j < n; ++l) {
        s += (ta == 'N' ? a.at(i, l) : a.at(l, i)) * (tb == 'N' ? b.at(l, j) : b.at(j, l));
      }
      // The padding past each row's n columns must stay as it was.
      want.push_back(j < n ? 0.5 * s + 2.0 * c.at(i, j) : c.at(i, j));
      got.push_back(c.data[static_cast<std::size_t>(i * c.ld + j)]);
    }
  }
  return rel_error(got, want);
}

TEST(HostBlas, TilesTogetherComputeTheWholeProduct) {
  ASSERT_TRUE(kHostBlasLinked) << "built without OpenBLAS: the host BLAS cannot be called directly";
  for (const char ta : {'N', 'T'}) {
    for (const char tb : {'N', 'T'}) {
      for (const int count : {1, 2, 3, 7}) {
        SCOPED_TRACE(::testing::Message() << ta << tb << " in " << count << " tiles");
        EXPECT_LT(tiled_error(ta, tb, 70, 37, 19, count), 1e-6);  // cut by rows
        EXPECT_LT(tiled_error(ta, tb, 21, 90, 11, count), 1e-6);  // cut by columns
      }
    }
  }
}

TEST(HostBlas, TilesAreDisjointWholeBlocksOf16) {
  RowMajorGemm g;
  g.m = 1000;
  g.n = 40;
  g.k = 8;
  g.lda = 8;
  g.ldc = 40;
  float dummy = 0;
  g.a = &dummy;
  g.c = &dummy;
  std::set<std::ptrdiff_t> starts;
  std::int64_t rows = 0;
  for (int t = 0; t < 3; ++t) {
    const RowMajorGemm tile = gemm_tile(g, t, 3);
    EXPECT_EQ(tile.n, g.n);
    if (t + 1 < 3) {
      EXPECT_EQ(tile.m % 16, 0);
    }
    EXPECT_EQ(tile.c - g.c, rows * g.ldc);
    EXPECT_EQ(tile.a - g.a, rows * g.lda);
    starts.insert(tile.c - g.c);
    rows += tile.m;
  }
  EXPECT_EQ(rows, g.m);
  EXPECT_EQ(starts.size(), 3u);
  EXPECT_EQ(gemm_tile(g, 5, 3).m, 0) << "a tile past the end is empty";
}

TEST(HostBlas, TilesAreRowsWhereEachGetsWholeBlocksOfThem) {
  RowMajorGemm g;
  g.m = 1024;
  g.n = 8192;
  EXPECT_EQ(gemm_tile(g, 1, 2).m, 512) << "wider than tall, still cut by rows";
  EXPECT_EQ(gemm_tile(g, 1, 2).n, g.n);
  g.m = 40;
  EXPECT_EQ(gemm_tile(g, 1, 4).m, g.m) << "too few rows for four tiles: cut by columns";
  EXPECT_EQ(gemm_tile(g, 1, 4).n, 2048);
}

TEST(HostBlas, SmallProductsAreNotCut) {
  RowMajorGemm g;
  g.m = g.n = g.k = 16;
  EXPECT_EQ(gemm_tile_count(g, 8), 1);
  g.m = g.n = 1024;
  g.k = 256;
  EXPECT_EQ(gemm_tile_count(g, 8), 8);
  g.m = 20;  // the longer side, 1024, still has 64 blocks of 16
  EXPECT_EQ(gemm_tile_count(g, 8), 8);
  g.m = g.n = 20;  // two blocks of 16 at most
  g.k = 100000;
  EXPECT_EQ(gemm_tile_count(g, 8), 2);
}

TEST(HostBlas, ConfigurationNamesBothThreadPools) {
  std::string warning;
  const std::string line = configure_host_blas(warning);
  EXPECT_NE(line.find("host threads: BLAS"), std::string::npos) << line;
  EXPECT_NE(line.find(std::string("Kokkos ") + Kokkos::DefaultHostExecutionSpace::name()), std::string::npos) << line;
}

// OMP_WAIT_POLICY=passive (any case) is named where OpenMP threads run kernels or bf16
// products; any other policy, or none, is not.
TEST(HostBlas, APassiveOpenMpWaitPolicyIsNamedWhereOpenMpThreadsRun) {
  const char* before = std::getenv("OMP_WAIT_POLICY");
  const std::string saved = before != nullptr ? before : "";
  const bool openmp =
      std::string(Kokkos::DefaultHostExecutionSpace::name()) == "OpenMP" || host_bf16_products();
  for (const char* policy : {"passive", "PASSIVE"}) {
    ::setenv("OMP_WAIT_POLICY", policy, 1);
    const std::string w = openmp_wait_warning();
    EXPECT_EQ(w.empty(), !openmp) << w;
    if (openmp) {
      EXPECT_NE(w.find(std::string("OMP_WAIT_POLICY=") + policy), std::string::npos) << w;
    }
  }
  ::setenv("OMP_WAIT_POLICY", "active", 1);
  EXPECT_EQ(openmp_wait_warning(), "");
  ::unsetenv("OMP_WAIT_POLICY");
  EXPECT_EQ(openmp_wait_warning(), "");
  if (before != nullptr) ::setenv("OMP_WAIT_POLICY", saved.c_str(), 1);
}

}  // namespace
}  // namespace lamina::test
