#pragma once
// GPT-2 initialisation: N(0, init_std) for matrices and embeddings, N(0, init_std /
// sqrt(2 L)) for the projections that feed the residual stream (GPT-2 paper, sec. 2.3),
// zeros for biases, ones for LayerNorm gains. Values are a function of (seed, tensor
// name, global element index), so every rank of any layout draws exactly its piece.
#include <cstdint>

#include "lamina/model/param_layout.hpp"

namespace lamina {

// Writes elements [begin, end) of layer `layer`'s flat buffer into out[0 .. end-begin).
void initial_values(const ParamLayout& layout, const ModelConfig& model, std::uint64_t seed, int layer,
                    std::int64_t begin, std::int64_t end, float* out);

}  // namespace lamina
