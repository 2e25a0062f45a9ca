#pragma once
// The end of an instruction that runs beside the host thread (a collective, a pipeline
// message, a copy between the memory tiers): the communicators' requests and the points of
// the streams its work was queued on (events: waiting for one does not wait for the work
// queued behind it), and what has to follow once they are done (adding a reduce-scattered shard into the accumulator, widening gathered bf16
// parameters, handing a staging buffer back to its pool). The executor keeps one per
// instruction and waits for it where a later instruction names it in `after`
// (schedule.hpp), so the follow-up runs at the same point of the program on every run,
// which the memory estimate's replay of the pools relies on.
#include <functional>
#include <utility>
#include <vector>

#include "lamina/comm/communicator.hpp"
#include "lamina/core/stream_event.hpp"

namespace lamina {

class Completion {
 public:
  void add(Request r) { requests_.push_back(std::move(r)); }
  void add(StreamEvent e) { events_.push_back(std::move(e)); }
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

  // Whether every request and event has completed; never blocks (it also moves MPI's
  // non-blocking operations on).
  bool test() {
    bool done = true;
    for (Request& r : requests_) done = r.test() && done;
    for (const StreamEvent& e : events_) done = done && e.done();
    return done;
  }
  // Waits for everything (within parallel.timeout), then runs the follow-up.
  void wait() {
    for (Request& r : requests_) r.wait();
    for (const StreamEvent& e : events_) e.wait("a copy between memory tiers");
    requests_.clear();
    events_.clear();
    if (then_) {
      auto f = std::move(then_);
      then_ = nullptr;
      f();
    }
  }
  bool empty() const { return requests_.empty() && events_.empty() && !then_; }

 private:
  std::vector<Request> requests_;
  std::vector<StreamEvent> events_;
  std::function<void()> then_;
};

}  // namespace lamina
