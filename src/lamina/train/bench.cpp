#include "lamina/train/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "lamina/comm/mpi_communicator.hpp"
#include "lamina/core/device_memory_peak.hpp"
#include "lamina/core/format.hpp"
#include "lamina/io/token_dataset.hpp"
#include "lamina/kernels/gemm.hpp"
#include "lamina/model/flops.hpp"
#include "lamina/optim/adamw.hpp"
#include "lamina/optim/grad_norm.hpp"
#include "lamina/memory/dos_scheduler.hpp"
#include "lamina/train/runtime.hpp"
#include "lamina/train/machine.hpp"

namespace lamina {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

namespace {

struct StepTimes {
  std::vector<double> step_ms, fb_ms, opt_ms;
};

int world_size() {
  int world = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  return world;
}

// Steps [0, warmup + steps) of the deck on synthetic tokens; times of the last `steps`.
StepTimes run_synthetic(Runtime& rt, const Deck& deck, int steps, int warmup) {
  const ModelConfig& m = deck.model;
  const std::int64_t micro = rt.plan().layout.micro_batch_size;
  const std::int64_t positions = deck.data.batch_size * m.seq_len;
  const SyntheticTokenDataset data(m.vocab_size, deck.train.seed);
  std::vector<std::int32_t> window(static_cast<std::size_t>(m.seq_len + 1));
  const std::int64_t per_rank = deck.data.batch_size / rt.plan().layout.dp;
  const Exec exec;
  StepTimes t;
  for (int s = 0; s < warmup + steps; ++s) {
    const std::int64_t first = s * deck.data.batch_size + rt.grid().dp_rank() * per_rank;
    const MicroBatchLoader load = [&](int mb, std::int32_t* inputs, std::int32_t* targets) {
      for (std::int64_t i = 0; i < micro; ++i) {
        data.read((first + mb * micro + i) * (m.seq_len + 1), m.seq_len + 1, window.data());
        std::copy(window.begin(), window.end() - 1, inputs + i * m.seq_len);
        std::copy(window.begin() + 1, window.end(), targets + i * m.seq_len);
      }
    };
    rt.grid().world().barrier();
    const auto t0 = Clock::now();
    const Runtime::StepResult r = rt.forward_backward(load, positions);
    const double fb = ms_since(t0);
    const auto to = Clock::now();
    rt.optimizer_step(deck.optimizer.lr, clip_coefficient(r.grad_norm, deck.optimizer.grad_clip));
    exec.fence();
    const double o = ms_since(to);
    rt.grid().world().barrier();
    const double total = ms_since(t0);
    if (s >= warmup) {
      t.step_ms.push_back(total);
      t.fb_ms.push_back(fb);
      t.opt_ms.push_back(o);
    }
  }
  return t;
}

}  // namespace

JsonObject bench_step(const Deck& deck, int steps, int warmup, const Log& log) {
  const ModelConfig& m = deck.model;
  const std::int64_t positions = deck.data.batch_size * m.seq_len;
  MemoryTracker tracker;
  Plan plan = plan_from_deck(deck, world_size());
  measure_dos_inputs(plan);
  Runtime rt(tracker, m, deck.optimizer, plan, RunExtras{}, MPI_COMM_WORLD, deck.comm);
  rt.state().init(deck.train.seed);
  const double flops = training_flops_per_token(m) * static_cast<double>(positions);
  const int world = rt.grid().world_size();
  log.info(strprintf("bench step: %s, %lld parameters, batch %lld x %lld (micro-batch %lld), %.2f GFLOP per step, "
                     "%d rank(s), schedule %s",
                     deck.source.c_str(), static_cast<long long>(ParamLayout::of(m).total_numel()),
                     static_cast<long long>(deck.data.batch_size), static_cast<long long>(m.seq_len),
                     static_cast<long long>(plan.layout.micro_batch_size), flops / 1e9, world,
                     rt.schedule().name().c_str()));
  const StepTimes t = run_synthetic(rt, deck, steps, warmup);
  const ProductMath math = product_math<Exec>(plan.precision);
  const Measurement gemm = measure_gemm_gflops(rate_gemm_order(2048), 5, math);
  const double med = median(t.step_ms);
  const double tflops = flops / (med / 1e3) / 1e12;
  const double per_rank_gflops = tflops * 1e3 / world;
  log.info(strprintf("step %.1f ms median (min %.1f, max %.1f): forward+backward %.1f, optimizer %.1f", med,
                     *std::min_element(t.step_ms.begin(), t.step_ms.end()),
                     *std::max_element(t.step_ms.begin(), t.step_ms.end()), median(t.fb_ms), median(t.opt_ms)));
  log.info(strprintf("%.0f tokens/s, %.1f GFLOP/s per rank = %.1f%% of the %.1f GFLOP/s %s GEMM rate measured now",
                     positions / (med / 1e3), per_rank_gflops, 100.0 * per_rank_gflops / gemm.best, gemm.best,
                     product_math_name(math)));
  JsonObject j;
  j.add("bench", "step")
      .add("deck", deck.source)
      .add("ranks", world)
      .add("params", ParamLayout::of(m).total_numel())
      .add("flops_per_step", flops)
      .add("steps", steps)
      .add("step_ms_median", med)
      .add("forward_backward_ms_median", median(t.fb_ms))
      .add("optimizer_ms_median", median(t.opt_ms))
      .add("tokens_per_s", positions / (med / 1e3))
      .add("tflops", tflops)
      .add("gemm_gflops", gemm.best)
      .add("gemm_fraction", per_rank_gflops / gemm.best)
      .add("products", product_math_name(math));
  return j;
}

namespace {

// One step of the job, its buffers freed after it, so that what the runtime keeps beyond
// them exists before the device's own overhead is read: the context, the vendor libraries'
// handles and workspaces, the kernels loaded on first use and Kokkos' team scratch (on an
// H100 these grew the device's use by 55-90 MiB during the first step).
void warm_up_step(const Deck& deck, const Plan& plan, const RunExtras& extras) {
  MemoryTracker scratch;
  Runtime rt(scratch, deck.model, deck.optimizer, plan, extras, MPI_COMM_WORLD, deck.comm);
  rt.state().init(deck.train.seed);
  run_synthetic(rt, deck, 1, 0);
  Kokkos::fence();
}

}  // namespace

JsonObject bench_memory(Deck deck, int steps, const Log& log) {
  deck.data.format = DataFormat::synthetic;
  deck.checkpoint.every = 0;
  deck.checkpoint.save_final = false;
  deck.output.sample_tokens = 0;
  MemoryTracker tracker;
  std::map<std::string, std::map<std::string, std::int64_t>> measured;
  int stage = 0;
  Plan plan = plan_from_deck(deck, world_size());
  measure_dos_inputs(plan);
  const RunExtras extras = RunExtras::of(deck.checkpoint, deck.output);
  // On a GPU, what the device reports in use too: its own overhead (context, vendor handles
  // and workspaces, loaded kernels) read after a warm-up step, then the high-water mark
  // over the run.
  const std::string device_space = Exec::memory_space::name();
  const bool device = device_memory_in_use() > 0;
  std::int64_t runtime_bytes = 0, device_peak = 0, untracked_after = 0;
  if (device) {
    warm_up_step(deck, plan, extras);
    runtime_bytes = device_memory_in_use();
  }
  {
    DeviceMemoryPeak sampler;
    Runtime rt(tracker, deck.model, deck.optimizer, plan, extras, MPI_COMM_WORLD, deck.comm);
    stage = rt.grid().pp_rank();
    rt.state().init(deck.train.seed);
    run_synthetic(rt, deck, steps, 0);
    Kokkos::fence();
    measured = tracker.peak_by_category();
    device_peak = sampler.stop();
    untracked_after = device_memory_in_use() - tracker.current(device_space);
  }
  const MemoryEstimate predicted = estimate_memory(deck.model, plan, extras, stage);
  const auto peaks = tracker.peak_by_space();
  JsonObject pred, meas, pred_cat, meas_cat;
  double worst = 0.0;
  std::set<std::string> spaces;
  for (const auto& kv : predicted.bytes) spaces.insert(kv.first);
  for (const auto& kv : peaks) spaces.insert(kv.first);
  for (const auto& space : spaces) {
    const std::int64_t p = predicted.total(space);
    const auto it = peaks.find(space);
    const std::int64_t q = it == peaks.end() ? 0 : it->second;
    const double err = q > 0 ? std::fabs(static_cast<double>(p - q)) / static_cast<double>(q) : (p > 0 ? 1.0 : 0.0);
    worst = std::max(worst, err);
    pred.add(space, p);
    meas.add(space, q);
    log.info(strprintf("%s: predicted %s, measured %s (%+.2f%%)", space.c_str(), human_bytes(static_cast<double>(p)).c_str(),
                       human_bytes(static_cast<double>(q)).c_str(), q > 0 ? 100.0 * (p - q) / q : 0.0));
    std::set<std::string> cats;
    if (predicted.bytes.count(space))
      for (const auto& kv : predicted.bytes.at(space)) cats.insert(kv.first);
    if (measured.count(space))
      for (const auto& kv : measured.at(space)) cats.insert(kv.first);
    std::map<std::string, std::int64_t> pc, mc;
    for (const auto& c : cats) {
      const std::int64_t a = predicted.bytes.count(space) && predicted.bytes.at(space).count(c) ? predicted.bytes.at(space).at(c) : 0;
      const std::int64_t b = measured.count(space) && measured.at(space).count(c) ? measured.at(space).at(c) : 0;
      pc[c] = a;
      mc[c] = b;
      log.info(strprintf("  %-16s predicted %12s, measured %12s", c.c_str(), human_bytes(static_cast<double>(a)).c_str(),
                         human_bytes(static_cast<double>(b)).c_str()));
    }
    pred_cat.add(space, pc);
    meas_cat.add(space, mc);
  }
  double world_worst = worst;
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, &world_worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD, &r);
  wait_bounded(r, "MPI_Iallreduce of the worst error");
  JsonObject j;
  j.add("bench", "memory")
      .add("deck", deck.source)
      .add("stage", stage)
      .add("predicted_bytes", pred)
      .add("measured_bytes", meas)
      .add("predicted_by_category", pred_cat)
      .add("measured_by_category", meas_cat)
      .add("max_relative_error", world_worst);
  if (device) {
    // The device's view: the estimate plus the overhead read after the warm-up step, against the
    // high-water mark the device reported. What the device held beyond lamina's buffers
    // after the run, less that overhead, is what the runtime added during the run, which
    // the estimate does not yet cover.
    const std::int64_t p = predicted.total(device_space) + runtime_bytes;
    const double err = static_cast<double>(p - device_peak) / static_cast<double>(device_peak);
    log.info(strprintf("%s as the device reports it: predicted %s (runtime %s before the run), peak %s (%+.2f%%); "
                       "beyond lamina's buffers after the run: %s",
                       device_space.c_str(), human_bytes(static_cast<double>(p)).c_str(),
                       human_bytes(static_cast<double>(runtime_bytes)).c_str(),
                       human_bytes(static_cast<double>(device_peak)).c_str(), 100.0 * err,
                       human_bytes(static_cast<double>(untracked_after)).c_str()));
    j.add("device_runtime_bytes", runtime_bytes)
        .add("device_predicted_bytes", p)
        .add("device_reported_peak_bytes", device_peak)
        .add("device_untracked_after_bytes", untracked_after)
        .add("device_relative_error", err);
  }
  return j;
}

JsonObject bench_dos(Deck deck, int steps, const Log& log) {
  deck.data.format = DataFormat::synthetic;
  Plan plan = plan_from_deck(deck, world_size());
  measure_dos_inputs(plan, true);
  const DosModel model = dos_model(plan);
  log.info(strprintf("bench dos: host AdamW %.3g params/s (%s), device AdamW %.3g params/s (%s), host->device %.3g B/s, "
                     "device->host %.3g B/s; stride k* = %d%s",
                     model.host_rate, Kokkos::DefaultHostExecutionSpace::name(), model.device_rate, Exec::name(),
                     model.h2d, model.d2h, dos_stride(model),
                     model.concurrent ? "" : " (host and device are the same cores here: nothing overlaps)"));
  JsonObject j;
  j.add("bench", "dos")
      .add("deck", deck.source)
      .add("host_update_params_per_s", model.host_rate)
      .add("device_update_params_per_s", model.device_rate)
      .add("h2d_bytes_per_s", model.h2d)
      .add("d2h_bytes_per_s", model.d2h)
      .add("stride", dos_stride(model));
  const std::int64_t params = ParamLayout::of(deck.model).total_numel();
  const std::pair<const char*, OptimizerPlacement> modes[] = {
      {"device", OptimizerPlacement::device}, {"host", OptimizerPlacement::host}, {"dynamic", OptimizerPlacement::dynamic}};
  for (const auto& [name, placement] : modes) {
    Plan p = plan;
    for (LayerPolicy& b : p.blocks) b.optimizer = placement;
    MemoryTracker tracker;
    Runtime rt(tracker, deck.model, deck.optimizer, p, RunExtras{}, MPI_COMM_WORLD, deck.comm);
    rt.state().init(deck.train.seed);
    const StepTimes t = run_synthetic(rt, deck, steps, 1);
    // The model's update phase: device, host (plus the copy of the parameters back), or the split.
    double predicted = 0.0;
    if (placement == OptimizerPlacement::device) {
      predicted = static_cast<double>(params) / model.device_rate;
    } else if (placement == OptimizerPlacement::host) {
      predicted = static_cast<double>(params) / model.host_rate + 4.0 * static_cast<double>(params) / model.h2d;
    } else {
      for (const auto& line : rt.dos_schedule()) log.debug("dos " + line);
      // The plans the step ran, layer by layer (a layer's update completes before the next).
      for (const auto& [l, plan_l] : rt.dos_plans())
        predicted += plan_l.predicted_seconds + 4.0 * static_cast<double>(plan_l.host_params) / model.h2d;
    }
    const double measured = median(t.opt_ms) / 1e3;
    log.info(strprintf("optimizer %-7s: step %.1f ms, update phase %.2f ms measured, %.2f ms predicted", name,
                       median(t.step_ms), measured * 1e3, predicted * 1e3));
    j.add(std::string("step_ms_") + name, median(t.step_ms));
    j.add(std::string("update_ms_") + name, measured * 1e3);
    j.add(std::string("update_ms_") + name + "_predicted", predicted * 1e3);
  }
  return j;
}

JsonObject bench_adam(std::int64_t params, int reps, const Log& log) {
  const double med = 1e3 * static_cast<double>(params) / measure_adamw_rate(params, reps, false).median;
  const double gbs = 28.0 * static_cast<double>(params) / (med / 1e3) / 1e9;
  // The triad gets the same footprint as AdamW's four arrays (its three arrays of 4N/3),
  // so that both run from the same level of the memory hierarchy.
  const Measurement triad = measure_triad_gbytes(4 * params / 3, reps);
  log.info(strprintf("bench adam: %lld parameters, %.3f ms median = %.3f ms per million, %.1f GB/s (28 B/param) = "
                     "%.1f%% of the %.1f GB/s stream triad measured now (%s)",
                     static_cast<long long>(params), med, med / (params / 1e6), gbs, 100.0 * gbs / triad.best,
                     triad.best, Exec::name()));
  JsonObject j;
  j.add("bench", "adam")
      .add("execution_space", Exec::name())
      .add("params", params)
      .add("ms_median", med)
      .add("ms_per_million_params", med / (params / 1e6))
      .add("gbytes_per_s", gbs)
      .add("stream_gbytes_per_s", triad.best)
      .add("bandwidth_fraction", gbs / triad.best);
  return j;
}

JsonObject bench_machine(const Log& log) {
  const std::int64_t n = rate_gemm_order(2048);
  const Measurement gemm = measure_gemm_gflops(n, 5, ProductMath::fp32);
  const Measurement triad = measure_triad_gbytes(1 << 26, 10);
  log.info(strprintf("bench machine (%s): float GEMM %lld^3 %.1f GFLOP/s (median %.1f); stream triad %.1f GB/s "
                     "(median %.1f)",
                     Exec::name(), static_cast<long long>(n), gemm.best, gemm.median, triad.best, triad.median));
  JsonObject j;
  j.add("bench", "machine")
      .add("execution_space", Exec::name())
      .add("gemm_gflops", gemm.best)
      .add("gemm_gflops_median", gemm.median)
      .add("stream_gbytes_per_s", triad.best)
      .add("stream_gbytes_per_s_median", triad.median);
  if (product_math<Exec>(Precision::bf16) == ProductMath::bf16) {
    const Measurement bf16 = measure_gemm_gflops(n, 5, ProductMath::bf16);
    log.info(strprintf("bf16 products (fp32 sums) %lld^3 %.1f GFLOP/s (median %.1f)", static_cast<long long>(n),
                       bf16.best, bf16.median));
    j.add("gemm_bf16_gflops", bf16.best).add("gemm_bf16_gflops_median", bf16.median);
  }
  return j;
}

}  // namespace lamina
