#include "lamina/model/init.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <cmath>

#include "lamina/core/random.hpp"

namespace lamina {

void initial_values(const ParamLayout& layout, const ModelConfig& model, std::uint64_t seed, int layer,
                    std::int64_t begin, std::int64_t end, float* out) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  for (const TensorSpec& t : layout.layers()[layer].tensors) {
    const std::int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel());
    if (lo >= hi) continue;
    float* dst = out + (lo - begin);
    switch (t.init) {
      case InitKind::normal:
      case InitKind::scaled_normal: {
        const std::uint64_t key = hash_combine(seed, hash_string(t.name));
        double std_dev = model.init_std;
        if (t.init == InitKind::scaled_normal) std_dev /= std::sqrt(2.0 * static_cast<double>(model.layers));
        // A value per element from its global index alone, so the host's threads share the
        // work (a log and a cosine each: 12 s of one core for 323M parameters).
        Kokkos::parallel_for(
            "lamina::initial_values", Kokkos::RangePolicy<Host, Kokkos::IndexType<std::int64_t>>(0, hi - lo),
            [&](std::int64_t i) {
              const auto g = static_cast<std::uint64_t>(t.global_index(lo + i - t.offset));
              dst[i] = static_cast<float>(std_dev * normal01(key, g));
            });
        Host().fence();
        break;
      }
      case InitKind::zeros: std::fill(dst, dst + (hi - lo), 0.0f); break;
      case InitKind::ones: std::fill(dst, dst + (hi - lo), 1.0f); break;
    }
  }
}

}  // namespace lamina
