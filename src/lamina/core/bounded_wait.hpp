#pragma once
// Every wait for another rank is bounded by parallel.timeout: a rank that is hung, stopped
// or dead must end the job with a message, not freeze it on every other rank. Waits poll
// (MPI_Test, cudaEventQuery) instead of blocking, so the waiting thread itself notices the
// deadline and aborts the job cleanly. The few collective calls that cannot poll (creating
// communicators, HDF5's collective file operations) run inside a BlockingSection, which a
// watchdog thread ends after the timeout.
#include <chrono>
#include <string>
#include <thread>

#include "lamina/core/error.hpp"

namespace lamina {

// A rank waited longer than parallel.timeout for its peers (exit 3; the job is aborted).
class TimeoutError : public RunError {
 public:
  explicit TimeoutError(const std::string& what) : RunError(what) {}
};

// Seconds a rank waits for its peers; 0 waits forever. One value per process, set from
// the deck before the first communicator is made (default 600).
void set_wait_timeout(double seconds);
double wait_timeout();

// The message of a TimeoutError for a wait described as `what` (e.g. "MPI_Allreduce on
// group 'dp' (world ranks 0 2)").
std::string timeout_message(const std::string& what);

// Polls done() until it returns true; after wait_timeout() seconds throws TimeoutError
// with what(). Most waits end within microseconds, so it spins first; a long wait (a
// pipeline bubble, a slow peer) backs off to short sleeps that leave the core to others.
template <class Done, class What>
void bounded_wait(Done&& done, What&& what) {
  if (done()) return;
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  const double limit = wait_timeout();
  for (long polls = 1;; ++polls) {
    if (done()) return;
    const double waited = std::chrono::duration<double>(Clock::now() - start).count();
    if (limit > 0.0 && waited > limit) throw TimeoutError(timeout_message(what()));
    if (waited > 0.1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    } else if (waited > 0.01) {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    } else if (polls > 100) {
      std::this_thread::yield();
    }
  }
}

// While alive, a watchdog thread ends the process with exit 3 and the timeout's message if
// the section lasts longer than wait_timeout() (the launcher then takes the job down).
// Sections nest, per thread; the innermost names the wait.
class BlockingSection {
 public:
  explicit BlockingSection(std::string what);
  ~BlockingSection();
  BlockingSection(const BlockingSection&) = delete;
  BlockingSection& operator=(const BlockingSection&) = delete;
};

}  // namespace lamina
