// A first stop signal is recorded for the trainer to act on; a second ends the process.
// Each case runs in a child process so that the test runner keeps its own handlers.
#include "lamina/core/stop_signal.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>

namespace lamina::test {
namespace {

// Runs body() in a child; returns its exit status (-1 if it did not exit normally).
template <class Body>
int in_child(Body body) {
  const pid_t pid = ::fork();
  if (pid == 0) ::_exit(body());
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

TEST(StopSignal, TheFirstSignalIsRecorded) {
  for (int sig : {SIGINT, SIGTERM, SIGUSR1}) {
    const int code = in_child([sig] {
      install_stop_handlers();
      if (stop_requested() != 0) return 1;
      std::raise(sig);
      return stop_requested() == sig ? 0 : 2;
    });
    EXPECT_EQ(code, 0) << signal_name(sig);
  }
}

TEST(StopSignal, ASecondSignalExitsAtOnce) {
  const int code = in_child([] {
    install_stop_handlers();
    std::raise(SIGTERM);
    std::raise(SIGTERM);
    return 0;  // not reached: the second signal exits
  });
  EXPECT_EQ(code, 128 + SIGTERM);
}

TEST(StopSignal, InterruptedExitsWith128PlusTheSignal) {
  const Interrupted e(SIGUSR1, "stopped");
  EXPECT_EQ(static_cast<int>(e.code()), 128 + SIGUSR1);
  EXPECT_STREQ(signal_name(SIGUSR1), "SIGUSR1");
}

}  // namespace
}  // namespace lamina::test
