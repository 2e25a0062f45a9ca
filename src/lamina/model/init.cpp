#include "lamina/model/init.hpp"

#include <algorithm>
#include <cmath>

#include "lamina/core/random.hpp"

namespace lamina {

void initial_values(const ParamLayout& layout, const ModelConfig& model, std::uint64_t seed, int layer,
                    std::int64_t begin, std::int64_t end, float* out) {
  for (const TensorSpec& t : layout.layers()[layer].tensors) {
    const std::int64_t lo = std::max(begin, t.offset), hi = std::min(end, t.offset + t.numel());
    if (lo >= hi) continue;
    const std::uint64_t key = hash_combine(seed, hash_string(t.name));
    double std_dev = model.init_std;
    if (t.init == InitKind::scaled_normal) std_dev /= std::sqrt(2.0 * static_cast<double>(model.layers));
    for (std::int64_t e = lo; e < hi; ++e) {
      float v = 0.0f;
      switch (t.init) {
        case InitKind::normal:
        case InitKind::scaled_normal:
          v = static_cast<float>(std_dev * normal01(key, static_cast<std::uint64_t>(t.global_index(e - t.offset))));
          break;
        case InitKind::zeros: v = 0.0f; break;
        case InitKind::ones: v = 1.0f; break;
      }
      out[e - begin] = v;
    }
  }
}

}  // namespace lamina
