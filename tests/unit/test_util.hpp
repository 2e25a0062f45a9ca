#pragma once
// Helpers shared by the unit tests: random data, host <-> device copies, error norms,
// and the list of execution spaces every kernel test is instantiated for.
#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <random>
#include <type_traits>
#include <vector>

#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/common.hpp"

namespace lamina::test {

// Every enabled execution space, each once: the default one, the default host one, and
// Serial when it is enabled beside another host backend.
namespace detail {
template <class List, class T>
struct Append;
template <class... Ts, class T>
struct Append<::testing::Types<Ts...>, T> {
  static constexpr bool present = (std::is_same<Ts, T>::value || ...);
  using type = std::conditional_t<present, ::testing::Types<Ts...>, ::testing::Types<Ts..., T>>;
};
using WithHost = typename Append<::testing::Types<Kokkos::DefaultExecutionSpace>,
                                 Kokkos::DefaultHostExecutionSpace>::type;
#if defined(KOKKOS_ENABLE_SERIAL)
using All = typename Append<WithHost, Kokkos::Serial>::type;
#else
using All = WithHost;
#endif
}  // namespace detail
using ExecSpaces = detail::All;

inline std::vector<double> random_vector(std::size_t n, std::uint32_t seed, double lo = -1.0, double hi = 1.0) {
  std::mt19937 gen(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<double> v(n);
  for (auto& x : v) x = static_cast<float>(d(gen));  // representable in float exactly
  return v;
}

template <class Exec>
Kokkos::View<float*, Kokkos::LayoutRight, typename Exec::memory_space> to_device(const std::vector<double>& v,
                                                                                 const char* label = "test") {
  Kokkos::View<float*, Kokkos::LayoutRight, typename Exec::memory_space> d(std::string(label), v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = static_cast<float>(v[i]);
  Kokkos::deep_copy(d, h);
  return d;
}

template <class View>
std::vector<double> to_host(const View& d) {
  Kokkos::fence();
  auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
  std::vector<double> v(h.size());
  const auto* p = h.data();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(p[i]);
  return v;
}

// The values bf16 storage holds for v (rounded to nearest-even).
inline std::vector<double> bf16_values(std::vector<double> v) {
  for (auto& e : v) e = from_bf16(to_bf16(static_cast<float>(e)));
  return v;
}

// v stored as bf16 on Exec, and bf16 storage read back as doubles.
template <class Exec>
Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, typename Exec::memory_space> to_device_bf16(
    const std::vector<double>& v) {
  Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, typename Exec::memory_space> d("test_bf16", v.size());
  auto h = Kokkos::create_mirror_view(d);
  for (std::size_t i = 0; i < v.size(); ++i) h(i) = to_bf16(static_cast<float>(v[i]));
  Kokkos::deep_copy(d, h);
  return d;
}
template <class View>
std::vector<double> widened_to_host(const View& d) {
  std::vector<double> v = to_host(d);
  for (auto& e : v) e = from_bf16(static_cast<std::uint16_t>(e));
  return v;
}

// GPT-2's GELU (the tanh form) in double precision.
inline double gelu_reference(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

// ||a - b|| / ||b||
inline double rel_error(const std::vector<double>& a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    num += (a[i] - b[i]) * (a[i] - b[i]);
    den += b[i] * b[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (std::size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// Central finite difference of f at x along coordinate i.
template <class F>
double finite_difference(F&& f, std::vector<double> x, std::size_t i, double h) {
  const double x0 = x[i];
  x[i] = x0 + h;
  const double fp = f(x);
  x[i] = x0 - h;
  const double fm = f(x);
  return (fp - fm) / (2 * h);
}

}  // namespace lamina::test
