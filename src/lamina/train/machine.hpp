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

// The order of the square GEMM that measures this machine's product rate: `host_n` where the
// default execution space is the host; at least 4096 on a device, where a product of 2048^3
// takes tens of microseconds and the launch, the timer and the clocks' ramp-up cost a
// third of the rate (an H100: 34 TFLOP/s fp32 at 1536^3 beside 48 at 2048^3 measured later).
std::int64_t rate_gemm_order(std::int64_t host_n);
// float GEMM C = A B on n x n matrices as lamina runs its products (`math`: ProductMath), in
// GFLOP/s. On a device the products repeat for at least 0.05 s before and 0.1 s while timed.
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
