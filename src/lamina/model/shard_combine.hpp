#pragma once
// How the tensor-parallel shards of a layer combine partial results: Megatron's "g"
// (sum over the group in forward) after row-parallel products and its conjugate "f"
// (sum in backward) before column-parallel ones, plus the maximum the vocabulary-parallel
// cross-entropy needs. The model only calls these; the parallel runtime provides them
// (over MPI or NCCL). A single shard leaves them empty and nothing happens. sum16, where a bf16
// run asks for it (parallel.tp_sums), sums the blocks' partial results as bf16 values. Under
// sequence parallelism (Megatron's) each rank holds 1/shards of the residual stream's rows:
// gather joins the ranks' rows before the products that read all of them (its backward,
// scatter_sum, sums their partial results and leaves each rank its own rows). Under context
// parallelism the ring passes keys and values between the ranks that share a sequence.
#include <cstdint>
#include <functional>

#include "lamina/model/context_ring.hpp"

namespace lamina {

struct ShardCombine {
  std::function<void(float* data, std::int64_t n)> sum;  // in place, over the group
  std::function<void(float* data, std::int64_t n)> max;  // in place, over the group
  std::function<void(std::uint16_t* data, std::int64_t n)> sum16;  // bf16 values, in place
  int shards = 1;  // sequence parallelism: the group's size (the stream's rows split so many ways)
  // recv: shards * count floats (words), rank r's count at r * count, of each rank's send
  std::function<void(const float* send, float* recv, std::int64_t count)> gather;
  // send: shards * count floats, summed over the group; this rank's block of count into recv
  std::function<void(const float* send, float* recv, std::int64_t count)> scatter_sum;
  // the same of bf16 values, where a bf16 run sums in bf16 (the blocks' partial results)
  std::function<void(const std::uint16_t* send, std::uint16_t* recv, std::int64_t count)> scatter_sum16;
  ContextRing ring;  // context parallelism (parallel.cp)
};

}  // namespace lamina
