#pragma once
// Context parallelism's split of a sequence (Megatron-Core's load-balanced chunks): its T
// positions cut into 2 cp chunks, rank r of the context-parallel group holding chunks r and
// 2 cp - 1 - r as its rows, so that every rank has the same causal attention work. Without
// context parallelism (cp = 1) a rank's rows are the positions in order. The kernels that
// depend on a row's position (learned and rotary position embeddings, attention's causal
// mask) take it from here.
#include <cstdint>

#include <Kokkos_Core.hpp>

namespace lamina {

// Where a sequence's positions sit on the ranks of a context-parallel group.
struct ContextChunks {
  std::int64_t T = 0;  // positions per sequence
  int cp = 1, rank = 0;

  KOKKOS_INLINE_FUNCTION std::int64_t size() const { return T / (2 * cp); }  // positions per chunk
  KOKKOS_INLINE_FUNCTION std::int64_t rows() const { return T / cp; }        // a sequence's rows on a rank
  // Chunk `half` (0: the rank's first rows, 1: its last) of rank r.
  KOKKOS_INLINE_FUNCTION std::int64_t chunk(int r, int half) const { return half == 0 ? r : 2 * cp - 1 - r; }
  // The position of row t (0 <= t < rows()) of a sequence on this rank.
  KOKKOS_INLINE_FUNCTION std::int64_t position(std::int64_t t) const {
    if (cp == 1) return t;
    const std::int64_t c = size();
    return chunk(rank, t < c ? 0 : 1) * c + t % c;
  }
};

}  // namespace lamina
