#include "lamina/train/profile.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>

#include "lamina/comm/mpi_communicator.hpp"
#include "lamina/core/format.hpp"
#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/gemm.hpp"
#include "lamina/model/gpt.hpp"
#include "lamina/model/init.hpp"
#include "lamina/parallel/process_grid.hpp"
#include "lamina/train/cache_evictor.hpp"
#include "lamina/train/machine.hpp"

namespace lamina {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// A ring collective's time t(S) = S / bandwidth + latency, from two sizes.
void measure_allreduce(Communicator& c, double& bandwidth, double& latency) {
  if (c.size() == 1) return;
  auto time = [&](std::int64_t n) {
    Vec<Exec> buf("lamina::bench_allreduce", static_cast<std::size_t>(n));
    std::vector<double> t;
    for (int r = 0; r < 6; ++r) {
      c.barrier();
      const auto t0 = Clock::now();
      c.allreduce(buf.data(), n, ReduceOp::sum);
      Exec().fence();
      if (r > 0) t.push_back(seconds_since(t0));
    }
    return median(t);
  };
  const std::int64_t small = 256, large = 1 << 22;
  const double ts = time(small), tl = time(large);
  const double p = c.size(), per_rank = [&](std::int64_t n) { return 2.0 * (p - 1) / p * 4.0 * n; }(large) -
                                         2.0 * (p - 1) / p * 4.0 * small;
  bandwidth = per_rank / std::max(tl - ts, 1e-9);
  latency = std::max(ts, 0.0) / (2.0 * (p - 1));
}

double physical_memory() {
  const long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && size > 0 ? static_cast<double>(pages) * static_cast<double>(size) : 0.0;
}

}  // namespace

MachineSpec measure_machine(MPI_Comm comm, const Log& log, CommBackend backend) {
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  MachineSpec m;
  m.name = strprintf("this machine (%s, %d rank(s))", Exec::name(), ranks);
  m.source = "measured";
  m.devices_per_node = ranks;
  m.device_is_host = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Exec::memory_space>::accessible;
  if (m.device_is_host) m.cores_per_device = Exec().concurrency();
  m.peak_flops_fp32 = measure_gemm_gflops(rate_gemm_order(2048), 5, ProductMath::fp32).best * 1e9;
  // bf16 runs' products on the bf16 engine (cuBLAS, oneDNN on a CPU with bf16
  // instructions); none (0): they stay fp32 products
  const ProductMath bf16 = product_math<Exec>(Precision::bf16);
  m.peak_flops_bf16 = bf16 == ProductMath::fp32 ? 0.0 : measure_gemm_gflops(rate_gemm_order(2048), 5, bf16).best * 1e9;
  m.memory_bandwidth = measure_triad_gbytes(1 << 24, 5).best * 1e9;
  constexpr std::int64_t n = 1 << 22;
  m.host_adamw_rate = measure_adamw_rate(n, 5, true, true).median * ranks;  // per node: every rank's share
  m.device_adamw_rate = measure_adamw_rate(n, 5, false, true).median;
  m.h2d = measure_copy_rate(n, 5, true, true).median;
  m.d2h = measure_copy_rate(n, 5, false, true).median;
  m.host_memory = physical_memory();
  // The host's memory, measured by its cores (on a GPU node not the device's): every rank
  // measures at once, so each sees its share of the node's bandwidth.
  const double host_share = m.device_is_host ? m.memory_bandwidth : measure_triad_gbytes(1 << 24, 5, true).best * 1e9;
  m.device_memory = m.device_is_host ? m.host_memory / ranks : 0.0;
#if defined(KOKKOS_ENABLE_CUDA)
  if (!m.device_is_host) m.device_memory = static_cast<double>(Kokkos::Cuda().cuda_device_prop().totalGlobalMem);
#endif
  // The all-reduce of the backend a run uses (NCCL where it would): the ranks as one
  // data-parallel group.
  const ProcessGrid grid(comm, ranks, 1, 1, 1, backend);
  measure_allreduce(grid.data(), m.intra_bandwidth, m.intra_latency);
  if (ranks == 1) m.intra_bandwidth = m.memory_bandwidth;
  m.inter_bandwidth = m.intra_bandwidth;  // one node
  m.inter_latency = m.intra_latency;
  // The slowest rank's rates, on every rank (contention differs between ranks).
  double v[] = {m.peak_flops_fp32, m.memory_bandwidth, m.host_adamw_rate, m.h2d, m.d2h, m.device_adamw_rate,
                m.peak_flops_bf16, host_share};
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, v, 8, MPI_DOUBLE, MPI_MIN, comm, &r);
  wait_bounded(r, "MPI_Iallreduce of the measured rates");
  m.peak_flops_fp32 = v[0];
  m.memory_bandwidth = v[1];
  m.host_adamw_rate = v[2];
  m.h2d = v[3];
  m.d2h = v[4];
  m.device_adamw_rate = v[5];
  m.peak_flops_bf16 = v[6];
  m.host_bandwidth = v[7] * ranks;
  const std::string bf16_rate =
      m.peak_flops_bf16 > 0 ? strprintf("bf16 products %.1f", m.peak_flops_bf16 / 1e9) : "no bf16 products";
  log.info(strprintf("measured: GEMM %.1f GFLOP/s (%s), stream %.1f GB/s, host AdamW %.3g "
                     "params/s, host<->device %.1f / %.1f GB/s, all-reduce %.2f GB/s + %.1f us per step, per rank of "
                     "%d",
                     m.peak_flops_fp32 / 1e9, bf16_rate.c_str(), m.memory_bandwidth / 1e9, m.host_adamw_rate,
                     m.h2d / 1e9, m.d2h / 1e9, m.intra_bandwidth / 1e9, m.intra_latency * 1e6, ranks));
  return m;
}

namespace {

// d(objective)/d(loss_i) for the head's forward and backward, as a step of 1000 positions.
constexpr float kLossScale = 1e-3f;

// One layer of each kind as tensor-parallel rank `tp_rank` of `tp` holds it, combined with
// the others by `combine` (tp 1: alone), at each micro-batch size. Alone, each piece starts
// from evicted caches; in a group (`together` lines its ranks up) a repetition's pieces run
// back to back after one eviction, as a step runs them: evictions between them would put
// the ranks out of step, and their collectives would time each other's evictions (measured
// on 4 ranks of tp 4 sharing 2 cores: 36 ms a block against 20 in a run, back to back 19).
std::vector<MeasuredCosts> profile_shard(const ModelConfig& full, Precision precision,
                                         const std::vector<std::int64_t>& micro_batch_sizes, int reps, int tp,
                                         int tp_rank, const ShardCombine& combine,
                                         const std::function<void()>& together = {}) {
  ModelConfig model = full;
  model.layers = 1;  // one of each piece
  const ParamLayout layout = ParamLayout::of(model, tp, tp_rank);
  const bool sequence_parallel = static_cast<bool>(combine.gather);
  MemoryTracker tracker;
  std::vector<Buffer<float, Exec::memory_space>> params, grads;
  for (int l = 0; l < layout.num_layers(); ++l) {
    const std::int64_t numel = layout.layers()[static_cast<std::size_t>(l)].numel;
    std::vector<float> host(static_cast<std::size_t>(numel));
    initial_values(layout, model, 1, l, 0, numel, host.data());
    params.emplace_back(tracker, MemCategory::parameters, "lamina::profile_params", numel);
    grads.emplace_back(tracker, MemCategory::gradients, "lamina::profile_grads", numel);
    using H = Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Kokkos::deep_copy(params.back().view(), H(host.data(), host.size()));
  }
  // The parameters as the run stores them: bf16 runs read bf16 matrices (widened gains and
  // biases) and keep the residual stream and saved activations in bf16, as the executor does.
  const bool bf16 = precision == Precision::bf16;
  std::vector<Buffer<std::uint16_t, Exec::memory_space>> params16;
  std::vector<LayerParams> stored(static_cast<std::size_t>(layout.num_layers()));
  for (int l = 0; l < layout.num_layers(); ++l) {
    const auto n = static_cast<std::size_t>(layout.layers()[static_cast<std::size_t>(l)].numel);
    if (bf16) {
      params16.emplace_back(tracker, MemCategory::parameters, "lamina::profile_params_bf16", n);
      to_bf16(Exec(), params16.back().view(), ConstVec<Exec>(params[static_cast<std::size_t>(l)].data(), n));
      stored[static_cast<std::size_t>(l)].b16 = params16.back().data();
    } else {
      stored[static_cast<std::size_t>(l)].f32 = params[static_cast<std::size_t>(l)].data();
    }
  }
  const EmbeddingTensors<Exec> ge = bind_embedding<Exec>(layout, grads[0].data());
  const BlockTensors<Exec> gb = bind_block<Exec>(layout, 0, grads[1].data());
  const FinalNormTensors<Exec> gf = bind_final_norm<Exec>(layout, grads[2].data());
  const Exec exec;
  std::vector<MeasuredCosts> out;
  for (const std::int64_t mbs : micro_batch_sizes) {
    Dims d = Dims::of(model, mbs, tp, tp_rank, sequence_parallel, combine.ring.size, combine.ring.rank);
    d.products = product_math<Exec>(precision);
    d.bf16 = bf16;
    LayerRangeActs<Exec> a(tracker, d, 0, 1, true, true, {ActivationPolicy::keep}, bf16);
    WorkspaceBuffers<Exec> ws(tracker, d);
    // Token ids spread over the vocabulary as text's are (the embedding's backward sums each
    // id's positions).
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(d.N())), targets(inputs.size(), 2);
    for (std::size_t i = 0; i < inputs.size(); ++i) inputs[i] = static_cast<std::int32_t>(i * 7919 % model.vocab_size);
    a.set_tokens(exec, inputs.data(), targets.data());
    const Workspace<Exec>& w = ws.ws;
    auto block_weights = [&] {
      LayerParams p = stored[1];
      if (bf16) {
        const LayerSpec& l = layout.layers()[1];
        const std::int64_t n = l.numel - l.matrix_numel;
        from_bf16(exec, as_vec<Exec>(w.vectors.data(), n), Bf16Vec<Exec>(params16[1].data() + l.matrix_numel, static_cast<std::size_t>(n)));
        p.vectors = w.vectors.data();
      }
      return bind_block_weights<Exec>(layout, 0, p);
    };
    auto final_weights = [&] {
      LayerParams p = stored[2];
      if (bf16) {
        const LayerSpec& l = layout.layers()[2];
        const std::int64_t n = l.numel - l.matrix_numel;
        from_bf16(exec, as_vec<Exec>(w.vectors.data(), n),
                  Bf16Vec<Exec>(params16[2].data() + l.matrix_numel, static_cast<std::size_t>(n)));
        p.vectors = w.vectors.data();
      }
      return bind_final_norm_weights<Exec>(layout, p);
    };
    const EmbeddingWeights<Exec> we = bind_embedding_weights<Exec>(layout, stored[0]);
    // A step finds a layer's weights and saved activations a layer's worth of other data
    // later: each piece is timed from memory, not from the caches its last repetition left.
    const CacheEvictor<Exec> evict(true);
    std::vector<double> t[6];
    for (int r = 0; r <= reps; ++r) {
      if (together) {
        evict(exec);
        together();
      }
      auto timed = [&](int k, const auto& f) {
        if (!together) evict(exec);
        const auto t0 = Clock::now();
        f();
        exec.fence();
        if (r > 0) t[k].push_back(seconds_since(t0));
      };
      timed(0, [&] { range_embed_forward(exec, we, a, w, combine); });
      timed(1, [&] { range_block_forward(exec, block_weights(), a, 0, a.kept_inner(0), true, w, combine); });
      timed(2, [&] { range_head_forward(exec, we, final_weights(), a, w, combine, kLossScale); });
      timed(3, [&] { range_head_backward(exec, ge, gf, we, final_weights(), a, a.dres, w, kLossScale, combine); });
      timed(4, [&] {
        range_block_backward(exec, gb, block_weights(), a, 0, a.kept_inner(0), a.dres, w, combine);
      });
      timed(5, [&] { range_embed_backward(exec, ge, a, w, combine); });
    }
    MeasuredCosts m;
    m.micro_batch_size = mbs;
    m.tp = tp;
    m.sequence_parallel = sequence_parallel;
    m.cp = combine.ring.size;
    m.embed_forward = median(t[0]);
    m.block_forward = median(t[1]);
    m.head_forward = median(t[2]);
    m.head_backward = median(t[3]);
    m.block_backward = median(t[4]);
    m.embed_backward = median(t[5]);
    out.push_back(m);
  }
  return out;
}

}  // namespace

std::vector<MeasuredCosts> profile_model(const ModelConfig& model, Precision precision,
                                         const std::vector<std::int64_t>& micro_batch_sizes, int reps) {
  return profile_shard(model, precision, micro_batch_sizes, reps, 1, 0, ShardCombine());
}

std::vector<MeasuredCosts> profile_sharded(const ModelConfig& model, Precision precision,
                                           const std::vector<std::int64_t>& micro_batch_sizes, int tp,
                                           bool sequence_parallel, int cp, MPI_Comm comm, CommBackend backend,
                                           int reps) {
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  const ProcessGrid grid(comm, ranks / (tp * cp), cp, tp, 1, backend);
  return profile_shard(model, precision, micro_batch_sizes, reps, tp, grid.tp_rank(),
                       shard_combine(grid, Precision::fp32, sequence_parallel), [&grid, cp] {
                         if (cp > 1) grid.world().barrier();  // the ring's ranks, as the tp group's
                         grid.tp().barrier();
                       });
}

void calibrate(MachineSpec& machine, const ModelConfig& model, Precision precision, const MeasuredCosts& measured) {
  MachineSpec ideal = machine;
  ideal.gemm_efficiency = ideal.attention_efficiency = ideal.elementwise_efficiency = 1.0;
  Plan plan;
  plan.layout.micro_batch_size = measured.micro_batch_size;
  plan.blocks.assign(static_cast<std::size_t>(model.layers), LayerPolicy{});
  plan.precision = precision;
  const CostModel roofline(model, plan, ideal);
  const double ratio = (measured.block_forward + measured.block_backward) /
                       (roofline.block_forward() + roofline.block_backward());
  const double e = std::min(1.0, 1.0 / std::max(ratio, 1e-9));
  machine.gemm_efficiency = machine.attention_efficiency = machine.elementwise_efficiency = e;
}

}  // namespace lamina
