#include "lamina/train/machine.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <chrono>
#include <unistd.h>
#include <vector>

#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/gemm.hpp"
#include "lamina/train/cache_evictor.hpp"
#include "lamina/optim/adamw.hpp"

namespace lamina {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;

Measurement summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return {v.back(), v[v.size() / 2]};
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

constexpr bool kDevice = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Exec::memory_space>::accessible;

}  // namespace

std::int64_t rate_gemm_order(std::int64_t host_n) { return kDevice ? std::max<std::int64_t>(host_n, 4096) : host_n; }

Measurement measure_gemm_gflops(std::int64_t n, int reps, ProductMath math) {
  Mat<Exec> a("lamina::bench_a", n, n), b("lamina::bench_b", n, n), c("lamina::bench_c", n, n);
  Kokkos::deep_copy(a, 0.5f);
  Kokkos::deep_copy(b, 0.25f);
  // bf16: as a bf16 run's projections read their weights, stored in bf16, with the other
  // operand rounded into a scratch.
  const bool bf16 = math == ProductMath::bf16;
  Kokkos::View<std::uint16_t**, Kokkos::LayoutRight, Exec::memory_space> b16("lamina::bench_b16", bf16 ? n : 0,
                                                                              bf16 ? n : 0);
  Vec<Exec> scratch("lamina::bench_scratch", bf16 ? static_cast<std::size_t>(product_scratch<Exec>(n * n, n)) : 0);
  if (bf16) Kokkos::deep_copy(b16, to_bf16(0.25f));
  const MatRef<Exec> weight = bf16 ? MatRef<Exec>(ConstMat16<Exec>(b16)) : MatRef<Exec>(b);
  const Exec exec;
  // Warm-up: thread pools and page faults; on a device also the clocks.
  const double warm_s = kDevice ? 0.05 : 0.0, timed_s = kDevice ? 0.1 : 0.0;
  const auto w0 = std::chrono::steady_clock::now();
  do {
    gemm(exec, "N", "N", 1.0f, a, weight, 0.0f, c, math, scratch);
    exec.fence();
  } while (seconds_since(w0) < warm_s);
  std::vector<double> rates;
  const auto t_all = std::chrono::steady_clock::now();
  for (int r = 0; r < reps || seconds_since(t_all) < timed_s; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    gemm(exec, "N", "N", 1.0f, a, weight, 0.0f, c, math, scratch);
    exec.fence();
    rates.push_back(2.0 * static_cast<double>(n) * n * n / seconds_since(t0) / 1e9);
  }
  return summarize(rates);
}

namespace {

template <class E, class Space>
Measurement triad(std::int64_t n, int reps) {
  Kokkos::View<float*, Space> a("lamina::triad_a", n), b("lamina::triad_b", n), c("lamina::triad_c", n);
  Kokkos::deep_copy(b, 1.0f);
  Kokkos::deep_copy(c, 2.0f);
  const E exec;
  std::vector<double> rates;
  for (int r = 0; r <= reps; ++r) {
    const auto t0 = std::chrono::steady_clock::now();
    Kokkos::parallel_for(
        "lamina::stream_triad", Kokkos::RangePolicy<E, Kokkos::IndexType<std::int64_t>>(exec, 0, n),
        KOKKOS_LAMBDA(std::int64_t i) { a(i) = b(i) + 3.0f * c(i); });
    exec.fence();
    if (r > 0) rates.push_back(12.0 * static_cast<double>(n) / seconds_since(t0) / 1e9);
  }
  return summarize(rates);
}

}  // namespace

Measurement measure_triad_gbytes(std::int64_t n, int reps, bool on_host) {
  return on_host ? triad<Kokkos::DefaultHostExecutionSpace, HostTierSpace>(n, reps)
                 : triad<Exec, Exec::memory_space>(n, reps);
}

namespace {

// The arrays live in `Space`, where the updated state lives: host updates read the host tier,
// page-locked on GPU builds and placed by the thread that allocates it, not pageable memory
// that the host threads first touch.
template <class E, class Space>
Measurement adamw_rate(std::int64_t n, int reps, bool cold) {
  Kokkos::View<float*, Space> ps("lamina::bench_p", n), gs("lamina::bench_g", n), ms("lamina::bench_m", n),
      vs("lamina::bench_v", n);
  Kokkos::deep_copy(ps, 0.5f);
  Kokkos::deep_copy(gs, 0.01f);
  const Vec<E> p(ps.data(), n), g(gs.data(), n), m(ms.data(), n), v(vs.data(), n);
  const E exec;
  const CacheEvictor<E> evict(cold);
  std::vector<double> rates;
  for (int r = 0; r <= reps; ++r) {
    const AdamWStep s = AdamWStep::make(1e-4, 0.9, 0.95, 1e-8, r + 1, 1.0);
    evict(exec);
    const auto t0 = std::chrono::steady_clock::now();
    adamw_update(exec, p, m, v, ConstVec<E>(g), s, 0.1f);
    exec.fence();
    if (r > 0) rates.push_back(static_cast<double>(n) / seconds_since(t0));
  }
  return summarize(rates);
}

}  // namespace

Measurement measure_adamw_rate(std::int64_t n, int reps, bool on_host, bool cold) {
  return on_host ? adamw_rate<Kokkos::DefaultHostExecutionSpace, HostTierSpace>(n, reps, cold)
                 : adamw_rate<Exec, Exec::memory_space>(n, reps, cold);
}

Measurement measure_copy_rate(std::int64_t n, int reps, bool to_device, bool cold) {
  Kokkos::View<float*, HostTierSpace> h("lamina::bench_host", n);  // as the offloaded state
  Vec<Exec> d("lamina::bench_device", n);
  Kokkos::deep_copy(h, 1.0f);
  const CacheEvictor<Kokkos::DefaultHostExecutionSpace> evict(cold);
  std::vector<double> rates;
  for (int r = 0; r <= reps; ++r) {
    evict(Kokkos::DefaultHostExecutionSpace());
    const auto t0 = std::chrono::steady_clock::now();
    if (to_device) {
      Kokkos::deep_copy(d, h);
    } else {
      Kokkos::deep_copy(h, d);
    }
    Kokkos::fence();
    if (r > 0) rates.push_back(4.0 * static_cast<double>(n) / seconds_since(t0));
  }
  return summarize(rates);
}

}  // namespace lamina
