#include "lamina/parallel/grad_reducer.hpp"

#include <algorithm>

#include "lamina/core/exec_instances.hpp"
#include "lamina/core/tier_views.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

namespace {

using Exec = GradientReducer::Exec;

void fill(const Exec& exec, float* p, std::int64_t n, float value) { Kokkos::deep_copy(exec, dev(p, n), value); }

// dst += src
struct AccumulateShard {
  DeviceView dst, src;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst(i) += src(i); }
};

void add(const Exec& exec, float* dst, const float* src, std::int64_t n) {
  Kokkos::parallel_for("lamina::accumulate_shard", Range<Exec>(exec, 0, n),
                       AccumulateShard{dev(dst, n), dev(const_cast<float*>(src), n)});
}

}  // namespace

GradientReducer::GradientReducer(MemoryTracker& tracker, const ParamLayout& layout, const ProcessGrid& grid,
                                 const std::vector<int>& held, int zero, Precision precision, std::int64_t bucket,
                                 DevicePools& pools)
    : layout_(layout), grid_(grid), zero_(zero), bucket_(bucket), pools_(pools), follow_up_(transfer_instance<Exec>()) {
  for (int l : held) {
    const LayerSpec& spec = layout.layers()[static_cast<std::size_t>(l)];
    Slot s;
    s.shard = LayerShard::of(spec.numel, grid.dp_size(), precision == Precision::bf16);
    const StoredGrads n = StoredGrads::of(s.shard, zero);
    if (n.full) s.grads = Buffer<float, DeviceMem>(tracker, MemCategory::gradients, "lamina::grads_" + spec.name, n.full);
    if (n.shard) {
      s.grad_shard = Buffer<float, DeviceMem>(tracker, MemCategory::gradients, "lamina::grad_shard_" + spec.name, n.shard);
    }
    slots_.emplace(l, std::move(s));
  }
  // The elements this rank is the one owner of, every tensor's piece of them, summed in one
  // reduction per step.
  std::vector<Span> spans;
  for (const auto& [l, s] : slots_) {
    if (l == 0 && !grid_.first_stage()) continue;  // the last stage's copy of the tied embedding
    const std::int64_t begin = grid_.dp_rank() * s.shard.shard, end = std::min(s.shard.numel, begin + s.shard.shard);
    for (const TensorSpec& t : layout_.layers()[static_cast<std::size_t>(l)].tensors) {
      if (t.replicated() && grid_.tp_rank() != 0) continue;
      const std::int64_t b = std::max(begin, t.offset), e = std::min(end, t.offset + t.numel());
      if (b < e) spans.push_back({zero_ <= 1 ? s.grads.data() + b : s.grad_shard.data() + (b - begin), e - b});
    }
  }
  norm_ = SpansSumOfSquares<Exec>(spans);
}

void GradientReducer::zero_grads() {
  const Exec exec;
  for (auto& [l, s] : slots_) {
    if (zero_ < 2) fill(exec, s.grads.data(), s.shard.padded, 0.0f);
    if (zero_ >= 2) fill(exec, s.grad_shard.data(), s.shard.shard, 0.0f);
  }
}

void GradientReducer::begin(int layer) {
  if (zero_ < 2) return;
  Slot& s = slot(layer);
  if (s.full_grads != nullptr) return;
  s.full_grads = pools_.grads.acquire(s.shard.padded);
  fill(Exec(), s.full_grads, s.shard.padded, 0.0f);
}

float* GradientReducer::grads(int layer) const {
  const Slot& s = slot(layer);
  return zero_ < 2 ? s.grads.data() : s.full_grads;
}

Completion GradientReducer::reduce(int layer) {
  Slot& s = slot(layer);
  Completion done;
  if (zero_ == 0) {
    // Subgroup-sized buckets keep messages bounded.
    for (std::int64_t b = 0; b < s.shard.padded; b += bucket_) {
      const std::int64_t n = std::min(bucket_, s.shard.padded - b);
      done.add(grid_.dp().iallreduce(s.grads.data() + b, n, ReduceOp::sum));
    }
    return done;
  }
  float* full = zero_ == 1 ? s.grads.data() : s.full_grads;
  float* temp = pools_.staging.acquire(s.shard.shard);
  done.add(grid_.dp().ireduce_scatter(full, temp, s.shard.shard));
  if (zero_ >= 2) s.full_grads = nullptr;  // the next backward starts a fresh accumulator
  done.then([this, layer, full, temp] {
    // On an instance of its own: waiting for it waits for nothing queued on the compute's.
    Slot& s = slot(layer);
    const Exec& exec = follow_up_;
    if (zero_ == 1) {
      // ZeRO-1 keeps its full gradient buffer; the reduced shard goes back into its place.
      const std::int64_t owned = s.shard.owned_begin(grid_.dp_rank(), zero_);
      Kokkos::deep_copy(exec, dev(s.grads.data() + owned, s.shard.shard), dev(temp, s.shard.shard));
    } else {
      add(exec, s.grad_shard.data(), temp, s.shard.shard);
    }
    exec.fence();  // the staging buffer is read before it goes back to the pool
    pools_.staging.release(temp, s.shard.shard);
    if (zero_ >= 2) pools_.grads.release(full, s.shard.padded);
  });
  return done;
}

void GradientReducer::sync_embedding() {
  if (grid_.pp_size() <= 1 || !slots_.count(0)) return;
  // The tied embedding: the first stage has the lookup's gradient, the last the head's
  // (the instruction waits for every reduction, which waited for the backward passes).
  Slot& s = slot(0);
  if (zero_ == 0) {
    grid_.embedding().allreduce(s.grads.data(), s.shard.padded, ReduceOp::sum);
  } else if (zero_ == 1) {
    grid_.embedding().allreduce(s.grads.data() + s.shard.owned_begin(grid_.dp_rank(), zero_), s.shard.shard,
                                ReduceOp::sum);
  } else {
    grid_.embedding().allreduce(s.grad_shard.data(), s.shard.shard, ReduceOp::sum);
  }
}

const float* GradientReducer::owned(int layer) const {
  const Slot& s = slot(layer);
  return zero_ <= 1 ? s.grads.data() + s.shard.owned_begin(grid_.dp_rank(), zero_) : s.grad_shard.data();
}

double GradientReducer::sq_norm_local() const { return norm_(Exec()); }

std::vector<float> GradientReducer::full_host(int layer) const {
  const Slot& s = slot(layer);
  std::vector<float> out(static_cast<std::size_t>(s.shard.numel));
  Kokkos::deep_copy(host(out.data(), s.shard.numel), dev(const_cast<float*>(s.grads.data()), s.shard.numel));
  return out;
}

}  // namespace lamina
