#include "lamina/core/copy_stream.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <random>

#include "lamina/core/exec_instances.hpp"

namespace lamina {

namespace {

constexpr bool kHostMemory =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible;

// LAMINA_COPY_DELAY_US: each copy of a threaded stream starts up to this much later, at
// random, so that copies on different streams land in every order: a test can then make a
// missing wait all but certain to show.
long copy_delay_us() {
  const char* v = std::getenv("LAMINA_COPY_DELAY_US");
  return v != nullptr ? std::max(0L, std::strtol(v, nullptr, 10)) : 0L;
}

}  // namespace

class CopyStream::Ticket final : public StreamEvent::Impl {
 public:
  Ticket(CopyStream& s, std::uint64_t at) : s_(s), at_(at) {}
  bool done() override {
    std::lock_guard<std::mutex> lock(s_.mutex_);
    return s_.ran_ >= at_;
  }

 private:
  CopyStream& s_;
  std::uint64_t at_;
};

CopyStream::CopyStream(std::string name, HostCopies mode)
    : name_(std::move(name)), instance_(transfer_instance<Exec>()) {
  if (kHostMemory && mode == HostCopies::threads) worker_ = std::thread([this] { run(); });
}

CopyStream::~CopyStream() {
  if (!worker_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  worker_.join();
}

void CopyStream::queue(std::function<void()> work) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    work_.push_back(std::move(work));
    ++queued_;
  }
  wake_.notify_all();
}

void CopyStream::run() {
  const long delay = copy_delay_us();
  std::minstd_rand random(static_cast<unsigned>(std::hash<std::string>()(name_)));
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    wake_.wait(lock, [this] { return stop_ || !work_.empty(); });
    if (work_.empty()) return;  // stopping, nothing left
    std::function<void()> w = std::move(work_.front());
    work_.pop_front();
    lock.unlock();
    if (delay > 0) std::this_thread::sleep_for(std::chrono::microseconds(random() % (delay + 1)));
    w();
    lock.lock();
    ++ran_;
  }
}

StreamEvent CopyStream::mark() {
  if (!threaded()) return StreamEvent::record(instance_);
  std::lock_guard<std::mutex> lock(mutex_);
  if (ran_ >= queued_) return StreamEvent();
  return StreamEvent(std::make_shared<Ticket>(*this, queued_));
}

}  // namespace lamina
