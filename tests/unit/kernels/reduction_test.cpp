#include "lamina/kernels/reduction.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "test_util.hpp"

namespace lamina::test {
namespace {

// Sum and maximum of x[0, n) by a team of one through TeamRow, into out(0), out(1).
template <class Exec>
struct TeamRowReductions {
  ConstVec<Exec> x;
  Vec<Exec> out;
  std::int64_t n;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const TeamRow<typename Teams<Exec>::member_type> row{team};
    const float s = row.sum(n, [&](std::int64_t j) { return x(j); });
    const float m = row.max(n, [&](std::int64_t j) { return x(j); });
    Kokkos::single(Kokkos::PerTeam(team), [&] {
      out(0) = s;
      out(1) = m;
    });
  }
};

// x[j]; callable where SerialRow's loops are compiled for host and device alike.
struct Values {
  const float* x;
  KOKKOS_INLINE_FUNCTION float operator()(std::int64_t j) const { return x[j]; }
};

template <class Exec>
class RowReductionTest : public ::testing::Test {};
TYPED_TEST_SUITE(RowReductionTest, ExecSpaces);

// The host attention takes its softmax with SerialRow inside a thread's work item, the
// staged path with TeamRow: the same order, so the same bits from a team of one.
TYPED_TEST(RowReductionTest, SerialRowEqualsATeamOfOneBitForBit) {
  using Exec = TypeParam;
  for (const std::int64_t n : {1, 7, 8, 9, 15, 16, 17, 33, 64, 150}) {
    SCOPED_TRACE(n);
    const auto seed = 50 + static_cast<std::uint32_t>(n);
    const auto x = to_device<Exec>(random_vector(static_cast<std::size_t>(n), seed, -3, 3));
    Vec<Exec> out("out", 2);
    Kokkos::parallel_for("test::team_row", Teams<Exec>(Exec(), 1, 1), TeamRowReductions<Exec>{x, out, n});
    const std::vector<double> team = to_host(out);
    const std::vector<double> host = to_host(x);
    const std::vector<float> floats(host.begin(), host.end());
    const Values values_of{floats.data()};
    const float sum = SerialRow{}.sum(n, values_of), max = SerialRow{}.max(n, values_of);
    EXPECT_EQ(static_cast<double>(sum), team[0]);
    EXPECT_EQ(static_cast<double>(max), team[1]);
    EXPECT_EQ(static_cast<double>(max), *std::max_element(host.begin(), host.end()));
    EXPECT_NEAR(sum, std::accumulate(host.begin(), host.end(), 0.0), 1e-5);
  }
}

// A row's maximum in lanes is the largest value wherever it stands and whatever the others:
// all negative, infinities, both zeros (+0 wins, as it orders above -0), lengths around the
// sixteen lanes, the largest first, in the body and in the tail.
TEST(RowMaximum, IsTheLargestValueWhereverItStands) {
  const float inf = std::numeric_limits<float>::infinity();
  for (const std::int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100}) {
    for (std::int64_t at = 0; at < n; at += std::max<std::int64_t>(1, n / 7)) {
      SCOPED_TRACE(testing::Message() << "n " << n << ", largest at " << at);
      std::vector<float> x(static_cast<std::size_t>(n));
      for (std::int64_t j = 0; j < n; ++j) x[j] = -1.0f - 0.25f * static_cast<float>((j * 7) % 13);
      x[at] = -0.5f;
      const Values values{x.data()};
      EXPECT_EQ(SerialRow{}.max(n, values), -0.5f);
      x[at] = inf;
      EXPECT_EQ(SerialRow{}.max(n, values), inf);
      std::fill(x.begin(), x.end(), -inf);
      EXPECT_EQ(SerialRow{}.max(n, values), -inf);
      x[at] = 0.0f;
      if (n > 1) x[(at + 1) % n] = -0.0f;
      const float zero = SerialRow{}.max(n, values);
      EXPECT_EQ(zero, 0.0f);
      EXPECT_FALSE(std::signbit(zero));
    }
  }
  const std::vector<float> x = {-0.0f, -0.0f, -3.0f};
  EXPECT_TRUE(std::signbit(SerialRow{}.max(3, Values{x.data()})));
}

// The gradient norm's one reduction over many pieces of memory: equal to the double sum
// of every piece's squares, pieces of any length (empty ones, ones not a multiple of 8, and
// ones of several of a host's work items of 2048 elements, ending inside one). A float's
// square is exact in double, so only the order of the double additions differs.
TYPED_TEST(RowReductionTest, SpansSumOfSquaresIsTheSumOverEverySpan) {
  using Exec = TypeParam;
  const std::vector<std::int64_t> lengths = {13, 0, 8, 1, 0, 300, 7, 2048, 5000, 4096 + 8};
  std::vector<Vec<Exec>> buffers;
  std::vector<Span> spans;
  double want = 0.0;
  std::uint64_t seed = 3;
  for (const std::int64_t n : lengths) {
    const std::vector<double> x = random_vector(n, ++seed);
    for (const double v : x) want += static_cast<double>(static_cast<float>(v)) * static_cast<float>(v);
    buffers.push_back(to_device<Exec>(x));
    spans.push_back({buffers.back().data(), n});
  }
  const SpansSumOfSquares<Exec> sum(spans);
  EXPECT_NEAR(sum(Exec()), want, 1e-12 * want);
  EXPECT_EQ(SpansSumOfSquares<Exec>(std::vector<Span>{})(Exec()), 0.0);
}

}  // namespace
}  // namespace lamina::test
