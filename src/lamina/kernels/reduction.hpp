#pragma once
// Reductions in a fixed order (bitwise reproducible) that vectorize on the host: a host
// thread keeps independent partial results in SIMD lanes instead of one long dependency
// chain, and a GPU team spreads blocks of eight over its threads.
#include <cstdint>
#include <cstring>
#include <vector>

#include "lamina/kernels/common.hpp"

namespace lamina {

// f(0) op f(1) op ... op f(n - 1) in one thread, from `init` (op's identity, or f(0) for an
// idempotent op): lane k takes f(16 b + k) block after block and the tail's f(16 B + k), then
// the sixteen lanes meet in a fixed tree. A host's vector unit then takes sixteen elements at
// a time with no chain of dependent operations (a tree per block of eight added into one float
// made the sums of exponentials cost three times the exponentials).
template <class T, class F, class Op>
KOKKOS_INLINE_FUNCTION T lane_fold(std::int64_t n, const F& f, T init, const Op& op) {
  constexpr int kLanes = 16;
  T lane[kLanes];
  for (int k = 0; k < kLanes; ++k) lane[k] = init;
  const std::int64_t body = n / kLanes * kLanes;
  for (std::int64_t b = 0; b < body; b += kLanes) {
    for (int k = 0; k < kLanes; ++k) lane[k] = op(lane[k], f(b + k));
  }
  for (std::int64_t j = body; j < n; ++j) lane[j - body] = op(lane[j - body], f(j));
  for (int w = kLanes / 2; w > 0; w /= 2) {
    for (int k = 0; k < w; ++k) lane[k] = op(lane[k], lane[k + w]);
  }
  return lane[0];
}

struct AddFloats {
  KOKKOS_INLINE_FUNCTION float operator()(float a, float b) const { return a + b; }
};

// A float's bits as an integer that orders as the floats do (-0 below +0, the NaNs past the
// infinities on their sign's side), and back. A float maximum in lanes stays scalar: GCC may
// not turn `a < b ? b : a` into a vector maximum without -ffinite-math-only and
// -fno-signed-zeros, whereas an integer maximum is sixteen lanes in one instruction.
KOKKOS_INLINE_FUNCTION std::int32_t ordered_bits(float x) {
  std::int32_t i;
  std::memcpy(&i, &x, sizeof(i));
  return i ^ ((i >> 31) & 0x7fffffff);
}
KOKKOS_INLINE_FUNCTION float from_ordered_bits(std::int32_t i) {
  i ^= (i >> 31) & 0x7fffffff;
  float x;
  std::memcpy(&x, &i, sizeof(x));
  return x;
}

template <class F>
struct OrderedBitsOf {
  const F& f;
  KOKKOS_INLINE_FUNCTION std::int32_t operator()(std::int64_t j) const { return ordered_bits(f(j)); }
};
struct MaxOfInts {
  KOKKOS_INLINE_FUNCTION std::int32_t operator()(std::int32_t a, std::int32_t b) const { return a < b ? b : a; }
};

// Sum of f(j) for j in [0, n) in one thread, in lanes.
template <class F>
KOKKOS_INLINE_FUNCTION float lane_sum(std::int64_t n, const F& f) {
  return lane_fold(n, f, 0.0f, AddFloats{});
}

// Maximum of f(j) for j in [0, n), n >= 1, in one thread, in lanes of ordered bits: the
// largest value whatever the order (of zeros, +0; a positive NaN wins, a negative one loses).
template <class F>
KOKKOS_INLINE_FUNCTION float lane_max(std::int64_t n, const F& f) {
  const OrderedBitsOf<F> bits{f};
  return from_ordered_bits(lane_fold(n, bits, bits(0), MaxOfInts{}));
}

// Sum of f(j) for j in [0, n) over the threads of a team: a team of one (a host's) sums in
// lanes; a larger one (a device's) spreads blocks of eight over its threads, each block
// summed in a tree.
template <class Member, class F>
KOKKOS_INLINE_FUNCTION float team_sum(const Member& team, std::int64_t n, const F& f) {
  if (team.team_size() == 1) return lane_sum(n, f);
  const std::int64_t blocks = n / 8;
  float body = 0.0f, tail = 0.0f;
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, blocks),
      [&](std::int64_t b, float& s) {
        float t[8];
        for (int k = 0; k < 8; ++k) t[k] = f(8 * b + k);
        s += ((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7]));
      },
      body);
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, 8 * blocks, n), [&](std::int64_t j, float& s) { s += f(j); }, tail);
  return body + tail;
}

// Maximum of f(j) for j in [0, n), n >= 1, as team_sum takes its sum.
template <class Member, class F>
KOKKOS_INLINE_FUNCTION float team_max(const Member& team, std::int64_t n, const F& f) {
  if (team.team_size() == 1) return lane_max(n, f);
  const std::int64_t blocks = n / 8;
  float body = f(0), tail = f(0);
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, blocks),
      [&](std::int64_t b, float& m) {
        float t[8];
        for (int k = 0; k < 8; ++k) t[k] = f(8 * b + k);
        const float a = math::max(math::max(t[0], t[1]), math::max(t[2], t[3]));
        const float c = math::max(math::max(t[4], t[5]), math::max(t[6], t[7]));
        m = math::max(m, math::max(a, c));
      },
      Kokkos::Max<float>(body));
  Kokkos::parallel_reduce(
      Kokkos::TeamThreadRange(team, 8 * blocks, n), [&](std::int64_t j, float& m) { m = math::max(m, f(j)); },
      Kokkos::Max<float>(tail));
  return n >= 8 ? math::max(body, n > 8 * blocks ? tail : body) : tail;
}

// A row's reductions and loops over the threads of a team, or (SerialRow) in the calling
// thread in the order a team of one takes: a kernel written once against them runs one team
// per row on a device and inside a host thread's work item alike.
template <class Member>
struct TeamRow {
  const Member& team;
  template <class F>
  KOKKOS_INLINE_FUNCTION float sum(std::int64_t n, const F& f) const {
    return team_sum(team, n, f);
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION float max(std::int64_t n, const F& f) const {
    return team_max(team, n, f);
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each(std::int64_t n, const F& f) const {
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, n), f);
  }
  KOKKOS_INLINE_FUNCTION void barrier() const { team.team_barrier(); }
};

struct SerialRow {
  template <class F>
  KOKKOS_INLINE_FUNCTION float sum(std::int64_t n, const F& f) const {
    return lane_sum(n, f);
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION float max(std::int64_t n, const F& f) const {
    return lane_max(n, f);
  }
  template <class F>
  KOKKOS_INLINE_FUNCTION void for_each(std::int64_t n, const F& f) const {
    for (std::int64_t j = 0; j < n; ++j) f(j);
  }
  KOKKOS_INLINE_FUNCTION void barrier() const {}
};

// Sum of squares of the blocks of eight [8b, 8b + 8) of x.
template <class Exec>
struct SumOfSquaresBlocks {
  ConstVec<Exec> x;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t b, double& s) const {
    float t[8];
    for (int k = 0; k < 8; ++k) t[k] = x(8 * b + k) * x(8 * b + k);
    s += static_cast<double>(((t[0] + t[1]) + (t[2] + t[3])) + ((t[4] + t[5]) + (t[6] + t[7])));
  }
};

template <class Exec>
struct SumOfSquaresTail {
  ConstVec<Exec> x;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t j, double& s) const { s += static_cast<double>(x(j) * x(j)); }
};

// Sum of squares of x over the whole execution space, accumulated in double.
template <class Exec>
double sum_of_squares(const Exec& exec, const ConstVec<Exec>& x) {
  const std::int64_t n = static_cast<std::int64_t>(x.extent(0)), blocks = n / 8;
  double body = 0.0, tail = 0.0;
  Kokkos::parallel_reduce("lamina::sum_of_squares", Range<Exec>(exec, 0, blocks), SumOfSquaresBlocks<Exec>{x}, body);
  Kokkos::parallel_reduce("lamina::sum_of_squares_tail", Range<Exec>(exec, 8 * blocks, n), SumOfSquaresTail<Exec>{x},
                          tail);
  return body + tail;
}

// A piece of memory to reduce: n floats from `data` (memory of the execution space).
struct Span {
  const float* data = nullptr;
  std::int64_t n = 0;
};

// Blocks of eight per work item of a spans reduction: one on a device (neighbouring
// threads read neighbouring blocks), many on a host, where an item's lookup of its span
// would otherwise cost more than its arithmetic.
template <class Exec>
constexpr std::int64_t kSpanItemBlocks =
    Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible ? 256 : 1;

// Sums of squares across several spans, each element squared and added in double: work
// item k lies in the last span whose first item is <= k and sums its blocks of eight into
// eight lanes, so that a host's vector unit widens and adds eight elements at a time with
// no chain of dependent additions (a double sum per block of eight ran at 60 % of the memory
// bandwidth, the lanes at its rate); elements past a span's end count zeros.
template <class Exec>
struct SumOfSquaresSpans {
  Kokkos::View<const Span*, typename Exec::memory_space> spans;
  Kokkos::View<const std::int64_t*, typename Exec::memory_space> first;  // first item of each span, then the total
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t k, double& s) const {
    std::int64_t lo = 0, hi = static_cast<std::int64_t>(spans.extent(0)) - 1;
    while (lo < hi) {
      const std::int64_t mid = (lo + hi + 1) / 2;
      if (first(mid) <= k) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const Span sp = spans(lo);
    const std::int64_t begin = 8 * kSpanItemBlocks<Exec> * (k - first(lo));
    const std::int64_t end = begin + 8 * kSpanItemBlocks<Exec> < sp.n ? begin + 8 * kSpanItemBlocks<Exec> : sp.n;
    double lane[8] = {};
    std::int64_t at = begin;
    for (; at + 8 <= end; at += 8) {
      for (int j = 0; j < 8; ++j) {
        const double x = static_cast<double>(sp.data[at + j]);
        lane[j] += x * x;
      }
    }
    for (int j = 0; at + j < end; ++j) {
      const double x = static_cast<double>(sp.data[at + j]);
      lane[j] += x * x;
    }
    s += ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
  }
};

// Several spans summed in one reduction, so that whoever reads the result waits once, not
// once per span. Built once (the spans' memory stays where it is), run as often as needed.
template <class Exec>
class SpansSumOfSquares {
 public:
  using Mem = typename Exec::memory_space;
  SpansSumOfSquares() = default;
  explicit SpansSumOfSquares(const std::vector<Span>& spans)
      : spans_("lamina::norm_spans", spans.size()), first_("lamina::norm_span_items", spans.size() + 1) {
    const auto s = Kokkos::create_mirror_view(spans_);
    const auto f = Kokkos::create_mirror_view(first_);
    constexpr std::int64_t per_item = 8 * kSpanItemBlocks<Exec>;
    std::int64_t items = 0;
    for (std::size_t i = 0; i < spans.size(); ++i) {
      s(i) = spans[i];
      f(i) = items;
      items += (spans[i].n + per_item - 1) / per_item;
    }
    f(spans.size()) = items_ = items;
    Kokkos::deep_copy(spans_, s);
    Kokkos::deep_copy(first_, f);
  }
  // Waits for the result (its only wait).
  double operator()(const Exec& exec) const {
    double sum = 0.0;
    if (items_ == 0) return sum;
    Kokkos::parallel_reduce("lamina::sum_of_squares_spans", Range<Exec>(exec, 0, items_),
                            SumOfSquaresSpans<Exec>{spans_, first_}, sum);
    return sum;
  }

 private:
  Kokkos::View<Span*, Mem> spans_;
  Kokkos::View<std::int64_t*, Mem> first_;
  std::int64_t items_ = 0;
};

}  // namespace lamina
