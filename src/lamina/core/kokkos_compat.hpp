#pragma once
// Spellings that differ between Kokkos 3.4 (Debian) and Kokkos 4.x/5.x (spack).
// See docs/kokkos-portability.md; everything version-dependent lives here.
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstring>

#ifndef KOKKOS_VERSION_GREATER_EQUAL
#define KOKKOS_VERSION_GREATER_EQUAL(M, m, p) (KOKKOS_VERSION >= ((M)*10000 + (m)*100 + (p)))
#endif

namespace lamina {

// The host memory tier (offloaded activations, parameters and optimizer state): page-locked
// where a GPU copies to and from it, so that those copies run asynchronously on a transfer
// instance at the link's bandwidth (pageable memory makes them synchronous and staged);
// plain host memory where the compute runs on the host. Kokkos 4 names it for every
// backend; Kokkos 3 only per backend.
#if defined(KOKKOS_HAS_SHARED_HOST_PINNED_SPACE)
using HostTierSpace = Kokkos::SharedHostPinnedSpace;
#elif defined(KOKKOS_ENABLE_CUDA)
using HostTierSpace = Kokkos::CudaHostPinnedSpace;
#else
using HostTierSpace = Kokkos::HostSpace;
#endif

// Zeroes v on exec. Kokkos 4 memsets a contiguous view's zeros; Kokkos 3.4's deep_copy of a
// scalar fills with a loop, 2.5 times slower on a host (13.9M floats: 2.5 ms against 1.0,
// measured), so there a host's contiguous view is memset here.
template <class Exec, class View>
void zero_fill(const Exec& exec, const View& v) {
#if KOKKOS_VERSION < 40000
  if constexpr (Kokkos::SpaceAccessibility<Exec, Kokkos::HostSpace>::accessible) {
    if (v.span_is_contiguous()) {
      exec.fence();  // what writes v before, on this instance
      std::memset(static_cast<void*>(v.data()), 0, v.span() * sizeof(typename View::value_type));
      return;
    }
  }
#endif
  Kokkos::deep_copy(exec, v, typename View::non_const_value_type{});
}

}  // namespace lamina

namespace lamina::math {

// Math functions moved from Kokkos::Experimental to Kokkos in 3.7.
#if KOKKOS_VERSION >= 30700
using Kokkos::exp;
using Kokkos::fabs;
using Kokkos::isfinite;
using Kokkos::log;
using Kokkos::pow;
using Kokkos::sqrt;
using Kokkos::tanh;
#else
using Kokkos::Experimental::exp;
using Kokkos::Experimental::fabs;
using Kokkos::Experimental::isfinite;
using Kokkos::Experimental::log;
using Kokkos::Experimental::pow;
using Kokkos::Experimental::sqrt;
using Kokkos::Experimental::tanh;
#endif

// A fused multiply-add, rounded once (IEEE 754): the same bits on every machine. Kokkos
// has it from 3.7; on Kokkos 3.4 (host back-ends only) the C library's.
#if KOKKOS_VERSION >= 30700
using Kokkos::fma;
#else
KOKKOS_FORCEINLINE_FUNCTION float fma(float a, float b, float c) { return ::fmaf(a, b, c); }
#endif

// Kokkos 3.4 has no Kokkos::min/max.
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T max(T a, T b) {
  return a < b ? b : a;
}
template <class T>
KOKKOS_FORCEINLINE_FUNCTION T min(T a, T b) {
  return b < a ? b : a;
}

}  // namespace lamina::math
