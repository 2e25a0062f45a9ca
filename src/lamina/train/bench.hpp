#pragma once
// `lamina bench`: benchmarks whose last output line is one JSON object.
#include <cstdint>
#include <string>

#include "lamina/core/deck.hpp"
#include "lamina/core/json.hpp"
#include "lamina/core/log.hpp"

namespace lamina {

// Training steps of the deck's model on synthetic tokens: step time, tokens/s, TFLOP/s
// and the fraction of the GEMM rate measured in the same run.
JsonObject bench_step(const Deck& deck, int steps, int warmup, const Log& log);
// Training steps of the deck on synthetic tokens, then the predicted and the measured
// peak bytes per memory space and category (no checkpoint, no sample).
JsonObject bench_memory(Deck deck, int steps, const Log& log);
// The Deep Optimizer States model's inputs on this machine, then the deck's step with its
// optimizer on the device, on the host and dynamic: step time, and the update phase
// predicted by the model against measured.
JsonObject bench_dos(Deck deck, int steps, const Log& log);
// The AdamW kernel over `params` parameters, against a stream triad in the same space.
JsonObject bench_adam(std::int64_t params, int reps, const Log& log);
// GEMM rate and memory bandwidth of the default execution space.
JsonObject bench_machine(const Log& log);

}  // namespace lamina
