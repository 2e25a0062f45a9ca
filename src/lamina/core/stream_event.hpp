#pragma once
// A point in a stream's queue that the host can test and wait for without waiting for the
// work queued behind it: a CUDA or HIP event recorded on an execution-space instance, or a
// ticket of a copy stream's worker thread (copy_stream.hpp). On host back-ends, whose
// instances run their work in the calling thread, a recorded point has always passed.
#include <Kokkos_Core.hpp>
#include <memory>
#include <string>

namespace lamina {

class StreamEvent {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual bool done() = 0;  // never blocks
  };

  StreamEvent() = default;  // passed
  explicit StreamEvent(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

  // The point after the work queued on `on` so far.
  static StreamEvent record(const Kokkos::DefaultExecutionSpace& on);

  bool done() const { return !impl_ || impl_->done(); }
  // Waits (bounded by parallel.timeout, naming `what`: a device that never finishes a copy is
  // as stuck as a rank that never answers).
  void wait(const std::string& what) const;

 private:
  std::shared_ptr<Impl> impl_;
};

}  // namespace lamina
