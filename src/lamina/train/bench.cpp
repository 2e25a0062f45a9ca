#include "lamina/train/bench.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "lamina/core/format.hpp"
#include "lamina/io/token_dataset.hpp"
#include "lamina/model/flops.hpp"
#include "lamina/optim/adamw.hpp"
#include "lamina/optim/grad_norm.hpp"
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

JsonObject bench_step(const Deck& deck, int steps, int warmup, const Log& log) {
  const ModelConfig& m = deck.model;
  const std::int64_t micro = deck.data.micro_batch_size;
  const std::int64_t positions = deck.data.batch_size * m.seq_len;
  MemoryTracker tracker;
  Runtime rt(tracker, deck, MPI_COMM_WORLD);
  rt.state().init(deck.train.seed);
  const SyntheticTokenDataset data(m.vocab_size, deck.train.seed);
  std::vector<std::int32_t> window(static_cast<std::size_t>(m.seq_len + 1));
  const double flops = training_flops_per_token(m) * static_cast<double>(positions);
  const int world = rt.grid().world_size();
  log.info(strprintf("bench step: %s, %lld parameters, batch %lld x %lld (micro-batch %lld), %.2f GFLOP per step, "
                     "%d rank(s), schedule %s",
                     deck.source.c_str(), static_cast<long long>(ParamLayout::gpt2(m).total_numel()),
                     static_cast<long long>(deck.data.batch_size), static_cast<long long>(m.seq_len),
                     static_cast<long long>(micro), flops / 1e9, world, rt.schedule().name().c_str()));
  std::vector<double> step_ms, fb_ms, opt_ms;
  const Exec exec;
  const std::int64_t per_rank = deck.data.batch_size / deck.parallel.dp;
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
      step_ms.push_back(total);
      fb_ms.push_back(fb);
      opt_ms.push_back(o);
    }
  }
  const Measurement gemm = measure_gemm_gflops(2048, 5);
  const double med = median(step_ms);
  const double tflops = flops / (med / 1e3) / 1e12;
  const double per_rank_gflops = tflops * 1e3 / world;
  log.info(strprintf("step %.1f ms median (min %.1f, max %.1f): forward+backward %.1f, optimizer %.1f", med,
                     *std::min_element(step_ms.begin(), step_ms.end()),
                     *std::max_element(step_ms.begin(), step_ms.end()), median(fb_ms), median(opt_ms)));
  log.info(strprintf("%.0f tokens/s, %.1f GFLOP/s per rank = %.1f%% of the %.1f GFLOP/s float GEMM rate measured now",
                     positions / (med / 1e3), per_rank_gflops, 100.0 * per_rank_gflops / gemm.best, gemm.best));
  JsonObject j;
  j.add("bench", "step")
      .add("deck", deck.source)
      .add("ranks", world)
      .add("params", ParamLayout::gpt2(m).total_numel())
      .add("flops_per_step", flops)
      .add("steps", steps)
      .add("step_ms_median", med)
      .add("forward_backward_ms_median", median(fb_ms))
      .add("optimizer_ms_median", median(opt_ms))
      .add("tokens_per_s", positions / (med / 1e3))
      .add("tflops", tflops)
      .add("gemm_gflops", gemm.best)
      .add("gemm_fraction", per_rank_gflops / gemm.best);
  return j;
}

JsonObject bench_adam(std::int64_t params, int reps, const Log& log) {
  Vec<Exec> p("lamina::bench_p", params), g("lamina::bench_g", params), m("lamina::bench_m", params),
      v("lamina::bench_v", params);
  Kokkos::deep_copy(p, 0.5f);
  Kokkos::deep_copy(g, 0.01f);
  const Exec exec;
  std::vector<double> ms;
  for (int r = 0; r <= reps; ++r) {
    const AdamWStep s = AdamWStep::make(1e-4, 0.9, 0.95, 1e-8, r + 1, 1.0);
    const auto t0 = Clock::now();
    adamw_update(exec, p, m, v, g, s, 0.1f);
    exec.fence();
    if (r > 0) ms.push_back(ms_since(t0));
  }
  const double med = median(ms);
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
  const Measurement gemm = measure_gemm_gflops(2048, 5);
  const Measurement triad = measure_triad_gbytes(1 << 26, 10);
  log.info(strprintf("bench machine (%s): float GEMM 2048^3 %.1f GFLOP/s (median %.1f); stream triad %.1f GB/s "
                     "(median %.1f)",
                     Exec::name(), gemm.best, gemm.median, triad.best, triad.median));
  JsonObject j;
  j.add("bench", "machine")
      .add("execution_space", Exec::name())
      .add("gemm_gflops", gemm.best)
      .add("gemm_gflops_median", gemm.median)
      .add("stream_gbytes_per_s", triad.best)
      .add("stream_gbytes_per_s_median", triad.median);
  return j;
}

}  // namespace lamina
