#include "lamina/train/runtime.hpp"

#include <algorithm>
#include <cmath>

#include "lamina/core/format.hpp"
#include "lamina/kernels/gemm.hpp"
#include "lamina/memory/optimizer_updaters.hpp"
#include "lamina/train/machine.hpp"

namespace lamina {

void measure_dos_inputs(Plan& plan, bool force) {
  const DosModel d = dos_model(plan);
  // Only the model's split reads them (a forced split does not), and only where host and
  // device updates can run at the same time.
  const bool needed = plan.any_optimizer(OptimizerPlacement::dynamic) && plan.dos.split == DosSplit::model && d.concurrent;
  if (!needed && !force) return;
  // Inputs the plan leaves at 0 are measured now, on arrays of 8M parameters out of cache
  // (the optimizer state a step updates was last touched a step ago): the median of 9
  // repetitions after a warm-up, as single runs vary up to 2x on a busy machine.
  constexpr std::int64_t n = 1 << 23;
  constexpr int reps = 9;
  if (plan.dos.host_rate <= 0) plan.dos.host_rate = measure_adamw_rate(n, reps, true, true).median;
  if (plan.dos.device_rate <= 0) plan.dos.device_rate = measure_adamw_rate(n, reps, false, true).median;
  if (plan.dos.h2d <= 0) plan.dos.h2d = measure_copy_rate(n, reps, true, true).median;
  if (plan.dos.d2h <= 0) plan.dos.d2h = measure_copy_rate(n, reps, false, true).median;
}

Runtime::Runtime(MemoryTracker& tracker, const ModelConfig& model, const OptimizerConfig& optimizer, const Plan& plan,
                 const RunExtras& extras, MPI_Comm world, const CommConfig& comm)
    : plan_(plan),
      optimizer_config_(optimizer),
      grid_(world, plan.layout.dp, plan.layout.cp, plan.layout.tp, plan.layout.pp, comm.backend),
      schedule_(Schedule::build(step_spec(plan, model))),
      layout_(ParamLayout::of(model, grid_.tp_size(), grid_.tp_rank())),
      dims_(Dims::of(model, plan.layout.micro_batch_size, grid_.tp_size(), grid_.tp_rank(),
                     plan.layout.sequence_parallel, grid_.cp_size(), grid_.cp_rank())),
      pools_(tracker),
      streams_(comm.threaded_copies ? HostCopies::threads : HostCopies::inline_) {
  dims_.products = product_math<Kokkos::DefaultExecutionSpace>(plan.precision);
  dims_.bf16 = plan.precision == Precision::bf16;
  if (dims_.products == ProductMath::bf16 && Kokkos::SpaceAccessibility<Kokkos::HostSpace, DeviceMem>::accessible) {
    host_blas_ = std::make_unique<HostBlasBesideDnnl>();
  }
  const std::vector<int> held = schedule_.layers_of_stage(grid_.pp_rank());
  const bool dynamic = plan.any_optimizer(OptimizerPlacement::dynamic);
  const std::int64_t free = dynamic ? dos_device_free(model, plan, extras, grid_.pp_rank()) : -1;
  optimizers_ = plan_rank_optimizers(plan, layout_, held, grid_.data_rank(), dos_model(plan), free);
  auto store = std::make_unique<ParameterStore>(tracker, layout_, grid_, held, plan.blocks, plan.layout.zero,
                                                plan.precision, pools_, streams_);
  auto reducer = std::make_unique<GradientReducer>(tracker, layout_, grid_, held, plan.layout.zero, plan.precision,
                                                   plan.subgroup_size, pools_, plan.layout.sequence_parallel);
  std::map<int, std::unique_ptr<LayerOptimizer>> layer_optimizers;
  for (const auto& [l, spec] : optimizers_.layers) {
    layer_optimizers[l] = make_layer_optimizer(tracker, layout_.layers()[static_cast<std::size_t>(l)].name, spec,
                                               optimizer, pools_.dos, optimizers_.dos_stage);
  }
  state_ = std::make_unique<RankState>(model, layout_, grid_, plan.layout.zero, plan.precision, std::move(store),
                                       std::move(reducer), std::move(layer_optimizers), pools_, streams_);
  executor_ = std::make_unique<Executor>(tracker, *state_, grid_, schedule_, dims_, plan.clock);
  update_program_ = lamina::update_program(optimizers_.updates(), plan.layout.zero);
}

Runtime::StepResult Runtime::forward_backward(const MicroBatchLoader& load, std::int64_t positions) {
  const StageResult r = executor_->run(load, static_cast<float>(1.0 / static_cast<double>(positions)));
  // One contribution per loss value: the last stage's first tensor-parallel rank of each replica.
  double v[3] = {grid_.last_stage() && grid_.tp_rank() == 0 ? r.loss_sum : 0.0, state_->reducer().sq_norm_local(),
                 0.0};
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

void Runtime::optimizer_step(double lr, double grad_scale) {
  ++t_;
  const OptimizerConfig& o = optimizer_config_;
  executor_->update(update_program_, AdamWStep::make(lr, o.beta1, o.beta2, o.eps, t_, grad_scale));
}

std::vector<std::string> Runtime::dos_schedule() const {
  std::vector<std::string> out;
  for (const auto& [l, p] : optimizers_.dos) out.push_back(layout_.layers()[static_cast<std::size_t>(l)].name + ": " + p.describe());
  return out;
}

std::map<std::string, std::int64_t> Runtime::take_comm_bytes() {
  std::map<std::string, std::int64_t> out;
  for (Communicator* c : {&grid_.data(), &grid_.tp(), &grid_.pp()}) {
    out[c->name()] = c->bytes_sent();
    c->reset_bytes();
  }
  out["dp"] += grid_.data_fetch().bytes_sent();  // parameter gathers travel on a copy of the dp group
  grid_.data_fetch().reset_bytes();
  if (grid_.cp_size() > 1) {  // the ring's keys and values (and their gradients)
    out["cp"] = grid_.cp().bytes_sent();
    grid_.cp().reset_bytes();
  }
  // The tied embedding's gradient exchange between the first and last stage, and messages
  // on links of their own, count as pipeline traffic.
  for (Communicator* c : grid_.own_links()) {
    out["pp"] += c->bytes_sent();
    c->reset_bytes();
  }
  out["pp"] += grid_.embedding().bytes_sent();
  grid_.embedding().reset_bytes();
  return out;
}

}  // namespace lamina
