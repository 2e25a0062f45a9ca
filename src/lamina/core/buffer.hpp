#pragma once
// A tracked, owning 1-D allocation in one Kokkos memory space. Shaped views (matrices,
// named parameter tensors) are unmanaged views into it, so one contiguous buffer can
// back many tensors (DESIGN.md idea 2) and every byte is accounted for.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <utility>

#include "lamina/core/memory_tracker.hpp"

namespace lamina {

template <class T, class Mem>
class Buffer {
 public:
  using view_type = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;

  Buffer() = default;
  // Zero-initialised: touching every page once here keeps page faults out of the steps.
  Buffer(MemoryTracker& tracker, MemCategory category, const std::string& label, std::int64_t n)
      : view_(label, static_cast<std::size_t>(n)), tracker_(&tracker), category_(category) {
    tracker_->allocate(Mem::name(), category_, bytes());
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept { swap(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    Buffer tmp(std::move(o));
    swap(tmp);
    return *this;
  }
  ~Buffer() {
    if (tracker_ != nullptr) tracker_->release(Mem::name(), category_, bytes());
  }

  const view_type& view() const { return view_; }
  T* data() const { return view_.data(); }
  std::int64_t size() const { return static_cast<std::int64_t>(view_.extent(0)); }
  std::int64_t bytes() const { return size() * static_cast<std::int64_t>(sizeof(T)); }
  MemCategory category() const { return category_; }

 private:
  void swap(Buffer& o) noexcept {
    std::swap(view_, o.view_);
    std::swap(tracker_, o.tracker_);
    std::swap(category_, o.category_);
  }
  view_type view_;
  MemoryTracker* tracker_ = nullptr;
  MemCategory category_ = MemCategory::workspace;
};

}  // namespace lamina
