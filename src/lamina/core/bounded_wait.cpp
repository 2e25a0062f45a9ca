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

// The open blocking sections of every thread (a background checkpoint writer has its own
// beside the training thread's) and the thread that watches them. Never destroyed: the
// thread is detached and may still look at it while the process exits.
struct Watchdog {
  struct Section {
    std::thread::id thread;
    Clock::time_point start;
    std::string what;
  };
  std::mutex mutex;
  std::vector<Section> open;  // in the order they opened; a thread's outermost first

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
      if (limit <= 0.0) continue;
      for (const Section& outer : open) {
        // A thread's nest lasts from its outermost section; its innermost names the wait.
        const double waited = std::chrono::duration<double>(Clock::now() - outer.start).count();
        if (waited <= limit) continue;
        const Section* inner = &outer;
        for (const Section& s : open) {
          if (s.thread == outer.thread) inner = &s;
        }
        const std::string msg = "error: " + timeout_message(inner->what) + "\n";
        const ssize_t ignored = write(STDERR_FILENO, msg.data(), msg.size());
        (void)ignored;
        _exit(3);
      }
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
  w.open.push_back({std::this_thread::get_id(), Clock::now(), std::move(what)});
}

BlockingSection::~BlockingSection() {
  Watchdog& w = Watchdog::get();
  std::lock_guard<std::mutex> lock(w.mutex);
  // This thread's innermost section; other threads' may have opened after it.
  for (auto it = w.open.end(); it != w.open.begin();) {
    if ((--it)->thread == std::this_thread::get_id()) {
      w.open.erase(it);
      return;
    }
  }
}

}  // namespace lamina
