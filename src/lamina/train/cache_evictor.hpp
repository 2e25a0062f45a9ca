#pragma once
// A buffer larger than the last-level cache, written over before a timed repetition so that
// the repetition starts from memory the way a training step finds its data: the optimizer
// state was last touched a step ago, a layer's weights and saved activations a layer's
// worth of other data ago. Large last-level caches would otherwise hold a benchmark's
// arrays and flatter its rate.
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cstdint>

#include "lamina/kernels/common.hpp"

namespace lamina {

// Off: does nothing.
template <class E>
class CacheEvictor {
 public:
  explicit CacheEvictor(bool on) {
    if (!on) return;
    std::int64_t bytes = 32 << 20;
#if defined(_SC_LEVEL3_CACHE_SIZE)
    bytes = std::max<std::int64_t>(bytes, 2 * static_cast<std::int64_t>(sysconf(_SC_LEVEL3_CACHE_SIZE)));
#endif
    bytes = std::min<std::int64_t>(bytes, std::int64_t(1) << 30);
    buf_ = Vec<E>("lamina::cache_evictor", static_cast<std::size_t>(bytes / 4));
  }
  void operator()(const E& exec) const {
    if (buf_.extent(0) == 0) return;
    Kokkos::deep_copy(exec, buf_, 1.0f);
    exec.fence();
  }

 private:
  Vec<E> buf_;
};

}  // namespace lamina
