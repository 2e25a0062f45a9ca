#include "lamina/core/stream_event.hpp"

#include "lamina/core/bounded_wait.hpp"

#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#elif defined(KOKKOS_ENABLE_HIP)
#include <hip/hip_runtime.h>
#endif

namespace lamina {

namespace {

#if defined(KOKKOS_ENABLE_CUDA) || defined(KOKKOS_ENABLE_HIP)
#if defined(KOKKOS_ENABLE_CUDA)
using Event = cudaEvent_t;
const auto kNotReady = cudaErrorNotReady;
#define LAMINA_GPU(name) cuda##name
#else
using Event = hipEvent_t;
const auto kNotReady = hipErrorNotReady;
#define LAMINA_GPU(name) hip##name
#endif

void check(decltype(LAMINA_GPU(Success)) rc, const char* what) {
  if (rc != LAMINA_GPU(Success)) throw RunError(std::string(what) + " failed: " + LAMINA_GPU(GetErrorString)(rc));
}

class DeviceEvent final : public StreamEvent::Impl {
 public:
  template <class Stream>
  explicit DeviceEvent(Stream stream) {
    check(LAMINA_GPU(EventCreateWithFlags)(&event_, LAMINA_GPU(EventDisableTiming)), "creating a device event");
    check(LAMINA_GPU(EventRecord)(event_, stream), "recording a device event");
  }
  ~DeviceEvent() override { LAMINA_GPU(EventDestroy)(event_); }
  bool done() override {
    const auto rc = LAMINA_GPU(EventQuery)(event_);
    if (rc == kNotReady) return false;
    check(rc, "querying a device event");
    return true;
  }

 private:
  Event event_{};
};
#endif

}  // namespace

StreamEvent StreamEvent::record(const Kokkos::DefaultExecutionSpace& on) {
#if defined(KOKKOS_ENABLE_CUDA)
  return StreamEvent(std::make_shared<DeviceEvent>(on.cuda_stream()));
#elif defined(KOKKOS_ENABLE_HIP)
  return StreamEvent(std::make_shared<DeviceEvent>(on.hip_stream()));
#else
  // Host back-ends run an instance's work in the calling thread; other devices (SYCL, ...)
  // have no event here yet: wait for the instance's queue at the point instead.
  on.fence();
  return StreamEvent();
#endif
}

void StreamEvent::wait(const std::string& what) const {
  if (!impl_) return;
  bounded_wait([this] { return impl_->done(); }, [&] { return what; });
}

}  // namespace lamina
