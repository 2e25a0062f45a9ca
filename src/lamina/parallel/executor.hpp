#pragma once
// Runs one stage's program of a Schedule (forward and backward passes of its chunks,
// messages to neighbouring stages, ZeRO gathers, data-parallel reductions) on Kokkos and
// the process grid's communicators. It keeps the activations of every micro-batch in
// flight (as many per chunk as the schedule ever has), and a virtual clock: each forward
// or backward advances it by the cost model's price, every message carries the sender's
// time, and a receive waits for it, so bubbles are measured exactly as the simulator
// predicts them, whatever the wall clock on an oversubscribed machine says.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "lamina/model/gpt.hpp"
#include "lamina/parallel/model_state.hpp"
#include "lamina/parallel/schedule.hpp"
#include "lamina/parallel/simulator.hpp"

namespace lamina {

// Fills the inputs and targets (B*T token ids each, host memory) of a micro-batch of the step.
using MicroBatchLoader = std::function<void(int micro_batch, std::int32_t* inputs, std::int32_t* targets)>;

struct StageResult {
  double loss_sum = 0.0;     // sum of per-position losses over this stage's head micro-batches
  double clock = 0.0;        // virtual time at the end of the stage's program
  double busy = 0.0;         // virtual time spent computing
};

class Executor {
 public:
  using Exec = ModelState::Exec;

  // activations: the policy of every transformer block of the model; bf16: kept
  // activations are stored as bf16.
  Executor(MemoryTracker& tracker, ModelState& state, const ProcessGrid& grid, const Schedule& schedule,
           const Dims& dims, const CostModel& cost, const std::vector<ActivationPolicy>& activations,
           Precision precision = Precision::fp32);
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs the stage's program up to the optimizer step: gradients of the step are
  // complete (reduced and, for the tied embedding, summed over stages) on return.
  // loss_scale: d(objective) / d(loss of one position).
  StageResult run(const MicroBatchLoader& load, float loss_scale);

  const Workspace<Exec>& workspace() const { return ws_.ws; }

 private:
  struct Slots {
    std::vector<std::unique_ptr<LayerRangeActs<Exec>>> acts;
    std::vector<int> free;
  };
  // A message in flight from its own copy of the data, so that no buffer of the model
  // waits for a receiver: waiting there would add dependencies the schedule does not have.
  struct Outgoing {
    float* buffer;
    std::int64_t n;
    Request request;
  };
  float* outgoing_buffer(std::int64_t n);
  LayerRangeActs<Exec>& acquire(int chunk, int mb);
  LayerRangeActs<Exec>& slot(int chunk, int mb);
  void release(int chunk, int mb);
  void forward(const Chunk& c, int mb, const MicroBatchLoader& load);
  void backward(const Chunk& c, int mb, float loss_scale, bool reduce);
  void send(Op op, int chunk, int mb, int peer);
  void recv(Op op, int chunk, int mb, int peer);
  void reduce_layer(int layer, int mb);  // after micro-batch mb's backward
  // Block b's activations for its backward, recomputed or brought back as its policy says.
  BlockActs<Exec> restore(LayerRangeActs<Exec>& a, std::int64_t b);
  // Staging buffer i, now holding block b of range a (null: nothing yet).
  float* staging(int i, LayerRangeActs<Exec>* a, std::int64_t b);
  // Offloaded block b of range a into staging buffer i, on instance `on`.
  void copy_in(const Exec& on, int i, LayerRangeActs<Exec>& a, std::int64_t b);
  int tag(int kind, int receiving_chunk, int mb, int part) const;

  ModelState& state_;
  const ProcessGrid& grid_;
  const Schedule& schedule_;
  Dims dims_;
  CostModel cost_;
  ShardCombine tp_;
  WorkspaceBuffers<Exec> ws_;
  std::map<int, Slots> slots_;                  // per local chunk
  std::map<std::pair<int, int>, int> in_use_;   // (chunk, micro-batch) -> slot
  std::map<int, int> users_, reduced_;          // per layer: local chunks using it, reductions asked
  BufferPool<ModelState::Mem> send_pool_;
  Exec transfer_;                  // instance for activation offload copies
  std::int64_t inner_size_;        // floats of one block's inner activations
  bool bf16_;                      // kept and offloaded inner activations stored as bf16
  Buffer<float, ModelState::Mem> scratch_;     // recomputed block activations, or bf16 ones widened
  Buffer<float, ModelState::Mem> staging_[2];  // offloaded blocks on their way in and out
  Buffer<std::uint16_t, ModelState::Mem> staging16_[2];  // ... as bf16
  std::pair<LayerRangeActs<Exec>*, std::int64_t> staged_[2] = {{nullptr, -1}, {nullptr, -1}};
  std::vector<Outgoing> outgoing_;
  std::vector<std::vector<float>> stamps_;      // send buffers of virtual-clock timestamps
  std::vector<Request> stamp_sends_;
  double clock_ = 0.0, busy_ = 0.0, loss_sum_ = 0.0;
};

}  // namespace lamina
