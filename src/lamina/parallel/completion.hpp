#pragma once
// The end of an instruction that runs beside the host thread (a collective, a pipeline
// message, a copy between the memory tiers): the communicators' requests and the
// execution-space instances its work was queued on, and what has to follow once they are
// done (adding a reduce-scattered shard into the accumulator, widening gathered bf16
// parameters, handing a staging buffer back to its pool). The executor keeps one per
// instruction and waits for it where a later instruction names it in `after`
// (schedule.hpp), so the follow-up runs at the same point of the program on every run,
// which the memory estimate's replay of the pools relies on.
#include <Kokkos_Core.hpp>
#include <functional>
#include <utility>
#include <vector>

#include "lamina/comm/communicator.hpp"

namespace lamina {

class Completion {
 public:
  using Exec = Kokkos::DefaultExecutionSpace;

  void add(Request r) { requests_.push_back(std::move(r)); }
  void add(const Exec& queued_on) { instances_.push_back(queued_on); }
  // Runs after the requests and the instances' work, once (at wait()), after any
  // follow-up given before.
  void then(std::function<void()> f) {
    if (then_) {
      then_ = [first = std::move(then_), second = std::move(f)] {
        first();
        second();
      };
    } else {
      then_ = std::move(f);
    }
  }

  // Whether every request has completed; never blocks (it also moves MPI's non-blocking
  // operations on). Copies queued on an instance cannot be asked without a fence: while
  // there are any, false.
  bool test() {
    bool done = true;
    for (Request& r : requests_) done = r.test() && done;
    return done && instances_.empty();
  }
  // Waits for everything (each request within parallel.timeout), then runs the follow-up.
  void wait() {
    for (Request& r : requests_) r.wait();
    for (const Exec& e : instances_) e.fence();
    requests_.clear();
    instances_.clear();
    if (then_) {
      auto f = std::move(then_);
      then_ = nullptr;
      f();
    }
  }
  bool empty() const { return requests_.empty() && instances_.empty() && !then_; }

 private:
  std::vector<Request> requests_;
  std::vector<Exec> instances_;
  std::function<void()> then_;
};

}  // namespace lamina
