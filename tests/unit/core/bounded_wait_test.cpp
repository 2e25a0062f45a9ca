// Waits for other ranks end after parallel.timeout with a message naming the wait.
#include "lamina/core/bounded_wait.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

namespace lamina::test {
namespace {

class BoundedWait : public ::testing::Test {
 protected:
  void TearDown() override { set_wait_timeout(600.0); }
};

TEST_F(BoundedWait, ReturnsWhenDone) {
  set_wait_timeout(5.0);
  int polls = 0;
  bounded_wait([&] { return ++polls == 1000; }, [] { return std::string("a test"); });
  EXPECT_EQ(polls, 1000);
}

TEST_F(BoundedWait, ThrowsAfterTheTimeoutNamingTheWait) {
  set_wait_timeout(0.05);
  const auto t0 = std::chrono::steady_clock::now();
  try {
    bounded_wait([] { return false; }, [] { return std::string("MPI_Irecv with world rank 3 (group 'pp')"); });
    FAIL() << "a wait that never ends returned";
  } catch (const TimeoutError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("MPI_Irecv with world rank 3 (group 'pp')"), std::string::npos) << what;
    EXPECT_NE(what.find("waited more than parallel.timeout = 0.05 s for MPI_Irecv"), std::string::npos) << what;
    EXPECT_EQ(e.code(), ExitCode::run_failed);
  }
  EXPECT_GE(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 0.05);
}

TEST_F(BoundedWait, ZeroWaitsForever) {
  set_wait_timeout(0.0);
  const auto t0 = std::chrono::steady_clock::now();
  // Done after 0.2 s: far past any timeout a zero could be mistaken for.
  bounded_wait([&] { return std::chrono::steady_clock::now() - t0 > std::chrono::milliseconds(200); },
               [] { return std::string("a test"); });
  SUCCEED();
}

// A death test re-executes this binary for the child ("threadsafe"), so that the child
// starts its own watchdog thread instead of inheriting a fork without it.
TEST_F(BoundedWait, ABlockingSectionPastTheTimeoutEndsTheProcessWithExit3) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_wait_timeout(0.3);
        const BlockingSection section("a collective that never returns");
        std::this_thread::sleep_for(std::chrono::seconds(20));
        std::exit(0);
      },
      ::testing::ExitedWithCode(3), "waited more than parallel.timeout = 0.3 s for a collective that never returns");
}

// A background checkpoint writer waits in sections of its own beside the training thread:
// the timeout counts from each thread's outermost section and names that thread's wait.
TEST_F(BoundedWait, EachThreadsSectionsAreTimedAndNamedOnTheirOwn) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        set_wait_timeout(0.5);
        std::thread writer([] {
          const BlockingSection section("the background write");
          std::this_thread::sleep_for(std::chrono::seconds(20));
        });
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        // Opened later, on this thread: the writer's section is the one past the timeout.
        const BlockingSection section("the training thread's collective");
        std::this_thread::sleep_for(std::chrono::seconds(20));
        writer.join();
        std::exit(0);
      },
      ::testing::ExitedWithCode(3), "waited more than parallel.timeout = 0.5 s for the background write");
}

TEST_F(BoundedWait, ABlockingSectionThatEndsInTimeDoesNothing) {
  set_wait_timeout(0.3);
  { const BlockingSection section("a short collective"); }
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  SUCCEED();  // still alive: the watchdog forgot the closed section
}

}  // namespace
}  // namespace lamina::test
