#pragma once
// A training step as data (docs/architecture.md, idea 3): for each pipeline stage, the list of
// instructions it runs, one per layer and micro-batch, memory actions included. Builders
// emit GPipe, 1F1B, interleaved 1F1B and modular schedules, depth-first or breadth-first
// over micro-batches (layered gradient accumulation), then place around each layer's
// compute what its plan needs: parameter gathers and prefetches (ZeRO-3, host-tier or
// bf16 parameters), activation offloads, reloads and recomputation, gradient reductions
// and their flushes to the host. update_program() lists one rank's optimizer step per
// subgroup and site. The executor (executor.hpp) interprets these lists; the planner's
// simulator (plan/simulator.hpp) prices the same lists. A schedule never knows about Kokkos.
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "lamina/core/precision.hpp"
#include "lamina/parallel/layout.hpp"
#include "lamina/parallel/partition.hpp"
#include "lamina/parallel/step_buffers.hpp"

namespace lamina {

enum class Op : std::uint8_t {
  // compute: `layer` 0 is the embedding lookup, 1..L the blocks, L+1 the head (final
  // norm, tied LM head and loss)
  forward,
  backward,           // accumulates the layer's gradients (starting its accumulator)
  recompute,          // a block's forward again, from its kept input, before its backward
  // pipeline messages between stages (non-blocking)
  send_activation,    // chunk's output of micro_batch, to stage `peer`
  recv_activation,    // chunk's input of micro_batch, from stage `peer`
  send_gradient,      // gradient of chunk's input, to `peer`
  recv_gradient,      // gradient of chunk's output, from `peer`
  // parameters that are not resident on the device (ZeRO-3 shards, host tier)
  gather_params,      // start making the layer's parameters present, right before its use
  prefetch_params,    // the same, one layer ahead (its use then needs no gather)
  release_params,     // end of a gather's hold
  // inner activations of blocks whose policy is offload
  offload_activations,   // the block's inner activations to the host tier, after its forward
  prefetch_activations,  // back from the host tier ahead of use, into the spare staging buffer
  reload_activations,    // copied back now, for a block whose copy is in no staging buffer
  // checkpoints of blocks whose policy is offload_checkpoint (layered accumulation)
  offload_checkpoint,    // the block's input to the host tier, after its forward
  prefetch_checkpoint,   // back into a device frame, one micro-batch ahead of its recomputation
  // gradients
  reduce_grads,       // start the data-parallel reduction of the layer's gradients
  sync_grads,         // every reduction done; add the tied embedding's two halves (pp > 1, tied)
  flush_grads,        // the layer's reduced gradients leave for the host, where it is updated there
  // optimizer step (update_program)
  optimizer_update,   // AdamW on one subgroup of the owned elements, on the host or the device
                      // (state on the device: also writing the stored parameters, fp32 or bf16)
  publish_params,     // state in host memory: updated values into the stored parameters
  share_params,       // ZeRO-1/2: all-gather every rank's updated shard
};
const char* op_name(Op op);

// Where an instruction runs. Each stream runs its work in order; different streams run side
// by side: kernels (compute), copies into the device and out of it, parameter fetches (ZeRO-3
// all-gathers and copies in from the host tier), gradient reductions (collective), pipeline
// messages (link: one stream per link, see stream_index) and the host's own work (host:
// host-side optimizer updates, bookkeeping).
enum class Stream : std::uint8_t { compute, host_to_device, device_to_host, fetch, collective, link, host };
const char* stream_name(Stream s);

// Which instruction waits for which (docs/architecture.md, "The instruction list"): the
// host issues a program's instructions in order; before it issues one, it waits until
// every instruction in `after` has completed (and with it every earlier instruction of
// that stream: a stream completes its work in order). That is the only place the executor
// waits, and the simulator prices exactly these waits, so what is predicted to overlap is
// what runs side by side. Instructions that hold the host (holds_host) end before the next
// one is issued; the others run beside it on their stream until an instruction that needs
// them names them. What an instruction touches (access) and the pooled buffers it takes and
// gives back (pool) are the hazard checker's (hazards.hpp) to prove ordered.
struct Instruction {
  Op op = Op::forward;
  Stream stream = Stream::compute;
  int chunk = -1;        // compute, messages and activation moves
  int layer = -1;        // parameter-layout layer
  int micro_batch = -1;
  int peer = -1;         // messages: the other stage
  int subgroup = -1;     // optimizer_update: index among the layer's owned subgroups
  UpdateSite site = UpdateSite::device;  // optimizer_update
  bool final = false;    // reduce_grads: the layer's last reduction of the step
  int buffer = -1;       // the staging buffer (0 or 1) an offloaded block's activations pass through
  std::vector<int> after;  // indices of earlier instructions of the same program it waits for
  std::vector<Access> access;    // the buffers it reads and writes
  std::vector<PoolEvent> pool;   // pooled buffers it takes and gives back, in order
};

// Streams of a stage, as indices: the kinds, with one index per link (activations out, in;
// gradients out, in: each direction to a neighbour is a link of its own).
constexpr int kStreams = 10;
int stream_index(const Instruction& i);
const char* stream_index_name(int index);

// Whether the host waits for an instruction to end before it issues the next: the host's own
// work (host-side updates, bookkeeping such as release_params), the blocking collectives
// sync_grads and share_params, and compute where kernels run in the host's thread; not where
// they are queued on a device (compute_queued).
bool holds_host(const Instruction& i, bool compute_queued);
// What pairs a message with its partner: (0 activation / 1 gradient, receiving chunk, micro-batch).
std::tuple<int, int, int> message_key(const Instruction& i);

// What one step runs, as given by a plan.
struct StepSpec {
  std::int64_t layers = 0;  // transformer blocks
  ParallelLayout layout;
  std::vector<LayerPolicy> blocks;  // one per transformer block
  Precision precision = Precision::fp32;
  // The tensor-parallel sums of the blocks' partial results: bf16 (half the bytes, bf16 runs
  // only) rounds them before the sum and widens it after.
  Precision tp_sums = Precision::fp32;
  // The head reads the token embedding (layer 0): the last stage holds it too, and the
  // two pipeline ends add their gradients (sync_grads). Untied, the head has lm_head.
  bool tied_embeddings = true;
};

// A chunk whose block's checkpoint waits in the host tier (offload_checkpoint; layered
// plans have one block per chunk). Such a chunk holds no device memory of its own for a
// micro-batch's residual stream: its input, its output and its gradient take frames from
// one device pool while they are live (frame_events).
bool offloaded_checkpoint(const StepSpec& spec, const Chunk& c);

// Parameters of a layer live whole on the device between uses (in fp32 or bf16, which the
// compute reads as they are): nothing to gather.
bool resident_params(const StepSpec& spec, int layer);

// A layout the builders cannot schedule: the message and the deck key to change.
struct ScheduleProblem {
  std::string key;  // "parallel.pp", "data.micro_batch_size", ...
  std::string message;
};
std::vector<ScheduleProblem> schedule_problems(std::int64_t layers, const ParallelLayout& layout);

// How a layout cuts the model into pipeline chunks and how many micro-batches each chunk
// holds activations for at most, without building the instruction lists (cheap for the
// planner, which asks for thousands of layouts).
struct ScheduleShape {
  Partition partition;
  std::vector<int> in_flight;  // per chunk
};
ScheduleShape schedule_shape(std::int64_t layers, const ParallelLayout& layout);

class Schedule {
 public:
  // Throws InputError for layouts schedule_problems() rejects.
  static Schedule build(const StepSpec& spec);

  const std::string& name() const { return name_; }
  const Partition& partition() const { return partition_; }
  const StepSpec& spec() const { return spec_; }
  int micro_batches() const { return spec_.layout.micro_batches; }
  int stages() const { return static_cast<int>(programs_.size()); }
  // Forward and backward of the step on one stage, ending with gradients complete.
  const std::vector<Instruction>& program(int stage) const { return programs_[static_cast<std::size_t>(stage)]; }
  // Micro-batches of `chunk` whose forward has run but not yet the backward, at most.
  int max_in_flight(int chunk) const;
  // Parameter-layout layers a chunk reads: the embedding (lookup or tied head), its
  // blocks, the final layer (head).
  std::vector<int> layers_of(const Chunk& c) const;
  // The layers a stage holds.
  std::vector<int> layers_of_stage(int stage) const;
  int final_layer() const { return static_cast<int>(spec_.layers) + 1; }
  // One line per instruction group, readable (`-v` prints it).
  std::string describe(int stage) const;
  // The device frames an instruction takes and gives back (see offloaded_checkpoint), as
  // they are in its `pool` events:
  //   input     taken by the chunk's receive or first forward, or by a prefetch_checkpoint;
  //             given back when the offload_checkpoint has completed, or after the block's backward
  //   output    taken by the block's forward; given back once consumed: after the next
  //             chunk's first forward copied it, its send (which copies it out at issue), or
  //             the head's backward
  //   gradient  taken by the receive, the head's backward or the next chunk's first backward
  //             (which writes it); given back after the chunk's first backward, or its send
  std::vector<PoolEvent> frame_events(const Instruction& i) const;

 private:
  std::string name_;
  Partition partition_;
  StepSpec spec_;
  std::vector<std::vector<Instruction>> programs_;
};

// One layer's optimizer step on one rank: its subgroups (of the owned elements) in order,
// each with the site it is updated on.
struct LayerUpdate {
  int layer = 0;
  OptimizerPlacement placement = OptimizerPlacement::device;
  std::vector<UpdateSite> sites;  // one per subgroup; empty: this rank owns none of the layer
};
// Updates layer by layer (device subgroups of a dynamic layer first, so that their copies
// and kernels run while the host updates the rest), each layer's parameters published when
// its update is done (state in host memory; state on the device writes them as it updates),
// then the ZeRO-1/2 all-gathers.
std::vector<Instruction> update_program(const std::vector<LayerUpdate>& layers, int zero);

std::string describe(const std::vector<Instruction>& program, int final_layer);

// Prices of the executor's virtual clock (any unit): one block's forward and backward on
// a micro-batch, the embedding and the head (whose backward counts twice), a pipeline
// message. Pipeline bubbles are measured in this clock.
struct ClockPrices {
  double forward_block = 1.0;
  double backward_block = 2.0;
  double embedding = 0.0;
  double head = 0.0;
  double p2p = 0.0;
};
// Virtual time of a compute instruction (0 for every other).
double clock_price(const Instruction& i, const ClockPrices& prices, int final_layer);

// A pipeline stage's idle time in a step whose stages each hold `blocks` blocks of equal
// cost and messages take no time, in units of one block's forward and backward on one
// micro-batch (its work is blocks x micro_batches of them): the fill and drain of GPipe and
// 1F1B (pp - 1) x blocks, of interleaved schedules that over the virtual stages, of layered
// GPipe (pp - 1) x ((blocks - 1) x M + 1); a modular schedule's (pp - 1), plus, with fewer
// micro-batches than stages, (pp - M) for each of its (blocks - 1) loops back around the
// ring, the first micro-batch's return waited for. The simulator's timelines of these
// schedules have exactly these bubbles (tests).
double fill_and_drain_blocks(const ParallelLayout& layout, double blocks);

}  // namespace lamina
