#pragma once
// Runs a schedule's instruction lists (parallel/schedule.hpp) on a cost model instead of
// hardware: the same lists the executor interprets, with the same waits, each instruction
// on the stream the executor runs it on. Each pipeline stage has a host thread that issues
// instructions in program order and one clock per stream (stream_index: compute, copies
// into and out of the device, parameter fetches, reductions, the host's cores, each
// message link). Before it issues an instruction the host waits for the end of every
// instruction in its `after` list, exactly where the executor waits; the instruction then
// starts when its stream is free and ends its price later. Instructions that hold the host
// (holds_host: compute where kernels run in the host's thread, not on a device that queues
// them; blocking collectives; the host's own work) end before the next is issued; the rest
// run beside it. A send occupies its link for its price and its message arrives then; a
// receive ends when its message has arrived. With `serial` (a host-only machine) every
// stream shares one timeline: copies and collectives take the compute's cores and overlap
// nothing.
// With the default prices (only compute costs time) this is the executor's virtual clock,
// and bubble fractions equal the closed forms of the papers.
// simulate_update() does the same for one rank's optimizer program: device subgroups
// queue on the device while the host updates the others (Deep Optimizer States).
#include <functional>
#include <map>
#include <vector>

#include "lamina/parallel/schedule.hpp"
#include "lamina/parallel/shard.hpp"

namespace lamina {

// Seconds (or virtual units) an instruction takes on stage `stage`.
using Pricer = std::function<double(const Instruction& i, int stage)>;

// The executor's virtual clock: compute instructions at the ClockPrices, messages at p2p.
Pricer clock_pricer(const ClockPrices& prices, int final_layer);

struct Timeline {
  std::vector<double> busy;    // compute time per stage
  std::vector<double> finish;  // when each stage's last instruction ends
  // Busy time per stream kind (summed over stages), for reports.
  std::map<Stream, double> stream_busy;
  double makespan = 0.0;
  // Mean over stages of the time a stage waits: (makespan - busy) / makespan.
  double bubble_fraction() const;
};

// serial: every stream runs on the compute's cores (a host-only machine, where copies and
// collectives take the same cores as the kernels). compute_queued: kernels are queued on a
// device and the host goes on. Throws std::logic_error when a receive has no matching send
// or the stages deadlock.
Timeline simulate(const Schedule& schedule, const Pricer& price, bool serial = false, bool compute_queued = false);

struct UpdateTimeline {
  double seconds = 0.0;  // the update program's length
  double host = 0.0;     // host busy time (host-site subgroups)
  double device = 0.0;   // device busy time (device subgroups, their copies)
};
// flushed: when each host-updated layer's gradients have arrived on the host, relative to
// the start of the update (0: already there).
UpdateTimeline simulate_update(const std::vector<Instruction>& program, const Pricer& price,
                               const std::map<int, double>& flushed = {}, bool serial = false,
                               bool compute_queued = false);

// Memory: what one rank allocates for part of a step comes from pools that keep every
// buffer they allocate and hand out a free one of the same size first (core/buffer_pool.hpp),
// so their peak is, per size, the most buffers held at once. simulate_memory() replays a
// stage's program, the rank's update program and a checkpoint's gathers against the rules
// by which the parameter store, the gradient reducer and the optimizers take buffers
// (parallel/param_store.cpp, grad_reducer.cpp, memory/optimizer_updaters.cpp), in program
// order, as the host issues them; what an asynchronous instruction holds until it is done
// goes back where the first instruction that waits for it is issued.
struct MemoryModel {
  struct Layer {
    LayerShard shard;
    bool resident = true;  // the whole layer on the device: nothing gathered
    MemTier tier = MemTier::device;
    bool dynamic = false;  // optimizer: Deep Optimizer States
  };
  std::map<int, Layer> layers;  // the layers the stage holds
  int zero = 0;
  bool bf16 = false;
  std::int64_t dos_stage = 0;  // elements of each Deep Optimizer States staging buffer
  // floats of a residual-stream frame and of a gradient frame (Schedule::frame_events)
  std::int64_t stream_frame = 0, gradient_frame = 0;
  bool checkpoint = false;     // the run writes checkpoints (they gather sharded state)
};
// Peak bytes of each device pool: gathered parameters, full-size gradients, communication
// staging (fp32 and bf16), Deep Optimizer States staging, the frames of offloaded checkpoints.
struct PoolPeaks {
  std::int64_t params = 0, grads = 0, communication = 0, dos = 0, frames = 0;
};
PoolPeaks simulate_memory(const Schedule& schedule, int stage, const std::vector<Instruction>& update,
                          const MemoryModel& model);

}  // namespace lamina
