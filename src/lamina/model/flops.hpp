#pragma once
// Model FLOPs of training (forward + backward), as PaLM's MFU counts them (Chowdhery et
// al. 2022, app. B) and as perf/torch_gpt.py does, so that numbers compare:
//   per token: 6 N_mm + 12 L C T,  N_mm = 12 L C^2 + V C
// (weights used in products, tied LM head included; attention over the full T x T
// scores; recomputation not counted).
#include <cstdint>

#include "lamina/core/config.hpp"

namespace lamina {

inline double training_flops_per_token(const ModelConfig& m) {
  const double L = static_cast<double>(m.layers), C = static_cast<double>(m.d_model);
  const double T = static_cast<double>(m.seq_len), V = static_cast<double>(m.vocab_size);
  const double n_mm = 12.0 * L * C * C + V * C;
  return 6.0 * n_mm + 12.0 * L * C * T;
}

}  // namespace lamina
