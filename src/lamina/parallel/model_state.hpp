#pragma once
// The parameters, gradients and AdamW state one rank holds: the layers its pipeline
// stage needs, in its tensor-parallel shapes, sharded over the data-parallel group as the
// ZeRO stage says (Rajbhandari et al. 2020):
//   stage 0  everything replicated; gradients all-reduced in subgroup-sized buckets
//   stage 1  optimizer state sharded; gradients reduce-scattered (into the owned part of
//            the full gradient buffer), parameters all-gathered after the update
//   stage 2  gradients sharded too: full-size gradients exist only until reduce-scattered
//   stage 3  parameters sharded too: gathered before a layer is used, dropped after
// and placed in memory tiers as the deck's [memory] table says, per layer:
//   params = host        the layer's parameters live in host memory and are copied in
//                        for each use (ZeRO-Infinity), like a ZeRO-3 gather
//   optimizer = host     fp32 master weights, m and v in host memory, updated there by the
//                        same AdamW kernel on the host execution space (ZeRO-Offload)
//   optimizer = dynamic  the same state, but every step a performance model sends some
//                        subgroups to the device to be updated there (Deep Optimizer States)
// Under bf16 mixed precision the stored parameters are bf16 (2 bytes), converted to fp32
// per use like a gather (the host has no bf16 GEMM), and AdamW updates separate fp32
// master weights of the owned range (beside m and v), then rounds them into the bf16
// copy. Gradients stay fp32, as Megatron-LM's main_grad: 2 + 4 + 12 bytes per parameter
// before sharding.
// A layer's flat buffer is padded to a multiple of dp; data-parallel rank r owns the
// contiguous shard [r s, (r+1) s). The first and last pipeline stages both hold the
// embedding layer (the LM head is tied to it) and add their gradients before updating.
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lamina/comm/communicator.hpp"
#include "lamina/core/buffer.hpp"
#include "lamina/core/deck.hpp"
#include "lamina/core/kokkos_compat.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/memory/dos_scheduler.hpp"
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
  using HostExec = Kokkos::DefaultHostExecutionSpace;

  // dos: the Deep Optimizer States performance model (used by layers with optimizer =
  // dynamic).
  ModelState(MemoryTracker& tracker, const ModelConfig& model, const OptimizerConfig& opt, const MemoryConfig& memory,
             const ProcessGrid& grid, const Partition& partition, int zero, const DosModel& dos,
             Precision precision = Precision::fp32);
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

  // Parameters of a layer on the device, fp32: always there for device-resident fp32
  // layers below ZeRO-3; otherwise from gather() (all-gathered, copied in from the host
  // tier, converted from bf16) to release(). Both count uses, so nested calls are fine.
  void gather(int layer);
  void release(int layer);
  // Starts gathering a layer ahead of its use (copies from the host tier run on the
  // transfer instance, overlapping the compute); its gather() then finds it ready.
  void prefetch(int layer);
  float* params(int layer) const;
  // Full-size gradient accumulator of a layer; at ZeRO >= 2 it exists from the first
  // backward after a reduction until the next reduction, and begin_grads() makes it.
  void begin_grads(int layer);
  float* grads(int layer) const;
  void zero_grads();

  // Starts the data-parallel reduction of a layer's gradients (non-blocking); final: the
  // step's last for this layer, after which its gradients start their way to the host
  // where the optimizer updates them there.
  void reduce_grads(int layer, bool final = true);
  // Waits for every reduction, adds the tied embedding's two halves (pp > 1), and starts
  // copying the gradients not on their way to the host yet.
  void finish_reductions();
  // Sum of squares of the gradients this rank is the one owner of (each element of the
  // model counted on exactly one rank); the caller sums it over the world.
  double grad_sq_norm_local() const;
  // AdamW on the owned elements (where each layer's optimizer placement says), then the
  // copies and all-gathers that refresh the parameters the compute reads.
  void optimizer_step(double lr, double grad_scale);
  std::int64_t optimizer_t() const { return t_; }
  void set_optimizer_t(std::int64_t t) { t_ = t; }
  // The Deep Optimizer States placement of the last step, per dynamic layer, as plans and
  // as one line each.
  std::vector<DosPlan> dos_plans() const;
  std::vector<std::string> dos_schedule() const;

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

  // Whole-layer copies to and from the host (this rank's tensor-parallel shapes, layer
  // replicated and on the device: ZeRO < 3 for parameters, < 2 for gradients).
  void set_params(int layer, const std::vector<float>& host);
  std::vector<float> params_host(int layer) const;
  std::vector<float> grads_host(int layer) const;

  // Checkpoint I/O, collective over the world: every tensor of the model in global
  // shape; each rank writes (reads) the pieces it is responsible for (holds).
  void write_checkpoint(CheckpointWriter& writer);
  void read_checkpoint(CheckpointReader& reader);

 private:
  using DeviceBuf = Buffer<float, Mem>;
  using HostBuf = Buffer<float, HostTierSpace>;
  using DeviceBuf16 = Buffer<std::uint16_t, Mem>;
  using HostBuf16 = Buffer<std::uint16_t, HostTierSpace>;
  struct Slot {
    std::int64_t numel = 0, padded = 0, shard = 0;  // shard = padded / dp
    ParamPlacement params_at = ParamPlacement::device;
    OptimizerPlacement optimizer_at = OptimizerPlacement::device;
    // Parameters: the whole layer (below ZeRO-3) or the owned shard, on the device or the
    // host, fp32 (params, params_host) or bf16 (params16, params16_host).
    DeviceBuf params;
    HostBuf params_host;
    DeviceBuf16 params16;
    HostBuf16 params16_host;
    // Gradients (device): full below ZeRO-2, else the owned shard plus transient full ones.
    DeviceBuf grads, grad_shard;
    // AdamW over the owned elements: on the device (fp32 master weights: the parameters
    // themselves, or `master` under bf16), or on the host with fp32 master weights (the host
    // parameters themselves when they live there in fp32) and a host copy of the gradients.
    DeviceBuf m, v, master;
    HostBuf master_host, m_host, v_host, grads_host;
    HostBuf16 rounded_host;  // bf16 of host-updated master weights, on their way to the device
    float* gathered = nullptr;  // device parameters while in use (when not resident)
    std::uint16_t* staged16 = nullptr;  // bf16 copied in from the host tier, until gathered
    int gather_count = 0;
    bool prefetched = false;    // gathered ahead; the next gather() takes over the hold
    float* full_grads = nullptr;  // ZeRO >= 2 gradients until reduced
    DosPlan plan;                 // optimizer = dynamic: this step's split
    bool flushed = false;         // this step's gradients are on their way to the host
  };
  struct Pending {
    int layer;
    Request request;
    float* temp = nullptr;  // reduce-scatter output to add into the shard, if any
    float* full = nullptr;  // ZeRO >= 2 full gradients to release
    bool final = false;     // the layer's last reduction of the step
  };
  Slot& slot(int layer) { return slots_.at(layer); }
  const Slot& slot(int layer) const { return slots_.at(layer); }
  std::int64_t owned_begin(const Slot& s) const { return zero_ == 0 ? 0 : grid_.dp_rank() * s.shard; }
  std::int64_t owned_end(const Slot& s) const {
    return zero_ == 0 ? s.numel : std::min(s.numel, owned_begin(s) + s.shard);
  }
  bool resident(const Slot& s) const { return s.params_at == ParamPlacement::device && zero_ < 3 && !bf16_; }
  float* master_host(Slot& s);  // the fp32 master weights of the owned range, on the host
  // The stored parameters of layer elements [begin, end) from updated fp32 values (a no-op
  // where those are the stored parameters themselves).
  void publish_from_device(Slot& s, std::int64_t begin, std::int64_t end, float* values);
  void publish_from_host(Slot& s, std::int64_t begin, std::int64_t end, float* values);
  std::int64_t stored_begin(const Slot& s) const { return zero_ == 3 ? owned_begin(s) : 0; }
  void complete(Pending& p);
  // Starts copying a layer's gradients to the host for its host-updated subgroups
  // (placing them first where the optimizer is dynamic).
  void flush_grads(int layer, Slot& s);
  void fetch(Slot& s, const Exec& copies);
  void fetch_bf16(Slot& s, const Exec& copies);
  void update_on_device(int layer, Slot& s, const struct AdamWStep& step);
  void update_on_host(int layer, Slot& s, const struct AdamWStep& step);
  void update_dynamic(int layer, Slot& s, const struct AdamWStep& step);
  void share_updated_params(Slot& s);
  // The full (tensor-parallel local) contents of a layer's state, host-readable:
  // which 0 params, 1 exp_avg, 2 exp_avg_sq. Collective over the data-parallel group.
  const float* assemble(int layer, int which, std::vector<float>& host);
  void scatter(int layer, int which, const std::vector<float>& full);

  MemoryTracker& tracker_;
  ModelConfig model_;
  OptimizerConfig opt_;
  MemoryConfig memory_;
  const ProcessGrid& grid_;
  int zero_;
  bool bf16_;
  DosModel dos_;
  ParamLayout layout_;
  std::map<int, Slot> slots_;
  BufferPool<Mem> param_pool_, grad_pool_, staging_pool_, dos_pool_;
  BufferPool<Mem, std::uint16_t> staging16_pool_;
  std::vector<Pending> pending_;
  Exec transfer_;
  std::int64_t dos_stage_size_ = 0;  // floats of each Deep Optimizer States staging buffer
  std::int64_t t_ = 0;
};

}  // namespace lamina
