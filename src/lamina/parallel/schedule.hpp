#pragma once
// A training step as data (DESIGN.md idea 3): for each pipeline stage, the list of
// instructions it runs. Builders emit GPipe, 1F1B, interleaved 1F1B and modular
// schedules, depth-first or breadth-first over micro-batches (layered gradient
// accumulation), with the ZeRO gathers and data-parallel reductions placed where each
// strategy needs them. The executor runs a schedule on Kokkos and a communicator; the
// simulator runs the same list on a cost model. A schedule never knows about Kokkos.
#include <cstdint>
#include <string>
#include <vector>

#include "lamina/core/deck.hpp"
#include "lamina/parallel/partition.hpp"

namespace lamina {

enum class Op : std::uint8_t {
  forward,          // chunk, micro_batch
  backward,         // chunk, micro_batch
  send_activation,  // chunk's output of micro_batch, to stage `peer`
  recv_activation,  // chunk's input of micro_batch, from stage `peer`
  send_gradient,    // gradient of chunk's input, to `peer`
  recv_gradient,    // gradient of chunk's output, from `peer`
  gather_params,    // ZeRO-3: hold the parameters chunk uses (gathered) until release
  release_params,   // ZeRO-3: end of that hold
  reduce_grads,     // start the data-parallel reduction of chunk's gradients (non-blocking)
  optimizer_step,   // finish reductions, clip, update
};
const char* op_name(Op op);

struct Instruction {
  Op op = Op::forward;
  int chunk = -1;
  int micro_batch = -1;
  int peer = -1;
};

enum class ScheduleKind { gpipe, one_f_one_b, interleaved, modular };

struct ScheduleOptions {
  ScheduleKind kind = ScheduleKind::one_f_one_b;
  int stages = 1;
  int micro_batches = 1;
  int virtual_stages = 1;  // interleaved: chunks per stage
  bool layered = false;    // breadth-first over micro-batches (layered gradient accumulation)
  int zero = 0;            // ZeRO stage, for gathers and reduction points
};

// The schedule options a deck asks for (micro-batches per data-parallel rank and step).
ScheduleOptions schedule_options(const Deck& deck);

class Schedule {
 public:
  // Throws InputError for combinations no builder supports (with what to change).
  static Schedule build(std::int64_t layers, const ScheduleOptions& options);

  const std::string& name() const { return name_; }
  const Partition& partition() const { return partition_; }
  const ScheduleOptions& options() const { return options_; }
  int micro_batches() const { return options_.micro_batches; }
  const std::vector<Instruction>& program(int stage) const { return programs_[static_cast<std::size_t>(stage)]; }
  int stages() const { return static_cast<int>(programs_.size()); }
  // Micro-batches of `chunk` whose forward has run but not yet the backward, at most.
  int max_in_flight(int chunk) const;
  std::string describe(int stage) const;

 private:
  std::string name_;
  Partition partition_;
  ScheduleOptions options_;
  std::vector<std::vector<Instruction>> programs_;
};

}  // namespace lamina
