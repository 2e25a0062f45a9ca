#include "lamina/core/bounded_wait.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "lamina/core/format.hpp"

namespace lamina {

namespace {

std::atomic<double> g_timeout{600.0};

using Clock = std::chrono::steady_clock;

// The open blocking sections and the thread that watches them. Never destroyed: the thread
// is detached and may still look at it while the process exits.
struct Watchdog {
  std::mutex mutex;
  std::vector<std::pair<Clock::time_point, std::string>> open;  // outermost first

  static Watchdog& get() {
    static Watchdog* w = [] {
      auto* p = new Watchdog;
      std::thread([p] { p->watch(); }).detach();
      return p;
    }();
    return *w;
  }

  void watch() {
    for (;;) {
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
      std::lock_guard<std::mutex> lock(mutex);
      const double limit = g_timeout;
      if (open.empty() || limit <= 0.0) continue;
      const double waited = std::chrono::duration<double>(Clock::now() - open.front().first).count();
      if (waited <= limit) continue;
      const std::string msg = "error: " + timeout_message(open.back().second) + "\n";
      const ssize_t ignored = write(STDERR_FILENO, msg.data(), msg.size());
      (void)ignored;
      _exit(3);
    }
  }
};

}  // namespace

void set_wait_timeout(double seconds) { g_timeout = seconds; }

double wait_timeout() { return g_timeout; }

std::string timeout_message(const std::string& what) {
  return strprintf("waited more than parallel.timeout = %g s for %s: another rank is hung, stopped or dead "
                   "(raise parallel.timeout if a step or a checkpoint legitimately takes longer; 0 waits forever)",
                   wait_timeout(), what.c_str());
}

BlockingSection::BlockingSection(std::string what) {
  Watchdog& w = Watchdog::get();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.open.emplace_back(Clock::now(), std::move(what));
}

BlockingSection::~BlockingSection() {
  Watchdog& w = Watchdog::get();
  std::lock_guard<std::mutex> lock(w.mutex);
  w.open.pop_back();
}

}  // namespace lamina
