#include "lamina/parallel/grad_reducer.hpp"

#include <algorithm>

#include "lamina/core/exec_instances.hpp"
#include "lamina/core/kokkos_compat.hpp"
#include "lamina/core/tier_views.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

namespace {

using Exec = GradientReducer::Exec;

void fill_zeros(const Exec& exec, float* p, std::int64_t n) { zero_fill(exec, dev(p, n)); }

// dst += src
struct AccumulateShard {
  DeviceView dst, src;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const { dst(i) += src(i); }
};

void add(const Exec& exec, float* dst, const float* src, std::int64_t n) {
  Kokkos::parallel_for("lamina::accumulate_shard", Range<Exec>(exec, 0, n),
                       AccumulateShard{dev(dst, n), dev(const_cast<float*>(src), n)});
}

// One replicated piece of a full gradient into its place in the group's buffer (zeros in
// the other pieces' places), and back.
struct PackPiece {
  DeviceView full, packed;
  ReplicatedPiece p;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    const std::int64_t n = p.rows * p.cols, k = i / n, row = (i % n) / p.cols, col = i % p.cols;
    packed(i) = k == p.piece ? full(p.offset + row * p.stride + col) : 0.0f;
  }
};
struct UnpackPiece {
  DeviceView full, packed;
  ReplicatedPiece p;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i) const {
    full(p.offset + (i / p.cols) * p.stride + i % p.cols) = packed(p.piece * p.rows * p.cols + i);
  }
};

}  // namespace

std::vector<ReplicatedPiece> replicated_pieces(const LayerSpec& layer) {
  std::vector<ReplicatedPiece> out;
  for (const TensorSpec& t : layer.tensors) {
    if (!t.has_replicated_blocks()) continue;
    for (const SlabMap& m : t.slabs()) {
      if (m.copies == 1) continue;
      const auto runs = t.runs(m);
      ReplicatedPiece p;
      p.offset = t.offset + runs.front().first;
      p.rows = static_cast<std::int64_t>(runs.size());
      p.cols = runs.front().second - runs.front().first;
      p.stride = runs.size() > 1 ? runs[1].first - runs[0].first : p.cols;
      p.piece = t.tp_rank / m.copies;
      p.pieces = t.tp_size / m.copies;
      out.push_back(p);
    }
  }
  return out;
}

std::int64_t replica_sum_elements(const LayerSpec& layer) {
  std::int64_t n = 0;
  for (const ReplicatedPiece& p : replicated_pieces(layer)) n += p.packed();
  return n;
}

GradientReducer::GradientReducer(MemoryTracker& tracker, const ParamLayout& layout, const ProcessGrid& grid,
                                 const std::vector<int>& held, int zero, Precision precision, std::int64_t bucket,
                                 DevicePools& pools, bool sequence_parallel)
    : layout_(layout), grid_(grid), zero_(zero), bucket_(bucket), pools_(pools), follow_up_(transfer_instance<Exec>()) {
  for (int l : held) {
    const LayerSpec& spec = layout.layers()[static_cast<std::size_t>(l)];
    Slot s;
    s.shard = LayerShard::of(spec.numel, grid.data_size(), precision == Precision::bf16);
    const StoredGrads n = StoredGrads::of(s.shard, zero);
    if (n.full) s.grads = Buffer<float, DeviceMem>(tracker, MemCategory::gradients, "lamina::grads_" + spec.name, n.full);
    if (n.shard) {
      s.grad_shard = Buffer<float, DeviceMem>(tracker, MemCategory::gradients, "lamina::grad_shard_" + spec.name, n.shard);
    }
    slots_.emplace(l, std::move(s));
    replicated_[l] = replicated_pieces(spec);
    if (!sequence_parallel || grid.tp_size() == 1) continue;
    auto& runs = norms_[l];
    for (const TensorSpec& t : spec.tensors) {
      if (!t.norm) continue;
      if (!runs.empty() && runs.back().second == t.offset) {
        runs.back().second += t.numel();  // LayerNorm's gain and bias side by side: one sum
      } else {
        runs.emplace_back(t.offset, t.offset + t.numel());
      }
    }
  }
  std::int64_t sums = 0;
  for (const int l : held) sums = std::max(sums, replica_sum_elements(layout.layers()[static_cast<std::size_t>(l)]));
  if (sums > 0) replica_sums_ = Buffer<float, DeviceMem>(tracker, MemCategory::communication, "lamina::replica_sums", sums);
  // The elements this rank is the one owner of, every tensor's piece of them, summed in one
  // reduction per step.
  std::vector<Span> spans;
  for (const auto& slot : slots_) {  // not a structured binding: the lambda below captures it
    const int l = slot.first;
    const Slot& s = slot.second;
    if (l == 0 && !grid_.first_stage()) continue;  // the last stage's copy of the tied embedding
    const std::int64_t begin = grid_.data_rank() * s.shard.shard, end = std::min(s.shard.numel, begin + s.shard.shard);
    const auto add_span = [&](std::int64_t first, std::int64_t last) {
      const std::int64_t b = std::max(begin, first), e = std::min(end, last);
      if (b < e) spans.push_back({zero_ <= 1 ? s.grads.data() + b : s.grad_shard.data() + (b - begin), e - b});
    };
    for (const TensorSpec& t : layout_.layers()[static_cast<std::size_t>(l)].tensors) {
      const std::vector<SlabMap> slabs = t.slabs();
      if (std::all_of(slabs.begin(), slabs.end(), [](const SlabMap& m) { return m.first_copy; })) {
        add_span(t.offset, t.offset + t.numel());
        continue;
      }
      for (const SlabMap& m : slabs) {
        if (!m.first_copy) continue;
        for (const auto& [first, last] : t.runs(m)) add_span(t.offset + first, t.offset + last);
      }
    }
  }
  norm_ = SpansSumOfSquares<Exec>(spans);
}

void GradientReducer::zero_grads() {
  const Exec exec;
  for (auto& [l, s] : slots_) {
    if (zero_ < 2) fill_zeros(exec, s.grads.data(), s.shard.padded);
    if (zero_ >= 2) fill_zeros(exec, s.grad_shard.data(), s.shard.shard);
  }
}

void GradientReducer::begin(int layer) {
  if (zero_ < 2) return;
  Slot& s = slot(layer);
  if (s.full_grads != nullptr) return;
  s.full_grads = pools_.grads.acquire(s.shard.padded);
  fill_zeros(Exec(), s.full_grads, s.shard.padded);
}

float* GradientReducer::grads(int layer) const {
  const Slot& s = slot(layer);
  return zero_ < 2 ? s.grads.data() : s.full_grads;
}

void GradientReducer::sum_replicas(int layer, float* full) {
  const std::vector<ReplicatedPiece>& pieces = replicated_.at(layer);
  if (pieces.empty()) return;
  const Exec exec;
  const Slot& s = slot(layer);
  const DeviceView grads = dev(full, s.shard.padded);
  std::int64_t n = 0;
  for (const ReplicatedPiece& p : pieces) {
    Kokkos::parallel_for("lamina::pack_replicated_grads", Range<Exec>(exec, 0, p.packed()),
                         PackPiece{grads, dev(replica_sums_.data() + n, p.packed()), p});
    n += p.packed();
  }
  exec.fence();
  grid_.tp().allreduce(replica_sums_.data(), n, ReduceOp::sum);
  n = 0;
  for (const ReplicatedPiece& p : pieces) {
    Kokkos::parallel_for("lamina::unpack_replicated_grads", Range<Exec>(exec, 0, p.rows * p.cols),
                         UnpackPiece{grads, dev(replica_sums_.data() + n, p.packed()), p});
    n += p.packed();
  }
  exec.fence();  // the data-parallel reduction reads them next
}

void GradientReducer::sum_norms(int layer, float* full) {
  const auto it = norms_.find(layer);
  if (it == norms_.end() || it->second.empty()) return;
  Exec().fence();  // the backward passes that wrote them
  for (const auto& [first, last] : it->second) grid_.tp().allreduce(full + first, last - first, ReduceOp::sum);
}

Completion GradientReducer::reduce(int layer) {
  Slot& s = slot(layer);
  sum_replicas(layer, zero_ < 2 ? s.grads.data() : s.full_grads);
  sum_norms(layer, zero_ < 2 ? s.grads.data() : s.full_grads);
  Completion done;
  if (zero_ == 0) {
    // Subgroup-sized buckets keep messages bounded.
    for (std::int64_t b = 0; b < s.shard.padded; b += bucket_) {
      const std::int64_t n = std::min(bucket_, s.shard.padded - b);
      done.add(grid_.data().iallreduce(s.grads.data() + b, n, ReduceOp::sum));
    }
    return done;
  }
  float* full = zero_ == 1 ? s.grads.data() : s.full_grads;
  float* temp = pools_.staging.acquire(s.shard.shard);
  done.add(grid_.data().ireduce_scatter(full, temp, s.shard.shard));
  if (zero_ >= 2) s.full_grads = nullptr;  // the next backward starts a fresh accumulator
  done.then([this, layer, full, temp] {
    // On an instance of its own: waiting for it waits for nothing queued on the compute's.
    Slot& s = slot(layer);
    const Exec& exec = follow_up_;
    if (zero_ == 1) {
      // ZeRO-1 keeps its full gradient buffer; the reduced shard goes back into its place.
      const std::int64_t owned = s.shard.owned_begin(grid_.data_rank(), zero_);
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
  if (grid_.pp_size() <= 1 || !layout_.tied_embeddings() || !slots_.count(0)) return;
  // The tied embedding: the first stage has the lookup's gradient, the last the head's
  // (the instruction waits for every reduction, which waited for the backward passes).
  Slot& s = slot(0);
  if (zero_ == 0) {
    grid_.embedding().allreduce(s.grads.data(), s.shard.padded, ReduceOp::sum);
  } else if (zero_ == 1) {
    grid_.embedding().allreduce(s.grads.data() + s.shard.owned_begin(grid_.data_rank(), zero_), s.shard.shard,
                                ReduceOp::sum);
  } else {
    grid_.embedding().allreduce(s.grad_shard.data(), s.shard.shard, ReduceOp::sum);
  }
}

const float* GradientReducer::owned(int layer) const {
  const Slot& s = slot(layer);
  return zero_ <= 1 ? s.grads.data() + s.shard.owned_begin(grid_.data_rank(), zero_) : s.grad_shard.data();
}

double GradientReducer::sq_norm_local() const { return norm_(Exec()); }

std::vector<float> GradientReducer::full_host(int layer) const {
  const Slot& s = slot(layer);
  std::vector<float> out(static_cast<std::size_t>(s.shard.numel));
  Kokkos::deep_copy(host(out.data(), s.shard.numel), dev(const_cast<float*>(s.grads.data()), s.shard.numel));
  return out;
}

}  // namespace lamina
