// for_each_index: every index once, on as many threads as asked, and the exception of the
// smallest failing index rethrown after all have run.
#include "lamina/core/host_parallel.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace lamina::test {
namespace {

TEST(HostParallel, EveryIndexRunsOnceOnTheThreadsAsked) {
  for (const int threads : {1, 3}) {
    std::vector<std::atomic<int>> calls(1000);
    std::mutex m;
    std::set<std::thread::id> ids;
    for_each_index(calls.size(), threads, [&](std::size_t i) {
      calls[i].fetch_add(1);
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    });
    for (const auto& c : calls) EXPECT_EQ(c.load(), 1);
    EXPECT_LE(ids.size(), static_cast<std::size_t>(threads));
  }
  for_each_index(0, 4, [](std::size_t) { FAIL() << "no index to run"; });
  EXPECT_GE(usable_cores(), 1);
}

TEST(HostParallel, TheSmallestFailingIndexThrowsAfterEveryIndexRan) {
  std::atomic<int> ran{0};
  try {
    for_each_index(64, 4, [&](std::size_t i) {
      ran.fetch_add(1);
      if (i == 9 || i == 40) throw std::runtime_error("index " + std::to_string(i));
    });
    FAIL() << "nothing thrown";
  } catch (const std::runtime_error& e) {
    EXPECT_STREQ(e.what(), "index 9");
  }
  EXPECT_EQ(ran.load(), 64);
}

}  // namespace
}  // namespace lamina::test
