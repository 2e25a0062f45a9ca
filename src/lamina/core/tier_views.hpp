#pragma once
// Unmanaged 1-D views over raw pointers in the two memory tiers, for code that moves
// slices of flat buffers between them: the device tier (the default execution space's
// memory) and the host tier (page-locked on GPU builds), seen as the host memory the
// host execution space's kernels take.
#include <Kokkos_Core.hpp>
#include <cstdint>

namespace lamina {

using DeviceView = Kokkos::View<float*, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space,
                                Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using HostView = Kokkos::View<float*, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using DeviceView16 = Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, Kokkos::DefaultExecutionSpace::memory_space,
                                  Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using HostView16 =
    Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

inline DeviceView dev(float* p, std::int64_t n) { return DeviceView(p, static_cast<std::size_t>(n)); }
inline HostView host(float* p, std::int64_t n) { return HostView(p, static_cast<std::size_t>(n)); }
inline DeviceView16 dev(std::uint16_t* p, std::int64_t n) { return DeviceView16(p, static_cast<std::size_t>(n)); }
inline HostView16 host(std::uint16_t* p, std::int64_t n) { return HostView16(p, static_cast<std::size_t>(n)); }

// A buffer whose element 0 is layer element `origin`, as views of layer elements [begin, end).
template <class V>
struct Window {
  typename V::value_type* data;
  std::int64_t origin;
  V operator()(std::int64_t begin, std::int64_t end) const {
    return V(data + (begin - origin), static_cast<std::size_t>(end - begin));
  }
};
using DeviceWindow = Window<DeviceView>;
using DeviceWindow16 = Window<DeviceView16>;
using HostWindow = Window<HostView>;

}  // namespace lamina
