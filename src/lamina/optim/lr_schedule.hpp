#pragma once
// Learning-rate schedules: constant, or linear warm-up followed by cosine decay to min_lr
// (GPT-3 paper, sec. B; the nanoGPT/Megatron convention).
#include <cstdint>

#include "lamina/core/config.hpp"

namespace lamina {

// Learning rate of optimizer step `step` (0-based) of a run of `total_steps`.
double learning_rate(const OptimizerConfig& opt, std::int64_t step, std::int64_t total_steps);

}  // namespace lamina
