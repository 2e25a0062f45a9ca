#pragma once
// The parameters, gradients and AdamW state one rank holds: the layers its pipeline
// stage needs, in its tensor-parallel shapes, sharded over the data-parallel group as the
// ZeRO stage says (Rajbhandari et al. 2020):
//   stage 0  everything replicated; gradients all-reduced in subgroup-sized buckets
//   stage 1  optimizer state sharded; gradients reduce-scattered (into the owned part of
//            the full gradient buffer), parameters all-gathered after the update
//   stage 2  gradients sharded too: full-size gradients exist only until reduce-scattered
//   stage 3  parameters sharded too: gathered before a layer is used, dropped after
// A layer's flat buffer is padded to a multiple of dp; data-parallel rank r owns the
// contiguous shard [r s, (r+1) s). The first and last pipeline stages both hold the
// embedding layer (the LM head is tied to it) and add their gradients before updating.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "lamina/comm/communicator.hpp"
#include "lamina/core/buffer.hpp"
#include "lamina/core/deck.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/model/gpt_tensors.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/parallel/buffer_pool.hpp"
#include "lamina/parallel/partition.hpp"
#include "lamina/parallel/process_grid.hpp"

namespace lamina {

class ModelState {
 public:
  using Exec = Kokkos::DefaultExecutionSpace;
  using Mem = Exec::memory_space;

  ModelState(MemoryTracker& tracker, const ModelConfig& model, const OptimizerConfig& opt, const ProcessGrid& grid,
             const Partition& partition, int zero);
  ModelState(const ModelState&) = delete;
  ModelState& operator=(const ModelState&) = delete;

  const ParamLayout& layout() const { return layout_; }
  const ModelConfig& model() const { return model_; }
  int zero() const { return zero_; }
  bool holds(int layer) const { return slots_.count(layer) != 0; }
  // Layers a chunk reads: its blocks, the embedding (embedding or tied head), ln_f (head).
  std::vector<int> layers_of(const Chunk& c) const;

  // GPT-2 initial values (counter-based, identical for every layout).
  void init(std::uint64_t seed);

  // Parameters of a layer: always present below ZeRO-3; at stage 3 from gather() to
  // release(). gather() and release() count uses, so nested calls are fine.
  void gather(int layer);
  void release(int layer);
  float* params(int layer) const;
  // Full-size gradient accumulator of a layer; at ZeRO >= 2 it exists from the first
  // backward after a reduction until the next reduction, and begin_grads() makes it.
  void begin_grads(int layer);
  float* grads(int layer) const;
  void zero_grads();

  // Starts the data-parallel reduction of a layer's gradients (non-blocking).
  void reduce_grads(int layer);
  // Waits for every reduction and adds the tied embedding's two halves (pp > 1).
  void finish_reductions();
  // Sum of squares of the gradients this rank is the one owner of (each element of the
  // model counted on exactly one rank); the caller sums it over the world.
  double grad_sq_norm_local() const;
  // AdamW on the owned elements, then the all-gather that refreshes replicated copies.
  void optimizer_step(double lr, double grad_scale);
  std::int64_t optimizer_t() const { return t_; }
  void set_optimizer_t(std::int64_t t) { t_ = t; }

  EmbeddingTensors<Exec> embedding_params() const { return bind_embedding<Exec>(layout_, params(0)); }
  EmbeddingTensors<Exec> embedding_grads() const { return bind_embedding<Exec>(layout_, grads(0)); }
  BlockTensors<Exec> block_params(std::int64_t b) const {
    return bind_block<Exec>(layout_, b, params(layout_.block_layer(b)));
  }
  BlockTensors<Exec> block_grads(std::int64_t b) const {
    return bind_block<Exec>(layout_, b, grads(layout_.block_layer(b)));
  }
  FinalNormTensors<Exec> final_params() const { return bind_final_norm<Exec>(layout_, params(layout_.final_layer())); }
  FinalNormTensors<Exec> final_grads() const { return bind_final_norm<Exec>(layout_, grads(layout_.final_layer())); }

  // Whole-layer copies to and from the host (this rank's tensor-parallel shapes) for
  // checks against references; parameters need ZeRO < 3, gradients ZeRO < 2.
  void set_params(int layer, const std::vector<float>& host);
  std::vector<float> params_host(int layer) const;
  std::vector<float> grads_host(int layer) const;

  // Checkpoint I/O, collective over the world: every tensor of the model in global
  // shape; each rank writes (reads) the pieces it is responsible for (holds).
  void write_checkpoint(CheckpointWriter& writer);
  void read_checkpoint(CheckpointReader& reader);

 private:
  struct Slot {
    std::int64_t numel = 0, padded = 0, shard = 0;  // shard = padded / dp
    Buffer<float, Mem> params, grads;               // full (below the ZeRO stage that shards them)
    Buffer<float, Mem> param_shard, grad_shard;     // owned shards (ZeRO 3 / ZeRO >= 2)
    Buffer<float, Mem> m, v;                        // AdamW moments: full at ZeRO 0, else the shard
    float* gathered = nullptr;                      // ZeRO-3 parameters while in use
    int gather_count = 0;
    float* full_grads = nullptr;                    // ZeRO >= 2 gradients until reduced
    bool reduced_this_step = false;
  };
  struct Pending {
    int layer;
    Request request;
    float* temp = nullptr;  // reduce-scatter output to add into the shard, if any
    float* full = nullptr;  // ZeRO >= 2 full gradients to release
  };
  Slot& slot(int layer) { return slots_.at(layer); }
  const Slot& slot(int layer) const { return slots_.at(layer); }
  std::int64_t owned_begin(const Slot& s) const { return grid_.dp_rank() * s.shard; }
  void complete(Pending& p);
  // The full (tensor-parallel local) contents of a layer's state in a pool buffer:
  // which 0 params, 1 exp_avg, 2 exp_avg_sq. Collective over the data-parallel group.
  float* assemble(int layer, int which);

  MemoryTracker& tracker_;
  ModelConfig model_;
  OptimizerConfig opt_;
  const ProcessGrid& grid_;
  int zero_;
  ParamLayout layout_;
  std::map<int, Slot> slots_;
  BufferPool<Mem> param_pool_, grad_pool_, staging_pool_;
  std::vector<Pending> pending_;
  std::int64_t t_ = 0;
};

}  // namespace lamina
