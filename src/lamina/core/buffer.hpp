#pragma once
// A tracked, owning 1-D allocation in one Kokkos memory space. Shaped views (matrices,
// named parameter tensors) are unmanaged views into it, so one contiguous buffer can
// back many tensors (docs/architecture.md, idea 2) and every byte is accounted for.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/memory_tier.hpp"
#include "lamina/core/memory_tracker.hpp"

namespace lamina {

// The name memory in a tier is reported under (see memory_tracker.hpp).
inline std::string tier_label(MemTier tier) {
  using Device = Kokkos::DefaultExecutionSpace::memory_space;
  if (tier == MemTier::device) return Device::name();
  const std::string host = Kokkos::HostSpace::name();
  return std::is_same<Device, Kokkos::HostSpace>::value ? host + " (host tier)" : host;
}

// The tier a memory space means when the caller does not say.
template <class Mem>
constexpr MemTier default_tier() {
  return std::is_same<Mem, Kokkos::DefaultExecutionSpace::memory_space>::value ? MemTier::device : MemTier::host;
}

template <class T, class Mem>
class Buffer {
 public:
  using view_type = Kokkos::View<T*, Kokkos::LayoutRight, Mem>;

  Buffer() = default;
  // Zero-initialised: touching every page once here keeps page faults out of the steps.
  Buffer(MemoryTracker& tracker, MemCategory category, const std::string& label, std::int64_t n,
         MemTier tier = default_tier<Mem>())
      : view_(allocate(label, n, category, tier)), tracker_(&tracker), category_(category), space_(tier_label(tier)) {
    tracker_->allocate(space_, category_, bytes());
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
    if (tracker_ != nullptr) tracker_->release(space_, category_, bytes());
  }

  const view_type& view() const { return view_; }
  T* data() const { return view_.data(); }
  std::int64_t size() const { return static_cast<std::int64_t>(view_.extent(0)); }
  std::int64_t bytes() const { return size() * static_cast<std::int64_t>(sizeof(T)); }
  MemCategory category() const { return category_; }

 private:
  // An allocation that fails mid-run is the run's failure (exit 3), named by what and where.
  static view_type allocate(const std::string& label, std::int64_t n, MemCategory category, MemTier tier) {
    try {
      return view_type(label, static_cast<std::size_t>(n));
    } catch (const std::exception& e) {
      const std::string why = e.what();
      throw RunError("out of memory: allocating " + human_bytes(static_cast<double>(n) * sizeof(T)) + " of " +
                     mem_category_name(category) + " ('" + label + "') in " + tier_label(tier) + " memory failed (" +
                     why.substr(0, why.find('\n')) + "); the memory estimate at start-up lists what helps");
    }
  }

  void swap(Buffer& o) noexcept {
    std::swap(view_, o.view_);
    std::swap(tracker_, o.tracker_);
    std::swap(category_, o.category_);
    std::swap(space_, o.space_);
  }
  view_type view_;
  MemoryTracker* tracker_ = nullptr;
  MemCategory category_ = MemCategory::workspace;
  std::string space_;
};

}  // namespace lamina
