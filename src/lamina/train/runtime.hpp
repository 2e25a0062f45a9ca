#pragma once
// Everything one rank needs to train a model by a plan: the process grid, the schedule
// (the instruction lists), the state it holds (parameters, gradients, optimizers) and the
// executor that interprets the lists. The trainer, `lamina verify`, `lamina bench` and
// the tests all drive this object; one rank is just the 1 x 1 x 1 grid.
#include <mpi.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "lamina/core/config.hpp"
#include "lamina/kernels/host_blas.hpp"
#include "lamina/parallel/executor.hpp"
#include "lamina/parallel/process_grid.hpp"
#include "lamina/parallel/rank_state.hpp"
#include "lamina/parallel/schedule.hpp"
#include "lamina/parallel/stage_streams.hpp"
#include "lamina/plan/memory_estimate.hpp"
#include "lamina/plan/optimizer_plan.hpp"
#include "lamina/plan/plan.hpp"

namespace lamina {

// Measures the Deep Optimizer States model's inputs the plan leaves at 0, where its split
// reads them: some layer dynamic with the model's split, on a machine whose device runs
// beside the host (or always, with `force`).
void measure_dos_inputs(Plan& plan, bool force = false);

class Runtime {
 public:
  using Exec = DeviceExec;

  struct StepResult {
    double loss = 0.0;       // mean over the global batch, the same on every rank
    double grad_norm = 0.0;  // global L2 norm, the same on every rank
    double makespan = 0.0;   // virtual time of the step (the slowest stage)
    double bubble = 0.0;     // mean fraction of the makespan the stages wait
  };

  // extras: what the run allocates besides its steps (for the memory the Deep Optimizer
  // States schedule may use under a device budget).
  Runtime(MemoryTracker& tracker, const ModelConfig& model, const OptimizerConfig& optimizer, const Plan& plan,
          const RunExtras& extras, MPI_Comm world, const CommConfig& comm = CommConfig{});

  const Plan& plan() const { return plan_; }
  const ProcessGrid& grid() const { return grid_; }
  const Schedule& schedule() const { return schedule_; }
  const std::vector<Instruction>& update_program() const { return update_program_; }
  RankState& state() { return *state_; }
  const Dims& dims() const { return dims_; }
  int micro_batches() const { return schedule_.micro_batches(); }

  // Forward and backward of one step; `load` fills this rank's micro-batch m. `positions`
  // is the number of token positions of the global batch (the loss is their mean).
  StepResult forward_backward(const MicroBatchLoader& load, std::int64_t positions);
  // AdamW on every owned element (grad_scale: the clipping coefficient), then the
  // parameters the compute reads are refreshed.
  void optimizer_step(double lr, double grad_scale);
  std::int64_t optimizer_t() const { return t_; }
  void set_optimizer_t(std::int64_t t) { t_ = t; }

  // The Deep Optimizer States schedule of this rank's dynamic layers, and one line each.
  const std::map<int, DosPlan>& dos_plans() const { return optimizers_.dos; }
  std::vector<std::string> dos_schedule() const;
  // What the executor did with each instruction of the last forward_backward().
  const std::vector<InstructionEvent>& step_events() const { return executor_->events(); }
  const std::vector<RingPass>& ring_passes() const { return executor_->ring_passes(); }
  // Bytes each group's communicator sent since the last call ("dp", "tp", "pp").
  std::map<std::string, std::int64_t> take_comm_bytes();

 private:
  Plan plan_;
  OptimizerConfig optimizer_config_;
  ProcessGrid grid_;
  Schedule schedule_;
  ParamLayout layout_;
  Dims dims_;
  DevicePools pools_;
  StageStreams streams_;
  RankOptimizers optimizers_;
  std::unique_ptr<RankState> state_;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<HostBlasBesideDnnl> host_blas_;  // bf16 products on a host's oneDNN
  std::vector<Instruction> update_program_;
  std::int64_t t_ = 0;
};

}  // namespace lamina
