#pragma once
// A stream of copies between memory spaces, run in the order they are queued, and the host's
// view of how far it has got (mark()). On a device it is an execution-space instance of its
// own (a CUDA or HIP stream beside the compute's). On a host build the copies run either in
// the calling thread as they are queued (inline), or in order on a worker thread of the
// stream's own (threads): asynchronously, as on a device, so that an instruction that does not
// wait for a copy it depends on reads or overwrites the wrong data on a CPU too. Copies on
// such a stream only move bytes (no kernels), so the worker never runs Kokkos code beside
// the host thread's.
#include <Kokkos_Core.hpp>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "lamina/core/stream_event.hpp"

namespace lamina {

// How a host build runs the copies of its streams (parallel.host_copies).
enum class HostCopies { inline_, threads };

class CopyStream {
 public:
  using Exec = Kokkos::DefaultExecutionSpace;

  CopyStream(std::string name, HostCopies mode);
  ~CopyStream();
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;

  const std::string& name() const { return name_; }
  // The instance its device work is queued on (the default one on host back-ends).
  const Exec& instance() const { return instance_; }
  bool threaded() const { return worker_.joinable(); }

  // Queues dst = src (two views of the same length and element type).
  template <class Dst, class Src>
  void copy(const Dst& dst, const Src& src) {
    if (!threaded()) {
      Kokkos::deep_copy(instance_, dst, src);
      return;
    }
    // Host builds: both views are host memory.
    void* d = dst.data();
    const void* s = src.data();
    const std::size_t bytes = dst.size() * sizeof(typename Dst::value_type);
    queue([d, s, bytes] { std::memcpy(d, s, bytes); });
  }
  // The point after everything queued so far.
  StreamEvent mark();
  // Waits for everything queued so far.
  void wait() { mark().wait("the copies on stream '" + name_ + "'"); }

 private:
  class Ticket;
  void queue(std::function<void()> work);
  void run();

  std::string name_;
  Exec instance_;
  // threads: the work queued, how much was queued and how much has run
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> work_;
  std::uint64_t queued_ = 0, ran_ = 0;
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace lamina
