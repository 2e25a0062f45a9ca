#pragma once
// Everything one rank needs to train a deck's model: the process grid, the schedule, the
// model state it holds, and the executor. The trainer, `lamina verify`, `lamina bench`
// and the tests all drive this object; one rank is just the 1 x 1 x 1 grid.
#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lamina/core/deck.hpp"
#include "lamina/parallel/executor.hpp"
#include "lamina/parallel/model_state.hpp"
#include "lamina/parallel/process_grid.hpp"
#include "lamina/parallel/schedule.hpp"

namespace lamina {

// The Deep Optimizer States model a deck asks for; inputs it leaves at 0 are measured
// when some layer's optimizer is dynamic with the model's split, or when `measure` asks.
DosModel dos_model(const MemoryConfig& memory, bool measure = false);

class Runtime {
 public:
  using Exec = Kokkos::DefaultExecutionSpace;

  struct StepResult {
    double loss = 0.0;       // mean over the global batch, the same on every rank
    double grad_norm = 0.0;  // global L2 norm, the same on every rank
    double makespan = 0.0;   // virtual time of the step (the slowest stage)
    double bubble = 0.0;     // mean fraction of the makespan the stages wait
  };

  Runtime(MemoryTracker& tracker, const Deck& deck, MPI_Comm world);

  const ProcessGrid& grid() const { return grid_; }
  const Schedule& schedule() const { return schedule_; }
  ModelState& state() { return *state_; }
  const Dims& dims() const { return dims_; }
  int micro_batches() const { return schedule_.micro_batches(); }

  // Forward and backward of one step; `load` fills this rank's micro-batch m. `positions`
  // is the number of token positions of the global batch (the loss is their mean).
  StepResult forward_backward(const MicroBatchLoader& load, std::int64_t positions);
  void optimizer_step(double lr, double grad_scale) { state_->optimizer_step(lr, grad_scale); }
  // Bytes each group's communicator sent since the last call ("dp", "tp", "pp").
  std::map<std::string, std::int64_t> take_comm_bytes();

 private:
  ProcessGrid grid_;
  Schedule schedule_;
  Dims dims_;
  std::unique_ptr<ModelState> state_;
  std::unique_ptr<Executor> executor_;
};

}  // namespace lamina
