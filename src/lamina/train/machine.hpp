#pragma once
// Measured capabilities of this machine in the default execution space: what MFU and
// the benchmarks' efficiency fractions are relative to.
#include <cstdint>

#include "lamina/core/precision.hpp"

namespace lamina {

struct Measurement {
  double best = 0.0;    // best of the repetitions
  double median = 0.0;  // median of the repetitions
};

// float GEMM C = A B on n x n matrices as lamina runs its products (`math`: ProductMath), in GFLOP/s.
Measurement measure_gemm_gflops(std::int64_t n, int reps, ProductMath math);
// STREAM triad a = b + s c on float arrays of n elements, in GB/s (12 bytes per element), in
// the default execution space's memory, or (on_host) in host-tier memory by the host's cores.
Measurement measure_triad_gbytes(std::int64_t n, int reps, bool on_host = false);

// AdamW on n parameters in the default execution space (device) or the default host
// execution space on host-tier memory (host), in parameters per second; cold: each repetition starts with
// the arrays out of the caches (as in a training step), else they may be cached.
Measurement measure_adamw_rate(std::int64_t n, int reps, bool on_host, bool cold = false);
// Copies of n floats from host to device memory (to_device) or back, in bytes per second.
Measurement measure_copy_rate(std::int64_t n, int reps, bool to_device, bool cold = false);

}  // namespace lamina
