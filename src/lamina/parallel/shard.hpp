#pragma once
// How a layer's flat buffer is cut over the data-parallel group (Rajbhandari et al. 2020):
// padded to a multiple of dp, data-parallel rank r owning the contiguous shard
// [r s, (r+1) s) of it. Parameters, gradients, optimizer state and the memory estimate all
// size their buffers from this one description.
#include <algorithm>
#include <cstdint>

namespace lamina {

struct LayerShard {
  std::int64_t numel = 0;   // elements of the layer
  std::int64_t shard = 0;   // elements per data-parallel rank
  std::int64_t padded = 0;  // shard * dp >= numel

  // bf16 shards have an even length: bf16 pairs travel as float words in all-gathers.
  static LayerShard of(std::int64_t numel, int dp, bool bf16) {
    LayerShard s;
    s.numel = numel;
    s.shard = (numel + dp - 1) / dp;
    if (bf16) s.shard += s.shard % 2;
    s.padded = s.shard * dp;
    return s;
  }
  // The elements whose optimizer state a rank owns: all of them below ZeRO-1.
  std::int64_t owned_begin(int dp_rank, int zero) const { return zero == 0 ? 0 : dp_rank * shard; }
  std::int64_t owned_end(int dp_rank, int zero) const {
    return zero == 0 ? numel : std::min(numel, owned_begin(dp_rank, zero) + shard);
  }
  // Elements of the owned buffers (m, v, master weights, host gradients).
  std::int64_t owned_size(int zero) const { return zero == 0 ? padded : shard; }
  // Elements of the stored parameters: the whole layer below ZeRO-3, else the shard.
  std::int64_t stored_size(int zero) const { return zero < 3 ? padded : shard; }
  std::int64_t stored_begin(int dp_rank, int zero) const { return zero == 3 ? dp_rank * shard : 0; }
};

}  // namespace lamina
