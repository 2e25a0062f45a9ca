#pragma once
// How the ranks of a context-parallel group pass blocks around their ring (ring attention,
// kernels/ring_attention.hpp): each rank sends to the next and receives from the previous. The
// model only calls these; the parallel runtime provides them (over MPI or NCCL). Without
// context parallelism (size 1) they are empty and attention runs on the rank's own rows.
#include <cstdint>
#include <functional>

namespace lamina {

// Tags of the passes in flight together (the backward pass's keys and values, and their
// gradients).
constexpr int kRingKeys = 1, kRingGradients = 2;

struct ContextRing {
  int size = 1, rank = 0;
  // Starts sending n floats (words) of `send` to the next rank and receiving as many from the
  // previous one into `recv`; `tag` tells apart passes in flight together.
  std::function<void(const float* send, float* recv, std::int64_t n, int tag)> pass;
  // Finishes every pass started (bounded: a rank that never sends ends the job with a message).
  std::function<void()> wait;
};

}  // namespace lamina
