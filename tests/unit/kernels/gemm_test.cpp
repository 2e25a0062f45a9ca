#include "lamina/kernels/gemm.hpp"

#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/gelu.hpp"

#include "test_util.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class GemmTest : public ::testing::Test {};
TYPED_TEST_SUITE(GemmTest, ExecSpaces);

TYPED_TEST(GemmTest, BatchedProductsMatchDoubleReference) {
  using Exec = TypeParam;
  const int batch = 3, m = 4, k = 5, n = 6;
  const auto a = random_vector(batch * m * k, 71), b = random_vector(batch * n * k, 72), c0 = random_vector(batch * m * n, 73);
  auto da = to_device<Exec>(a), db = to_device<Exec>(b), dc = to_device<Exec>(c0);
  // C = 0.5 * A B^T + 2 C
  batched_gemm<Exec>(Exec(), "N", "T", 0.5f, as_mats<Exec>(da.data(), batch, m, k), as_mats<Exec>(db.data(), batch, n, k),
                     2.0f, as_mats<Exec>(dc.data(), batch, m, n));
  std::vector<double> want(batch * m * n);
  for (int p = 0; p < batch; ++p) {
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int l = 0; l < k; ++l) s += a[(p * m + i) * k + l] * b[(p * n + j) * k + l];
        want[(p * m + i) * n + j] = 0.5 * s + 2.0 * c0[(p * m + i) * n + j];
      }
    }
  }
  EXPECT_LT(rel_error(to_host(dc), want), 1e-6);
}

// Large enough that the OpenMP backend cuts each product into one tile per thread. Products
// in bf16 read operands rounded to bf16 and sum in fp32 where the execution space has a bf16
// engine (cuBLAS; oneDNN on a CPU with bf16 instructions), compared with a reference of
// rounded operands, far from the exact one at this tolerance; elsewhere they are fp32
// products. The transposed left operand's product (a weight's gradient) is summed in blocks
// of the reduction's rows on a host engine: its scratch holds a few rows.
TYPED_TEST(GemmTest, LargeProductsMatchDoubleReferenceForEveryTransposeAndMath) {
  using Exec = TypeParam;
  const int m = 200, n = 96, k = 48;
  const auto a = random_vector(m * k, 75), b = random_vector(k * n, 76), c0 = random_vector(m * n, 77);
  auto bf16 = [](std::vector<double> v) {
    for (auto& e : v) e = from_bf16(to_bf16(static_cast<float>(e)));
    return v;
  };
  const bool engine = product_math<Exec>(Precision::bf16) == ProductMath::bf16;
  for (const ProductMath math : {ProductMath::fp32, ProductMath::bf16}) {
    const bool rounded = math == ProductMath::bf16 && engine;
    const auto ar = rounded ? bf16(a) : a, br = rounded ? bf16(b) : b;
    for (const char* ta : {"N", "T"}) {
      for (const char* tb : {"N", "T"}) {
        SCOPED_TRACE(std::string(ta) + tb + " " + product_math_name(math));
        auto da = to_device<Exec>(a), db = to_device<Exec>(b), dc = to_device<Exec>(c0);
        const bool at = *ta == 'T', bt = *tb == 'T';
        // Room for both operands in bf16, or (A^T B) for 24 of the reduction's 48 rows.
        const std::size_t room = at && !bt ? 24 * (m + n) / 2 : (m * k + k * n) / 2;
        auto scratch = to_device<Exec>(std::vector<double>(room, NAN));
        gemm(Exec(), ta, tb, 0.5f, as_mat<Exec>(da.data(), at ? k : m, at ? m : k),
             as_mat<Exec>(db.data(), bt ? n : k, bt ? k : n), 2.0f, as_mat<Exec>(dc.data(), m, n), math, scratch);
        std::vector<double> want(m * n);
        for (int i = 0; i < m; ++i) {
          for (int j = 0; j < n; ++j) {
            double s = 0;
            for (int l = 0; l < k; ++l) s += ar[at ? l * m + i : i * k + l] * br[bt ? j * k + l : l * n + j];
            want[i * n + j] = 0.5 * s + 2.0 * c0[i * n + j];
          }
        }
        EXPECT_LT(rel_error(to_host(dc), want), 1e-6);
      }
    }
  }
}

// A weight stored in bf16 as the right operand, both ways round: against a double
// reference of the bf16 values (and, where a bf16 engine rounds the left operand too, of
// that rounded). The scratch holds a few columns (or rows) only, so that the product runs
// in several blocks, the last one narrower; where the BLAS is reached through Kokkos
// Kernels it holds the whole matrix, as product_scratch() says.
TYPED_TEST(GemmTest, ProductsWithABf16WeightMatchDoubleReference) {
  using Exec = TypeParam;
  const int m = 40, n = 23, k = 17;
  const auto a = random_vector(m * k, 78), c0 = random_vector(m * n, 80);
  auto bf16 = [](std::vector<double> v) {
    for (auto& e : v) e = from_bf16(to_bf16(static_cast<float>(e)));
    return v;
  };
  const auto w = bf16(random_vector(k * n, 79));  // the weight's values, as stored
  const auto ar = product_math<Exec>(Precision::bf16) == ProductMath::bf16 ? bf16(a) : a;
  const std::int64_t room = lamina::detail::kStridedProducts<Exec> ? 5 * std::max(k, n) : k * n;
  for (const char* tb : {"N", "T"}) {
    SCOPED_TRACE(tb);
    const bool bt = *tb == 'T';
    // The stored weight: (k, n) for "N", (n, k) for "T".
    std::vector<double> stored(k * n);
    for (int l = 0; l < k; ++l)
      for (int j = 0; j < n; ++j) stored[bt ? j * k + l : l * n + j] = w[l * n + j];
    Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, typename Exec::memory_space> w16("w16", stored.size());
    auto h16 = Kokkos::create_mirror_view(w16);
    for (std::size_t i = 0; i < stored.size(); ++i) h16(i) = to_bf16(static_cast<float>(stored[i]));
    Kokkos::deep_copy(w16, h16);
    const ConstMat16<Exec> weight(w16.data(), bt ? n : k, bt ? k : n);
    auto da = to_device<Exec>(a), dc = to_device<Exec>(c0);
    auto scratch = to_device<Exec>(std::vector<double>(static_cast<std::size_t>(room), NAN));
    gemm(Exec(), "N", tb, 0.5f, as_mat<Exec>(da.data(), m, k), MatRef<Exec>(weight), 2.0f,
         as_mat<Exec>(dc.data(), m, n), ProductMath::bf16, scratch);
    std::vector<double> want(m * n);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double s = 0;
        for (int l = 0; l < k; ++l) s += ar[i * k + l] * w[l * n + j];
        want[i * n + j] = 0.5 * s + 2.0 * c0[i * n + j];
      }
    }
    EXPECT_LT(rel_error(to_host(dc), want), 1e-6);
  }
}

// A product that writes bf16 with its bias (the epilogue of a host's oneDNN or of cuBLASLt;
// cuBLAS's without one): each output is the exact sum of the bf16 operands plus the fp32 bias, rounded to
// nearest, within the fp32 sums' own error (which can tip a value onto the neighbouring bf16
// one).
TYPED_TEST(GemmTest, RoundingProductsWriteTheirSumAndBiasRoundedToBf16) {
  using Exec = TypeParam;
  if (!rounding_products<Exec>(ProductMath::bf16, false)) GTEST_SKIP() << "products on this space do not round";
  const int m = 33, n = 21, k = 70;
  const auto a = bf16_values(random_vector(m * k, 81)), w = bf16_values(random_vector(k * n, 82));
  const auto bias = random_vector(n, 83);
  for (const char* tb : {"N", "T"}) {
    for (const bool with_bias : {true, false}) {
      if (with_bias && !rounding_products<Exec>(ProductMath::bf16, true)) continue;  // no bias epilogue here
      SCOPED_TRACE(std::string(tb) + (with_bias ? ", bias" : ", no bias"));
      const bool bt = *tb == 'T';
      std::vector<double> stored(k * n);
      for (int l = 0; l < k; ++l)
        for (int j = 0; j < n; ++j) stored[bt ? j * k + l : l * n + j] = w[l * n + j];
      auto a16 = to_device_bf16<Exec>(a), w16 = to_device_bf16<Exec>(stored);
      auto dbias = to_device<Exec>(bias);
      Bf16Vec<Exec> c16("c16", m * n);
      gemm_rounded(Exec(), tb, ConstMat16<Exec>(a16.data(), m, k),
                   MatRef<Exec>(ConstMat16<Exec>(w16.data(), bt ? n : k, bt ? k : n)),
                   with_bias ? ConstVec<Exec>(dbias) : ConstVec<Exec>(), Mat16<Exec>(c16.data(), m, n));
      const auto got = widened_to_host(c16);
      int off_by_a_step = 0;
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double s = with_bias ? static_cast<double>(static_cast<float>(bias[j])) : 0.0;
          for (int l = 0; l < k; ++l) s += a[i * k + l] * w[l * n + j];
          const double want = from_bf16(to_bf16(static_cast<float>(s))), step = std::abs(want) / 128 + 1e-30;
          const double e = std::abs(got[i * n + j] - want);
          ASSERT_LE(e, step) << i << ", " << j << ": " << got[i * n + j] << " against " << s;
          if (e > 0) ++off_by_a_step;
        }
      }
      EXPECT_LE(off_by_a_step, m * n / 50) << "values a bf16 step from the rounded exact sum";
    }
  }
}

TYPED_TEST(GemmTest, ColumnSumsAccumulate) {
  using Exec = TypeParam;
  const int rows = 9, cols = 4;
  const auto mv = random_vector(rows * cols, 74);
  auto dm = to_device<Exec>(mv);
  Vec<Exec> partials("partials", column_partials(rows + 3, 256));
  auto dst = to_device<Exec>(std::vector<double>(cols, 1.0));
  add_column_sums(Exec(), dst, as_mat<Exec>(dm.data(), rows, cols), partials);
  std::vector<double> want(cols, 1.0);
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < cols; ++c) want[c] += mv[i * cols + c];
  EXPECT_LT(rel_error(to_host(dst), want), 1e-6);
}

// A device's column sums (two stages: blocks of rows, then their partial sums in order), run
// here on this space: the double sums within fp32 rounding, added onto what dst held, from an
// fp32 or a bf16 matrix, with room for many blocks, for two, and for none (straight into dst);
// the same bits every time, and in blocks of kColumnBlockRows rows, a tail block, columns past
// a tile.
TYPED_TEST(GemmTest, TwoStageColumnSumsAreTheSumsInAFixedOrder) {
  using Exec = TypeParam;
  const int rows = 3 * static_cast<int>(lamina::detail::kColumnBlockRows) + 5;
  const int cols = static_cast<int>(lamina::detail::kColumnTile) + 9;
  const auto mv = bf16_values(random_vector(rows * cols, 75)), d0 = random_vector(cols, 76);
  auto dm = to_device<Exec>(mv);
  auto dm16 = to_device_bf16<Exec>(mv);
  std::vector<double> want = d0;
  for (int i = 0; i < rows; ++i)
    for (int c = 0; c < cols; ++c) want[c] += mv[i * cols + c];
  for (const std::int64_t room : {column_partials(rows, cols), std::int64_t{2} * cols, std::int64_t{cols - 1}}) {
    SCOPED_TRACE(room);
    Vec<Exec> partials("partials", room);
    std::vector<double> got[3];
    for (int run = 0; run < 3; ++run) {
      auto dst = to_device<Exec>(d0);
      if (run < 2) {
        lamina::detail::two_stage_column_sums(Exec(), dst, as_mat<Exec>(dm.data(), rows, cols), partials);
      } else {
        lamina::detail::two_stage_column_sums(Exec(), dst, ConstMat16<Exec>(dm16.data(), rows, cols), partials);
      }
      got[run] = to_host(dst);
    }
    EXPECT_LT(rel_error(got[0], want), 1e-6);
    EXPECT_EQ(got[1], got[0]);
    EXPECT_EQ(got[2], got[0]);
  }
}

// The pass that rounds an output gradient for the products, applies GELU's derivative and
// adds its column sums, for a chunk of rows from r0, as a host takes it (a work item per block
// of rows) and as a device does (narrow_rows_summed_by_tiles: a team per block of rows and
// tile of columns, a thread per column), run here on this space: each value gelu'(pre) dy
// rounded; each column summed from zero over blocks of rows, those sums added in block order
// and then onto what the column held (within fp32 rounding of the double sums). The blocks
// depend on the rows and the room for partial sums only (so on no thread count): three of 47
// or 46 rows (at most 64 each), two of 70 with room for two, one with room for a row; columns
// past a tile. On a host every bit is that order's; a device's compiler may fuse a product
// into a sum (a bf16 step apart, within fp32 rounding), the same bits on every run.
TYPED_TEST(GemmTest, RoundingAnOutputGradientSumsItsColumnsInBlocksOfRows) {
  using Exec = TypeParam;
  const int N = 150, r0 = 3, rows = 140, cols = 293;
  const auto dy = random_vector(N * cols, 77), pre = bf16_values(random_vector(N * cols, 78, -3.0, 3.0));
  const auto s0 = random_vector(cols, 79);
  auto ddy = to_device<Exec>(dy);
  auto dpre = to_device_bf16<Exec>(pre);
  const GeluGate<Exec, std::uint16_t> gate{ConstMat16<Exec>(dpre.data(), N, cols)};
  std::vector<float> gated(rows * cols);
  std::vector<double> exact = s0;
  for (int i = 0; i < rows; ++i) {
    for (int j = 0; j < cols; ++j) {
      const int e = (r0 + i) * cols + j;
      gated[i * cols + j] = gelu_grad(static_cast<float>(pre[e])) * static_cast<float>(dy[e]);
      exact[j] += gated[i * cols + j];
    }
  }
  const ConstMat<Exec> dym(as_mat<Exec>(ddy.data(), N, cols));
  for (const bool tiles : {false, true}) {
    for (const auto& [room, blocks] : {std::pair<int, int>{3 * cols, 3}, {2 * cols + 5, 2}, {cols, 1}}) {
      SCOPED_TRACE(std::string(tiles ? "by tiles, " : "") + std::to_string(blocks) + " blocks");
      ASSERT_EQ(lamina::detail::column_blocks(rows, cols, room), blocks);
      const int block_rows = (rows + blocks - 1) / blocks;
      std::vector<float> want_sums(cols);
      for (int j = 0; j < cols; ++j) {
        float total = 0.0f;
        for (int b = 0; b < blocks; ++b) {
          float sum = 0.0f;
          for (int i = b * block_rows; i < std::min(rows, (b + 1) * block_rows); ++i) sum += gated[i * cols + j];
          total += sum;
        }
        want_sums[j] = static_cast<float>(s0[j]) + total;
      }
      std::vector<double> got[2], got16[2];
      for (int run = 0; run < 2; ++run) {
        auto sums = to_device<Exec>(s0);
        Vec<Exec> partials("partials", room);
        Bf16Vec<Exec> out("out", rows * cols);
        if (tiles) {
          lamina::detail::narrow_rows_summed_by_tiles(Exec(), out.data(), dym, r0, rows, sums, partials, gate);
        } else {
          lamina::detail::narrow_rows_summed(Exec(), out.data(), dym, r0, rows, sums, partials, gate);
        }
        got[run] = to_host(sums);
        got16[run] = widened_to_host(out);
      }
      EXPECT_EQ(got[1], got[0]);
      EXPECT_EQ(got16[1], got16[0]);
      EXPECT_LT(rel_error(got[0], exact), 1e-6);
      for (int e = 0; e < rows * cols; ++e) {
        const double want = from_bf16(to_bf16(gated[e]));
        if (lamina::detail::kOnHost<Exec>) {
          ASSERT_EQ(got16[0][e], want) << e;
        } else {
          ASSERT_LE(std::abs(got16[0][e] - want), std::abs(want) / 128 + 1e-30) << e;
        }
      }
      if (lamina::detail::kOnHost<Exec>) {
        for (int j = 0; j < cols; ++j) ASSERT_EQ(static_cast<float>(got[0][j]), want_sums[j]) << j;
      }
    }
  }
}

// A host's column sums by work items of `block` columns, each taking 256 at a time through
// all the rows: every column summed in row order from zero and then added onto dst, the same
// bits in one block of all the columns (one thread) as in blocks of 300 (a 256 and a 44 inside
// each) and of 16 (several threads' blocks: summed_columns), from fp32 and from bf16.
TYPED_TEST(GemmTest, HostColumnSumsAreInRowOrderInAnyBlocks) {
  using Exec = TypeParam;
  if constexpr (!lamina::detail::kOnHost<Exec>) {
    GTEST_SKIP() << "a host's pass (a device sums in two stages: TwoStageColumnSumsAreTheSumsInAFixedOrder)";
  } else {
    const int rows = 7, cols = 600;
    const auto m = bf16_values(random_vector(rows * cols, 81)), d0 = random_vector(cols, 82);
    auto dm = to_device<Exec>(m);
    auto dm16 = to_device_bf16<Exec>(m);
    std::vector<float> want(cols);
    for (int j = 0; j < cols; ++j) {
      float sum = 0.0f;
      for (int i = 0; i < rows; ++i) sum += static_cast<float>(m[i * cols + j]);
      want[j] = static_cast<float>(d0[j]) + sum;
    }
    for (const bool bf16 : {false, true}) {
      for (const std::int64_t block : {std::int64_t{cols}, std::int64_t{300}, std::int64_t{16}}) {
        SCOPED_TRACE(std::to_string(block) + (bf16 ? ", bf16" : ""));
        auto dst = to_device<Exec>(d0);
        const auto sums = [&](auto matrix) {
          using T = StoredType<decltype(matrix)>;
          Kokkos::parallel_for(Kokkos::RangePolicy<Exec, Kokkos::IndexType<std::int64_t>>(0, (cols + block - 1) / block),
                               lamina::detail::ColumnSums<Exec, T>{dst, matrix, rows, cols, block});
        };
        if (bf16) {
          sums(ConstMat16<Exec>(dm16.data(), rows, cols));
        } else {
          sums(ConstMat<Exec>(as_mat<Exec>(dm.data(), rows, cols)));
        }
        const auto got = to_host(dst);
        for (int j = 0; j < cols; ++j) ASSERT_EQ(static_cast<float>(got[j]), want[j]) << j;
      }
    }
  }
}

}  // namespace
}  // namespace lamina::test
