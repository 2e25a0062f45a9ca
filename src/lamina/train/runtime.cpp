#include "lamina/train/runtime.hpp"

#include <cmath>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/train/machine.hpp"

#include <algorithm>

namespace lamina {

namespace {

CostModel cost_model(const ParallelConfig& p) {
  CostModel c;
  c.forward_block = p.cost_forward;
  c.backward_block = p.cost_backward;
  c.p2p = p.cost_p2p;
  return c;
}

}  // namespace

DosModel dos_model(const MemoryConfig& m, bool measure) {
  DosModel d;
  d.host_rate = m.dos_host_rate;
  d.device_rate = m.dos_device_rate;
  d.h2d = m.dos_h2d;
  d.d2h = m.dos_d2h;
  d.concurrent = !Kokkos::SpaceAccessibility<Kokkos::HostSpace, Kokkos::DefaultExecutionSpace::memory_space>::accessible;
  // Only the model's split reads them (a forced split does not), and only where host and
  // device updates can run at the same time.
  const bool dynamic = std::any_of(m.optimizer.begin(), m.optimizer.end(),
                                   [](OptimizerPlacement p) { return p == OptimizerPlacement::dynamic; });
  if (!(dynamic && m.dos_split == DosSplit::model && d.concurrent) && !measure) return d;
  // Inputs the deck leaves at 0 are measured now, on arrays of 8M parameters out of cache
  // (the optimizer state a step updates was last touched a step ago).
  constexpr std::int64_t n = 1 << 23;
  if (d.host_rate <= 0) d.host_rate = measure_adamw_rate(n, 5, true, true).median;
  if (d.device_rate <= 0) d.device_rate = measure_adamw_rate(n, 5, false, true).median;
  if (d.h2d <= 0) d.h2d = measure_copy_rate(n, 5, true, true).median;
  if (d.d2h <= 0) d.d2h = measure_copy_rate(n, 5, false, true).median;
  return d;
}

Runtime::Runtime(MemoryTracker& tracker, const Deck& deck, MPI_Comm world)
    : grid_(world, static_cast<int>(deck.parallel.dp), static_cast<int>(deck.parallel.tp),
            static_cast<int>(deck.parallel.pp)),
      schedule_(Schedule::build(deck.model.layers, schedule_options(deck))),
      dims_(Dims::of(deck.model, deck.data.micro_batch_size, grid_.tp_size(), grid_.tp_rank())) {
  state_ = std::make_unique<ModelState>(tracker, deck.model, deck.optimizer, deck.memory, grid_, schedule_.partition(),
                                        static_cast<int>(deck.parallel.zero), dos_model(deck.memory),
                                        deck.train.precision);
  CostModel cost = cost_model(deck.parallel);
  for (const Chunk& c : schedule_.partition().chunks()) {
    for (std::int64_t b = c.first_block; b < c.last_block; ++b) {
      if (deck.memory.activations[static_cast<std::size_t>(b)] == ActivationPolicy::recompute) ++cost.recomputed[c.index];
    }
  }
  executor_ = std::make_unique<Executor>(tracker, *state_, grid_, schedule_, dims_, cost, deck.memory.activations,
                                         deck.train.precision);
}

Runtime::StepResult Runtime::forward_backward(const MicroBatchLoader& load, std::int64_t positions) {
  const StageResult r = executor_->run(load, static_cast<float>(1.0 / static_cast<double>(positions)));
  // One contribution per loss value: the last stage's first tensor-parallel rank of each replica.
  double v[3] = {grid_.last_stage() && grid_.tp_rank() == 0 ? r.loss_sum : 0.0, state_->grad_sq_norm_local(), 0.0};
  grid_.world().allreduce(v, 2, ReduceOp::sum);
  double makespan = r.clock;
  grid_.world().allreduce(&makespan, 1, ReduceOp::max);
  double idle = makespan > 0.0 ? (makespan - r.busy) / makespan : 0.0;
  grid_.world().allreduce(&idle, 1, ReduceOp::sum);
  StepResult out;
  out.loss = v[0] / static_cast<double>(positions);
  out.grad_norm = std::sqrt(v[1]);
  out.makespan = makespan;
  out.bubble = idle / grid_.world_size();
  return out;
}

std::map<std::string, std::int64_t> Runtime::take_comm_bytes() {
  std::map<std::string, std::int64_t> out;
  for (Communicator* c : {&grid_.dp(), &grid_.tp(), &grid_.pp()}) {
    out[c->name()] = c->bytes_sent();
    c->reset_bytes();
  }
  // The tied embedding's gradient exchange between the first and last stage counts as
  // pipeline traffic.
  out["pp"] += grid_.embedding().bytes_sent();
  grid_.embedding().reset_bytes();
  return out;
}

}  // namespace lamina
