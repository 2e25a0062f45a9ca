#pragma once
// Measuring the machine at hand for the planner (`lamina plan` without --machine, `lamina
// bench machine --write`): every rank measures at once, so rates include the contention of
// the ranks sharing the machine. Compute rates, memory and link bandwidths, AdamW on host
// and device, the communicator's collectives; and the real time of one block, the
// embedding and the head of a model at the micro-batch sizes the planner considers.
#include <mpi.h>

#include <cstdint>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/core/log.hpp"
#include "lamina/plan/cost_model.hpp"
#include "lamina/plan/machine.hpp"

namespace lamina {

// Collective over `comm`: every rank measures; the slowest rank's rates are returned on all.
// Collectives are timed on `backend` as a run would choose it (NCCL where it would).
MachineSpec measure_machine(MPI_Comm comm, const Log& log, CommBackend backend = CommBackend::automatic);

// Forward and backward of one block, the embedding and the head (tensor-parallel degree 1)
// at each micro-batch size, median of `reps` after a warm-up; products as `precision` runs them.
std::vector<MeasuredCosts> profile_model(const ModelConfig& model, Precision precision,
                                         const std::vector<std::int64_t>& micro_batch_sizes, int reps = 3);

// The same at tensor-parallel degree `tp` and context-parallel degree `cp` (tp x cp dividing
// the ranks of `comm`, which all run at once in groups of tp x cp, as a run at those degrees
// does): a rank's shard with its groups' collectives (and sequence parallelism's) and the
// ring's passes, so the times include the communication.
std::vector<MeasuredCosts> profile_sharded(const ModelConfig& model, Precision precision,
                                           const std::vector<std::int64_t>& micro_batch_sizes, int tp,
                                           bool sequence_parallel, int cp, MPI_Comm comm, CommBackend backend,
                                           int reps = 3);

// Sets the machine's kernel efficiencies so that its roofline of one block equals the
// measured time (one factor for GEMMs, attention and element-wise kernels alike).
void calibrate(MachineSpec& machine, const ModelConfig& model, Precision precision, const MeasuredCosts& measured);

}  // namespace lamina
