#pragma once
// Interprets a Schedule's instruction lists (schedule.hpp) on Kokkos and the process
// grid's communicators: run() the stage's forward and backward program, update() one
// rank's optimizer program. Each instruction maps to one action of the rank's state
// (rank_state.hpp) or of the activations it keeps here: one LayerRangeActs per chunk and
// micro-batch in flight (as many as the schedule ever has), a scratch where recomputed and
// bf16-stored blocks run, two staging buffers through which offloaded blocks travel, and a
// pool of frames that the residual stream of chunks with offloaded checkpoints takes and
// gives back. Which slot, frame and staging buffer an instruction uses is the instruction
// list's to say (its pool events and `buffer`): the executor binds them as told.
//
// Each instruction runs on its stream and nowhere else: kernels on the compute instance,
// copies on the rank's copy streams (StageStreams: into the device, out of it, parameter
// fetches), reductions on the data-parallel communicator, gathers on its copy, messages on
// their links. Waiting is the instruction list's business, not the actions': before issuing
// an instruction the executor waits for those its `after` names (each through its own
// completion: an event after a compute instruction, a copy stream's point, a communicator's
// request; never a fence of everything queued), and, since a stream completes its work in
// order, for the earlier instructions of the same stream. It waits nowhere else, so the
// collectives, messages and copies the list lets overlap do, exactly as the simulator prices
// them. Between instructions it polls what is in flight (which is also what moves MPI's
// non-blocking operations on). On a device, compute does not hold the host: kernels are
// queued and the host goes on.
//
// It also keeps a virtual clock: each compute instruction advances it by its price, every
// pipeline message carries the sender's time, and a receive waits for it, so bubbles are
// measured exactly as the simulator predicts them, whatever the wall clock on an
// oversubscribed machine says; and an event log of the last step (events()), from which
// `output.trace_step` writes a trace.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include <deque>

#include "lamina/core/buffer_pool.hpp"
#include "lamina/core/copy_stream.hpp"
#include "lamina/model/gpt.hpp"
#include "lamina/parallel/completion.hpp"
#include "lamina/parallel/rank_state.hpp"
#include "lamina/parallel/schedule.hpp"

namespace lamina {

// Fills the inputs and targets (B*T token ids each, host memory) of a micro-batch of the step.
using MicroBatchLoader = std::function<void(int micro_batch, std::int32_t* inputs, std::int32_t* targets)>;

struct StageResult {
  double loss_sum = 0.0;  // sum of per-position losses over this stage's head micro-batches
  double clock = 0.0;     // virtual time at the end of the stage's program
  double busy = 0.0;      // virtual time spent computing
};

// What happened to one instruction of the last step, in seconds since the step began.
struct InstructionEvent {
  int index = 0;        // in the stage's program
  double reached = 0.0;  // the host got to it (then waited for its `after`)
  double issued = 0.0;   // its waits were over and it was issued
  double returned = 0.0;  // the host went on (for one that occupies the host: it had ended)
  double completed = -1.0;  // running beside the host: first seen done (a poll or a wait)
};

// One pass of context parallelism's ring (ShardCombine::ring) in the last step: started by
// instruction `index`'s attention, its wait called (on a host, the attention computed with
// the pass in flight until then; on a device, queued) and over.
struct RingPass {
  int index = 0;
  int tag = 0;  // kRingKeys: keys and values; kRingGradients: their gradients
  double begun = 0.0, waited = 0.0, done = 0.0;
};

class Executor {
 public:
  using Exec = RankState::Exec;
  using Mem = DeviceMem;

  Executor(MemoryTracker& tracker, RankState& state, const ProcessGrid& grid, const Schedule& schedule,
           const Dims& dims, const ClockPrices& prices);
  // Whether kernels are queued (a device) rather than run in the host's thread.
  static constexpr bool compute_queued = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Runs the stage's program: gradients of the step are complete (reduced and, for the
  // tied embedding, summed over stages) on return. loss_scale: d(objective) / d(loss of
  // one position).
  StageResult run(const MicroBatchLoader& load, float loss_scale);
  // Runs an optimizer program (update_program()) with this step's AdamW scalars.
  void update(const std::vector<Instruction>& program, const AdamWStep& step);

  const Workspace<Exec>& workspace() const { return ws_.ws; }
  // One event per instruction of this stage's program, of the last run().
  const std::vector<InstructionEvent>& events() const { return step_events_; }
  const std::vector<RingPass>& ring_passes() const { return ring_passes_; }

 private:
  struct Slots {
    std::vector<std::unique_ptr<LayerRangeActs<Exec>>> acts;
    std::vector<int> free;
    Buffer<float, DeviceMem> dres;  // shared by the slots where the schedule is depth-first
  };
  // A message in flight from its own copy of the data, so that no buffer of the model
  // waits for a receiver: waiting there would add dependencies the schedule does not have.
  struct Outgoing {
    float* buffer;
    std::int64_t n;
    int index;  // its instruction
  };
  // Runs a program (the step's or the optimizer's) with its waits; returns once every
  // instruction has completed.
  template <class Execute>
  void run_program(const std::vector<Instruction>& program, std::vector<InstructionEvent>& events, Execute&& execute);
  double now() const;
  void wait_for(int index);
  void poll();
  Completion execute(const Instruction& i, const MicroBatchLoader& load, float loss_scale, int index);
  Completion execute_update(const Instruction& i, const AdamWStep& step);
  float* outgoing_buffer(std::int64_t n);
  LayerRangeActs<Exec>& slot(int chunk, int mb);
  // The token embedding as the head reads it: tied, the embedding; untied, none (the
  // head's own lm_head is in the final layer, and this stage need not hold layer 0).
  EmbeddingWeights<Exec> head_embedding() const;
  void take(const PoolEvent& e);
  void give(const PoolEvent& e);
  int first_layer(const Chunk& c) const { return c.embedding ? 0 : static_cast<int>(c.first_block) + 1; }
  ActivationPolicy policy(std::int64_t block) const;
  void forward(const Chunk& c, int layer, int mb, int buffer, const MicroBatchLoader& load, float loss_scale);
  void backward(const Chunk& c, int layer, int mb, int buffer, float loss_scale);
  void recompute(const Chunk& c, int layer, int mb);
  // Block b's activations for its backward, as its policy and the instructions before left
  // them (offloaded ones in staging buffer `buffer`).
  // Where block b's inner activations are for its backward pass.
  InnerActs restored(const LayerRangeActs<Exec>& a, std::int64_t b, int buffer) const;
  InnerActs scratch() const;
  InnerActs staging(int buffer) const;
  Completion copy_activations(const Instruction& i);
  Completion send(Op op, int chunk, int mb, int peer, int index);
  Completion recv(Op op, int chunk, int mb, int peer);
  int tag(int kind, int receiving_chunk, int mb, int part) const;

  RankState& state_;
  const ProcessGrid& grid_;
  const Schedule& schedule_;
  Dims dims_;
  ClockPrices prices_;
  int final_;
  ShardCombine tp_;
  std::vector<RingPass> ring_passes_;  // of the last step
  std::size_t ring_open_ = 0;          // the first pass not waited for
  int current_ = 0;                    // the instruction running
  WorkspaceBuffers<Exec> ws_;
  std::map<int, Slots> slots_;                 // per local chunk
  std::map<std::pair<int, int>, int> in_use_;  // (chunk, micro-batch) -> slot
  BufferPool<Mem> send_pool_;
  Exec messages_;              // where a send copies its message out (the host waits for it at issue)
  std::int64_t inner_size_;    // values of one block's inner activations (fp32 or bf16)
  int split_;                  // pipeline messages travel in this many tensor-parallel shares
  bool bf16_;                  // kept and offloaded inner activations stored as bf16
  Buffer<float, Mem> scratch_;     // recomputed block activations
  Buffer<std::uint16_t, Mem> scratch16_;  // ... as bf16
  Buffer<float, Mem> staging_[2];  // offloaded blocks on their way in and out
  Buffer<std::uint16_t, Mem> staging16_[2];  // ... as bf16
  BufferPool<Mem> frames_;
  std::int64_t stream_words_;  // of an input or output frame; a gradient frame has dims_.rows() * dims_.C floats
  std::map<std::tuple<int, int, Frame>, float*> framed_;  // (chunk, micro-batch, frame) -> its frame
  Kokkos::View<double*, Mem> losses_;  // per micro-batch: the sum of its positions' losses (head stages)
  // Per instruction of the running program: what is in flight, and whether it was waited for.
  const std::vector<Instruction>* program_ = nullptr;
  std::vector<Completion> completions_;
  std::vector<char> waited_;
  std::vector<int> in_flight_;  // instructions whose completion has not been seen yet
  std::vector<std::vector<int>> on_stream_;  // per stream index: its instructions so far, in order
  std::vector<std::size_t> waited_on_;       // per stream index: how many of those were waited for
  std::vector<Outgoing> outgoing_;
  std::deque<double> stamps_;  // virtual-clock timestamps: sent, and received
  std::vector<Request> stamp_sends_;
  std::vector<InstructionEvent>* events_ = nullptr;  // of the running program
  std::vector<InstructionEvent> step_events_, update_events_;
  double start_ = 0.0;
  double clock_ = 0.0, busy_ = 0.0;
};

}  // namespace lamina
