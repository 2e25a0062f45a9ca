#include "lamina/io/sampler.hpp"

#include <gtest/gtest.h>

#include <set>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

TEST(SequenceSampler, EachEpochVisitsEveryWindowOnce) {
  for (const std::int64_t tokens : {17, 65, 1000, 4097, 100001}) {
    const std::int64_t T = 16;
    SequenceSampler s(tokens, T, 42, true);
    const std::int64_t n = s.num_windows();
    ASSERT_EQ(n, (tokens - 1) / T);
    for (std::int64_t epoch = 0; epoch < 2; ++epoch) {
      std::set<std::int64_t> seen;
      for (std::int64_t k = epoch * n; k < (epoch + 1) * n; ++k) {
        const std::int64_t start = s.window_start(k);
        EXPECT_EQ(start % T, 0);
        EXPECT_LE(start + T + 1, tokens);
        seen.insert(start);
      }
      EXPECT_EQ(static_cast<std::int64_t>(seen.size()), n);
    }
  }
}

TEST(SequenceSampler, OrderDependsOnSeedAndEpochOnly) {
  SequenceSampler a(100000, 10, 7, true), b(100000, 10, 7, true), c(100000, 10, 8, true);
  int same_seed_diff = 0, other_seed_diff = 0, epoch_diff = 0;
  const std::int64_t n = a.num_windows();
  for (std::int64_t k = 0; k < 200; ++k) {
    same_seed_diff += a.window_start(k) != b.window_start(k);
    other_seed_diff += a.window_start(k) != c.window_start(k);
    epoch_diff += a.window_start(k) != a.window_start(k + n);
  }
  EXPECT_EQ(same_seed_diff, 0);
  EXPECT_GT(other_seed_diff, 150);
  EXPECT_GT(epoch_diff, 150);
}

TEST(SequenceSampler, UnshuffledIsSequential) {
  SequenceSampler s(1000, 10, 1, false);
  for (std::int64_t k = 0; k < 5; ++k) EXPECT_EQ(s.window_start(k), 10 * k);
  EXPECT_EQ(s.window_start(s.num_windows()), 0);
}

TEST(SequenceSampler, TooFewTokensIsAnInputError) { EXPECT_THROW(SequenceSampler(10, 10, 1, true), InputError); }

}  // namespace
}  // namespace lamina::test
