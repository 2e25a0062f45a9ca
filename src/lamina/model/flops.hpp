#pragma once
// Model FLOPs of training (forward + backward), as PaLM's MFU counts them (Chowdhery et
// al. 2022, app. B) and as perf/torch_gpt.py does, so that numbers compare:
//   per token: 6 N_mm + 12 L C T,  N_mm = L (C (Q + 2 KV) + Q C + k C F) + V C
// with Q = heads x head width (= C), KV = kv_heads x head width (grouped-query attention's
// smaller K/V) and k = 2 for GELU's two MLP matrices, 3 for SwiGLU's (GPT-2: 12 L C^2 + V C);
// weights used in products, tied LM head included; attention over the full T x T scores;
// recomputation not counted.
#include <cstdint>

#include "lamina/core/config.hpp"

namespace lamina {

inline double training_flops_per_token(const ModelConfig& m) {
  const double L = static_cast<double>(m.layers), C = static_cast<double>(m.d_model);
  const double T = static_cast<double>(m.seq_len), V = static_cast<double>(m.vocab_size);
  const double hd = C / static_cast<double>(m.heads);
  const double Q = hd * static_cast<double>(m.heads), KV = hd * static_cast<double>(m.key_value_heads());
  const double F = static_cast<double>(m.mlp_hidden()), k = m.parts.mlp == MlpKind::swiglu ? 3.0 : 2.0;
  const double n_mm = L * (C * (Q + 2.0 * KV) + Q * C + k * C * F) + V * C;
  return 6.0 * n_mm + 12.0 * L * C * T;
}

}  // namespace lamina
