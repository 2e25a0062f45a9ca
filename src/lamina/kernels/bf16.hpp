#pragma once
// bfloat16 storage: the upper 16 bits of an IEEE float (8 exponent bits, 7 mantissa
// bits), kept as std::uint16_t so that it works with every Kokkos version and back-end
// (Kokkos 3.4 has no bhalf_t; a host-only Kokkos 4 build makes it a 4-byte float). Values
// are computed in float and rounded to nearest-even when stored.
#include <cstdint>
#include <cstring>

#include "lamina/kernels/common.hpp"

namespace lamina {

KOKKOS_FORCEINLINE_FUNCTION std::uint16_t to_bf16(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  const std::uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;  // to nearest, ties to even
  const std::uint32_t nan = (u >> 16) | 0x40u;                           // NaN stays NaN
  // A select, not a branch, so that loops storing bf16 vectorize.
  return static_cast<std::uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? nan : rounded);
}

KOKKOS_FORCEINLINE_FUNCTION float from_bf16(std::uint16_t b) {
  const std::uint32_t u = static_cast<std::uint32_t>(b) << 16;
  float x;
  std::memcpy(&x, &u, sizeof(x));
  return x;
}

// A stored value as float, whichever format it is stored in (for kernels templated on it).
KOKKOS_FORCEINLINE_FUNCTION float widen(float x) { return x; }
KOKKOS_FORCEINLINE_FUNCTION float widen(std::uint16_t b) { return from_bf16(b); }
// A computed value into its storage: as it is, or rounded to bf16.
KOKKOS_FORCEINLINE_FUNCTION void put(float& dst, float x) { dst = x; }
KOKKOS_FORCEINLINE_FUNCTION void put(std::uint16_t& dst, float x) { dst = to_bf16(x); }

template <class Exec>
using Bf16Vec = Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, typename Exec::memory_space>;

template <class Exec>
struct ToBf16 {
  Bf16Vec<Exec> dst;
  ConstVec<Exec> src;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst(i) = to_bf16(src(i)); }
};

template <class Exec>
struct FromBf16 {
  Vec<Exec> dst;
  Bf16Vec<Exec> src;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst(i) = from_bf16(src(i)); }
};

template <class Exec>
struct RoundToBf16 {
  Vec<Exec> x;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { x(i) = from_bf16(to_bf16(x(i))); }
};

// dst = bf16(src); dst, src: (n)
template <class Exec>
void to_bf16(const Exec& exec, const Bf16Vec<Exec>& dst, const ConstVec<Exec>& src) {
  Kokkos::parallel_for("lamina::to_bf16", Range<Exec>(exec, 0, static_cast<std::int64_t>(dst.extent(0))),
                       ToBf16<Exec>{dst, src});
}

// dst = float(src)
template <class Exec>
void from_bf16(const Exec& exec, const Vec<Exec>& dst, const Bf16Vec<Exec>& src) {
  Kokkos::parallel_for("lamina::from_bf16", Range<Exec>(exec, 0, static_cast<std::int64_t>(dst.extent(0))),
                       FromBf16<Exec>{dst, src});
}

// x = float(bf16(x)): what storing as bf16 and reading back gives, in place.
template <class Exec>
void round_to_bf16(const Exec& exec, const Vec<Exec>& x) {
  Kokkos::parallel_for("lamina::round_to_bf16", Range<Exec>(exec, 0, static_cast<std::int64_t>(x.extent(0))),
                       RoundToBf16<Exec>{x});
}

}  // namespace lamina
