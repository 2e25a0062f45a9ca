#include "lamina/parallel/model_state.hpp"

#include <algorithm>
#include <set>

#include "lamina/model/init.hpp"
#include "lamina/optim/adamw.hpp"
#include "lamina/optim/grad_norm.hpp"

namespace lamina {

namespace {

using Exec = ModelState::Exec;
using Mem = ModelState::Mem;
constexpr bool kHostAccessible = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Mem>::accessible;

Vec<Exec> span(float* p, std::int64_t begin, std::int64_t end) { return as_vec<Exec>(p + begin, end - begin); }

// A buffer whose element 0 is layer element `origin`, as a view of layer elements [begin, end).
struct Window {
  float* data;
  std::int64_t origin;
  Vec<Exec> operator()(std::int64_t begin, std::int64_t end) const {
    return as_vec<Exec>(data + (begin - origin), end - begin);
  }
};

void fill(const Exec& exec, float* p, std::int64_t n, float value) { Kokkos::deep_copy(exec, span(p, 0, n), value); }

void copy(const Exec& exec, float* dst, const float* src, std::int64_t n) {
  Kokkos::deep_copy(exec, span(dst, 0, n), span(const_cast<float*>(src), 0, n));
}

// dst += src
void add(const Exec& exec, float* dst, const float* src, std::int64_t n) {
  const Vec<Exec> d = span(dst, 0, n), s = span(const_cast<float*>(src), 0, n);
  Kokkos::parallel_for(
      "lamina::accumulate_shard", Range<Exec>(exec, 0, n), KOKKOS_LAMBDA(std::int64_t i) { d(i) += s(i); });
}

// Host-readable contents of n device floats (the device pointer itself where the host can read it).
const float* on_host(const float* p, std::int64_t n, std::vector<float>& host) {
  if (kHostAccessible) return p;
  host.resize(static_cast<std::size_t>(n));
  Kokkos::deep_copy(Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(host.data(), n),
                    span(const_cast<float*>(p), 0, n));
  return host.data();
}

const char* kStateNames[3] = {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"};

}  // namespace

ModelState::ModelState(MemoryTracker& tracker, const ModelConfig& model, const OptimizerConfig& opt,
                       const ProcessGrid& grid, const Partition& partition, int zero)
    : tracker_(tracker),
      model_(model),
      opt_(opt),
      grid_(grid),
      zero_(zero),
      layout_(ParamLayout::gpt2(model, grid.tp_size(), grid.tp_rank())),
      param_pool_(tracker, MemCategory::parameters, "lamina::gathered_params"),
      grad_pool_(tracker, MemCategory::gradients, "lamina::full_grads"),
      staging_pool_(tracker, MemCategory::communication, "lamina::comm_staging") {
  std::set<int> held;
  for (int c : partition.chunks_of(grid.pp_rank()))
    for (int l : layers_of(partition.chunk(c))) held.insert(l);
  const std::int64_t dp = grid.dp_size();
  for (int l : held) {
    const LayerSpec& spec = layout_.layers()[static_cast<std::size_t>(l)];
    Slot s;
    s.numel = spec.numel;
    s.shard = (s.numel + dp - 1) / dp;
    s.padded = s.shard * dp;
    const std::string& n = spec.name;
    if (zero_ < 3) s.params = Buffer<float, Mem>(tracker, MemCategory::parameters, "lamina::params_" + n, s.padded);
    if (zero_ == 3) {
      s.param_shard = Buffer<float, Mem>(tracker, MemCategory::parameters, "lamina::param_shard_" + n, s.shard);
    }
    if (zero_ < 2) s.grads = Buffer<float, Mem>(tracker, MemCategory::gradients, "lamina::grads_" + n, s.padded);
    if (zero_ >= 2) {
      s.grad_shard = Buffer<float, Mem>(tracker, MemCategory::gradients, "lamina::grad_shard_" + n, s.shard);
    }
    const std::int64_t moments = zero_ == 0 ? s.padded : s.shard;
    s.m = Buffer<float, Mem>(tracker, MemCategory::optimizer_state, "lamina::exp_avg_" + n, moments);
    s.v = Buffer<float, Mem>(tracker, MemCategory::optimizer_state, "lamina::exp_avg_sq_" + n, moments);
    slots_.emplace(l, std::move(s));
  }
}

std::vector<int> ModelState::layers_of(const Chunk& c) const {
  std::vector<int> out;
  if (c.embedding || c.head) out.push_back(0);
  for (std::int64_t b = c.first_block; b < c.last_block; ++b) out.push_back(layout_.block_layer(b));
  if (c.head) out.push_back(layout_.final_layer());
  return out;
}

void ModelState::init(std::uint64_t seed) {
  const Exec exec;
  for (auto& [l, s] : slots_) {
    // This rank's elements: the whole layer, or its ZeRO-3 shard; padding stays zero.
    const std::int64_t begin = zero_ == 3 ? owned_begin(s) : 0;
    const std::int64_t end = std::min(s.numel, zero_ == 3 ? begin + s.shard : s.numel);
    std::vector<float> host(static_cast<std::size_t>(zero_ == 3 ? s.shard : s.padded), 0.0f);
    if (end > begin) initial_values(layout_, model_, seed, l, begin, end, host.data());
    const Vec<Exec> dst = zero_ == 3 ? s.param_shard.view() : s.params.view();
    Kokkos::deep_copy(exec, dst,
                      Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                          host.data(), host.size()));
  }
  exec.fence();
}

void ModelState::gather(int layer) {
  if (zero_ < 3) return;
  Slot& s = slot(layer);
  if (s.gather_count++ > 0) return;
  s.gathered = param_pool_.acquire(s.padded);
  Exec().fence();
  grid_.dp().all_gather(s.param_shard.data(), s.gathered, s.shard);
}

void ModelState::release(int layer) {
  if (zero_ < 3) return;
  Slot& s = slot(layer);
  if (--s.gather_count > 0) return;
  Exec().fence();
  param_pool_.release(s.gathered, s.padded);
  s.gathered = nullptr;
}

float* ModelState::params(int layer) const {
  const Slot& s = slot(layer);
  return zero_ < 3 ? s.params.data() : s.gathered;
}

void ModelState::begin_grads(int layer) {
  if (zero_ < 2) return;
  Slot& s = slot(layer);
  if (s.full_grads != nullptr) return;
  s.full_grads = grad_pool_.acquire(s.padded);
  fill(Exec(), s.full_grads, s.padded, 0.0f);
}

float* ModelState::grads(int layer) const {
  const Slot& s = slot(layer);
  return zero_ < 2 ? s.grads.data() : s.full_grads;
}

void ModelState::zero_grads() {
  const Exec exec;
  for (auto& [l, s] : slots_) {
    if (zero_ < 2) fill(exec, s.grads.data(), s.padded, 0.0f);
    if (zero_ >= 2) fill(exec, s.grad_shard.data(), s.shard, 0.0f);
  }
}

void ModelState::reduce_grads(int layer) {
  Slot& s = slot(layer);
  Exec().fence();  // the gradients are complete before the network reads them
  if (zero_ == 0) {
    // Subgroup-sized buckets: each can start as soon as it is ready and keeps messages bounded.
    for (std::int64_t b = 0; b < s.padded; b += opt_.subgroup_size) {
      const std::int64_t n = std::min(opt_.subgroup_size, s.padded - b);
      pending_.push_back({layer, grid_.dp().iallreduce(s.grads.data() + b, n, ReduceOp::sum), nullptr, nullptr});
    }
    return;
  }
  // One reduce-scatter in flight (overlapping the backward of the layer before): each
  // holds a full-size gradient buffer (ZeRO-2/3) until it completes.
  while (!pending_.empty()) {
    complete(pending_.front());
    pending_.erase(pending_.begin());
  }
  float* full = zero_ == 1 ? s.grads.data() : s.full_grads;
  float* temp = staging_pool_.acquire(s.shard);
  pending_.push_back({layer, grid_.dp().ireduce_scatter(full, temp, s.shard), temp, zero_ >= 2 ? full : nullptr});
  if (zero_ >= 2) s.full_grads = nullptr;  // the next backward starts a fresh accumulator
  // ZeRO-1 keeps its full gradient buffer; the reduced shard goes back into it (below).
}

void ModelState::complete(Pending& p) {
  p.request.wait();
  Slot& s = slot(p.layer);
  const Exec exec;
  if (p.temp != nullptr) {
    if (zero_ == 1) {
      copy(exec, s.grads.data() + owned_begin(s), p.temp, s.shard);  // once per step: no accumulation
    } else {
      add(exec, s.grad_shard.data(), p.temp, s.shard);
    }
    exec.fence();
    staging_pool_.release(p.temp, s.shard);
  }
  if (p.full != nullptr) grad_pool_.release(p.full, s.padded);
}

void ModelState::finish_reductions() {
  for (auto& p : pending_) complete(p);
  pending_.clear();
  if (grid_.pp_size() > 1 && holds(0)) {
    // The tied embedding: the first stage has the lookup's gradient, the last the head's.
    Slot& s = slot(0);
    Exec().fence();
    if (zero_ == 0) {
      grid_.embedding().allreduce(s.grads.data(), s.padded, ReduceOp::sum);
    } else if (zero_ == 1) {
      grid_.embedding().allreduce(s.grads.data() + owned_begin(s), s.shard, ReduceOp::sum);
    } else {
      grid_.embedding().allreduce(s.grad_shard.data(), s.shard, ReduceOp::sum);
    }
  }
}

double ModelState::grad_sq_norm_local() const {
  const Exec exec;
  double sum = 0.0;
  for (const auto& [l, s] : slots_) {
    if (l == 0 && !grid_.first_stage()) continue;  // the last stage's copy of the tied embedding
    const std::int64_t begin = owned_begin(s), end = std::min(s.numel, begin + s.shard);
    const Window g = zero_ <= 1 ? Window{s.grads.data(), 0} : Window{s.grad_shard.data(), begin};
    for (const TensorSpec& t : layout_.layers()[static_cast<std::size_t>(l)].tensors) {
      if (t.replicated() && grid_.tp_rank() != 0) continue;
      const std::int64_t b = std::max(begin, t.offset), e = std::min(end, t.offset + t.numel());
      if (b < e) sum += sum_of_squares(exec, ConstVec<Exec>(g(b, e)));
    }
  }
  return sum;
}

void ModelState::optimizer_step(double lr, double grad_scale) {
  ++t_;
  const AdamWStep step = AdamWStep::make(lr, opt_.beta1, opt_.beta2, opt_.eps, t_, grad_scale);
  const Exec exec;
  for (auto& [l, s] : slots_) {
    const std::int64_t begin = zero_ == 0 ? 0 : owned_begin(s);
    const std::int64_t end = std::min(s.numel, zero_ == 0 ? s.numel : begin + s.shard);
    // Full buffers start at layer element 0, shards at their first owned element.
    const Window p = zero_ == 3 ? Window{s.param_shard.data(), begin} : Window{s.params.data(), 0};
    const Window g = zero_ <= 1 ? Window{s.grads.data(), 0} : Window{s.grad_shard.data(), begin};
    const Window m{s.m.data(), zero_ == 0 ? 0 : begin}, v{s.v.data(), zero_ == 0 ? 0 : begin};
    const std::int64_t matrix_end = layout_.layers()[static_cast<std::size_t>(l)].matrix_numel;
    for (const Subgroup& sg : layout_.subgroups(l, begin, end, opt_.subgroup_size)) {
      adamw_update_range(exec, p(sg.begin, sg.end), m(sg.begin, sg.end), v(sg.begin, sg.end),
                         ConstVec<Exec>(g(sg.begin, sg.end)), sg.begin, matrix_end, step,
                         static_cast<float>(opt_.weight_decay), opt_.decay_biases_and_norms);
    }
    if (zero_ == 1 || zero_ == 2) {
      // Every rank updated its shard of the full parameters: share them.
      float* mine = staging_pool_.acquire(s.shard);
      copy(exec, mine, s.params.data() + owned_begin(s), s.shard);
      exec.fence();
      grid_.dp().all_gather(mine, s.params.data(), s.shard);
      staging_pool_.release(mine, s.shard);
    }
  }
  exec.fence();
}

namespace {
using HostView = Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
}  // namespace

void ModelState::set_params(int layer, const std::vector<float>& host) {
  Slot& s = slot(layer);
  Kokkos::deep_copy(span(s.params.data(), 0, s.numel), HostView(const_cast<float*>(host.data()), s.numel));
}

std::vector<float> ModelState::params_host(int layer) const {
  const Slot& s = slot(layer);
  std::vector<float> out(static_cast<std::size_t>(s.numel));
  Kokkos::deep_copy(HostView(out.data(), out.size()), span(s.params.data(), 0, s.numel));
  return out;
}

std::vector<float> ModelState::grads_host(int layer) const {
  const Slot& s = slot(layer);
  std::vector<float> out(static_cast<std::size_t>(s.numel));
  Kokkos::deep_copy(HostView(out.data(), out.size()), span(s.grads.data(), 0, s.numel));
  return out;
}

float* ModelState::assemble(int layer, int which) {
  Slot& s = slot(layer);
  const Buffer<float, Mem>& full = which == 0 ? s.params : which == 1 ? s.m : s.v;
  const bool sharded = which == 0 ? zero_ == 3 : zero_ >= 1;
  if (!sharded) return full.data();
  const Buffer<float, Mem>& shard = which == 0 ? s.param_shard : which == 1 ? s.m : s.v;
  float* out = staging_pool_.acquire(s.padded);
  Exec().fence();
  grid_.dp().all_gather(shard.data(), out, s.shard);
  return out;
}

void ModelState::write_checkpoint(CheckpointWriter& writer) {
  std::vector<float> host;
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const bool held = holds(l);
    const LayerSpec& spec = layout_.layers()[static_cast<std::size_t>(l)];
    // One writer per piece: data-parallel rank 0, the first stage for the embedding, and
    // tensor-parallel rank 0 for tensors every tensor-parallel rank holds whole.
    const bool writer_rank = held && grid_.dp_rank() == 0 && (l != 0 || grid_.first_stage());
    for (int which = 0; which < 3; ++which) {
      float* dev = held ? assemble(l, which) : nullptr;
      const float* data = held ? on_host(dev, slot(l).padded, host) : nullptr;
      for (const TensorSpec& t : spec.tensors) {
        TensorSlab slab;
        slab.name = kStateNames[which] + t.name;
        slab.global_shape = t.global_shape;
        slab.local_shape = t.shape;
        slab.data = data == nullptr ? nullptr : const_cast<float*>(data) + t.offset;
        if (writer_rank && (!t.replicated() || grid_.tp_rank() == 0)) {
          for (const SlabMap& m : t.slabs()) slab.pieces.push_back({m.global_offset, m.count});
        }
        writer.write(slab);
      }
      if (held && dev != (which == 0 ? slot(l).params.data() : which == 1 ? slot(l).m.data() : slot(l).v.data())) {
        staging_pool_.release(dev, slot(l).padded);
      }
    }
  }
}

void ModelState::read_checkpoint(CheckpointReader& reader) {
  const Exec exec;
  std::vector<float> host;
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const bool held = holds(l);
    const LayerSpec& spec = layout_.layers()[static_cast<std::size_t>(l)];
    for (int which = 0; which < 3; ++which) {
      if (held) host.assign(static_cast<std::size_t>(slot(l).padded), 0.0f);
      for (const TensorSpec& t : spec.tensors) {
        TensorSlab slab;
        slab.name = kStateNames[which] + t.name;
        slab.global_shape = t.global_shape;
        slab.local_shape = t.shape;
        slab.data = held ? host.data() + t.offset : nullptr;
        if (held) {
          for (const SlabMap& m : t.slabs()) slab.pieces.push_back({m.global_offset, m.count});
        }
        reader.read(slab);
      }
      if (!held) continue;
      Slot& s = slot(l);
      const bool sharded = which == 0 ? zero_ == 3 : zero_ >= 1;
      const Buffer<float, Mem>& dst = which == 0 ? (zero_ == 3 ? s.param_shard : s.params) : which == 1 ? s.m : s.v;
      const std::int64_t from = sharded ? owned_begin(s) : 0;
      Kokkos::deep_copy(exec, dst.view(),
                        Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>(
                            host.data() + from, static_cast<std::size_t>(dst.size())));
      exec.fence();
    }
  }
}

}  // namespace lamina
