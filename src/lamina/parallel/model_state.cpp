#include "lamina/parallel/model_state.hpp"

#include <algorithm>
#include <set>

#include "lamina/core/exec_instances.hpp"
#include "lamina/kernels/bf16.hpp"
#include "lamina/model/init.hpp"
#include "lamina/optim/adamw.hpp"
#include "lamina/optim/grad_norm.hpp"

namespace lamina {

namespace {

using Exec = ModelState::Exec;
using Mem = ModelState::Mem;
using HostExec = ModelState::HostExec;
// Windows into host-tier buffers (page-locked on GPU builds) as the host memory the host
// execution space's kernels take.
using HostView = Kokkos::View<float*, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using DeviceView = Kokkos::View<float*, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using HostView16 =
    Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
using DeviceView16 = Kokkos::View<std::uint16_t*, Kokkos::LayoutRight, Mem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

DeviceView dev(float* p, std::int64_t n) { return DeviceView(p, static_cast<std::size_t>(n)); }
HostView host(float* p, std::int64_t n) { return HostView(p, static_cast<std::size_t>(n)); }
DeviceView16 dev(std::uint16_t* p, std::int64_t n) { return DeviceView16(p, static_cast<std::size_t>(n)); }
HostView16 host(std::uint16_t* p, std::int64_t n) { return HostView16(p, static_cast<std::size_t>(n)); }

// An all-gather moves bytes without arithmetic, so bf16 pairs travel as float words
// (bf16 shards have an even length).
void all_gather_bf16(Communicator& c, const std::uint16_t* send, std::uint16_t* recv, std::int64_t count) {
  c.all_gather(reinterpret_cast<const float*>(send), reinterpret_cast<float*>(recv), count / 2);
}

void fill(const Exec& exec, float* p, std::int64_t n, float value) { Kokkos::deep_copy(exec, dev(p, n), value); }

// dst += src
void add(const Exec& exec, float* dst, const float* src, std::int64_t n) {
  const DeviceView d = dev(dst, n), s = dev(const_cast<float*>(src), n);
  Kokkos::parallel_for(
      "lamina::accumulate_shard", Range<Exec>(exec, 0, n), KOKKOS_LAMBDA(std::int64_t i) { d(i) += s(i); });
}

// A buffer whose element 0 is layer element `origin`, as views of layer elements [begin, end).
template <class V>
struct Window {
  typename V::value_type* data;
  std::int64_t origin;
  V operator()(std::int64_t begin, std::int64_t end) const {
    return V(data + (begin - origin), static_cast<std::size_t>(end - begin));
  }
};
using DeviceWindow = Window<DeviceView>;
using HostWindow = Window<HostView>;
using DeviceWindow16 = Window<DeviceView16>;
using HostWindow16 = Window<HostView16>;

const char* kStateNames[3] = {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"};

}  // namespace

ModelState::ModelState(MemoryTracker& tracker, const ModelConfig& model, const OptimizerConfig& opt,
                       const MemoryConfig& memory, const ProcessGrid& grid, const Partition& partition, int zero,
                       const DosModel& dos, Precision precision)
    : tracker_(tracker),
      model_(model),
      opt_(opt),
      memory_(memory),
      grid_(grid),
      zero_(zero),
      bf16_(precision == Precision::bf16),
      dos_(dos),
      layout_(ParamLayout::gpt2(model, grid.tp_size(), grid.tp_rank())),
      param_pool_(tracker, MemCategory::parameters, "lamina::gathered_params"),
      grad_pool_(tracker, MemCategory::gradients, "lamina::full_grads"),
      staging_pool_(tracker, MemCategory::communication, "lamina::comm_staging"),
      dos_pool_(tracker, MemCategory::optimizer_state, "lamina::dos_staging"),
      staging16_pool_(tracker, MemCategory::communication, "lamina::comm_staging_bf16"),
      transfer_(transfer_instance<Exec>()) {
  std::set<int> held;
  for (int c : partition.chunks_of(grid.pp_rank()))
    for (int l : layers_of(partition.chunk(c))) held.insert(l);
  const std::int64_t dp = grid.dp_size();
  for (int l : held) {
    const LayerSpec& spec = layout_.layers()[static_cast<std::size_t>(l)];
    Slot s;
    s.numel = spec.numel;
    s.shard = (s.numel + dp - 1) / dp;
    if (bf16_) s.shard += s.shard % 2;  // see all_gather_bf16
    s.padded = s.shard * dp;
    s.params_at = MemoryConfig::of_layer(memory.params, l);
    s.optimizer_at = MemoryConfig::of_layer(memory.optimizer, l);
    const std::string& n = spec.name;
    const std::int64_t stored = zero_ < 3 ? s.padded : s.shard;
    const MemTier h = MemTier::host;
    if (s.params_at == ParamPlacement::device) {
      if (bf16_) {
        s.params16 = DeviceBuf16(tracker, MemCategory::parameters, "lamina::params_bf16_" + n, stored);
      } else {
        s.params = DeviceBuf(tracker, MemCategory::parameters, "lamina::params_" + n, stored);
      }
    } else if (bf16_) {
      s.params16_host = HostBuf16(tracker, MemCategory::parameters, "lamina::params_bf16_" + n, stored, h);
    } else {
      s.params_host = HostBuf(tracker, MemCategory::parameters, "lamina::params_" + n, stored, h);
    }
    if (zero_ < 2) s.grads = DeviceBuf(tracker, MemCategory::gradients, "lamina::grads_" + n, s.padded);
    if (zero_ >= 2) s.grad_shard = DeviceBuf(tracker, MemCategory::gradients, "lamina::grad_shard_" + n, s.shard);
    const std::int64_t owned = zero_ == 0 ? s.padded : s.shard;
    if (s.optimizer_at == OptimizerPlacement::device) {
      s.m = DeviceBuf(tracker, MemCategory::optimizer_state, "lamina::exp_avg_" + n, owned);
      s.v = DeviceBuf(tracker, MemCategory::optimizer_state, "lamina::exp_avg_sq_" + n, owned);
      if (bf16_) s.master = DeviceBuf(tracker, MemCategory::optimizer_state, "lamina::master_" + n, owned);
    } else {
      s.m_host = HostBuf(tracker, MemCategory::optimizer_state, "lamina::exp_avg_" + n, owned, h);
      s.v_host = HostBuf(tracker, MemCategory::optimizer_state, "lamina::exp_avg_sq_" + n, owned, h);
      s.grads_host = HostBuf(tracker, MemCategory::gradients, "lamina::host_grads_" + n, owned, h);
      if (s.params_at == ParamPlacement::device || bf16_) {
        s.master_host = HostBuf(tracker, MemCategory::optimizer_state, "lamina::master_" + n, owned, h);
      }
      if (s.params_at == ParamPlacement::device && bf16_) {
        s.rounded_host = HostBuf16(tracker, MemCategory::parameters, "lamina::params_bf16_out_" + n, owned, h);
      }
    }
    if (s.optimizer_at == OptimizerPlacement::dynamic) {
      dos_stage_size_ = std::max(dos_stage_size_, std::min(opt_.subgroup_size, owned_end(s) - owned_begin(s)));
    }
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

float* ModelState::master_host(Slot& s) {
  // Host fp32 parameters are the master weights; otherwise the host keeps the owned range.
  if (s.params_at == ParamPlacement::host && !bf16_) return s.params_host.data() + (zero_ < 3 ? owned_begin(s) : 0);
  return s.master_host.data();
}

void ModelState::publish_from_device(Slot& s, std::int64_t begin, std::int64_t end, float* values) {
  const Exec exec;
  const std::int64_t n = end - begin;
  if (bf16_) {
    to_bf16(exec, Bf16Vec<Exec>(dev(s.params16.data() + (begin - stored_begin(s)), n)), ConstVec<Exec>(dev(values, n)));
    return;
  }
  float* p = s.params.data() + (begin - stored_begin(s));
  if (p != values) Kokkos::deep_copy(exec, dev(p, n), dev(values, n));
}

void ModelState::publish_from_host(Slot& s, std::int64_t begin, std::int64_t end, float* values) {
  const HostExec hexec;
  const std::int64_t n = end - begin;
  const std::int64_t at = begin - stored_begin(s);
  if (!bf16_) {
    if (s.params_at == ParamPlacement::device) Kokkos::deep_copy(Exec(), dev(s.params.data() + at, n), host(values, n));
    return;  // host fp32 parameters are the master weights
  }
  // Rounded on the host, so that half the bytes cross to the device.
  std::uint16_t* out = s.params_at == ParamPlacement::host ? s.params16_host.data() + at
                                                            : s.rounded_host.data() + (begin - owned_begin(s));
  to_bf16(hexec, Bf16Vec<HostExec>(host(out, n)), ConstVec<HostExec>(host(values, n)));
  hexec.fence();
  if (s.params_at == ParamPlacement::device) Kokkos::deep_copy(Exec(), dev(s.params16.data() + at, n), host(out, n));
}

void ModelState::init(std::uint64_t seed) {
  std::vector<float> full;
  for (auto& [l, s] : slots_) {
    full.assign(static_cast<std::size_t>(s.padded), 0.0f);
    initial_values(layout_, model_, seed, l, 0, s.numel, full.data());
    scatter(l, 0, full);
  }
  Exec().fence();
}

void ModelState::prefetch(int layer) {
  Slot& s = slot(layer);
  if (resident(s) || s.prefetched || s.gather_count > 0) return;
  fetch(s, transfer_);
  ++s.gather_count;
  s.prefetched = true;
}

void ModelState::gather(int layer) {
  Slot& s = slot(layer);
  if (resident(s)) return;
  if (s.prefetched) {  // the prefetch's hold becomes this one
    s.prefetched = false;
    transfer_.fence();
    staging16_pool_.release(s.staged16, s.padded);
    s.staged16 = nullptr;
    return;
  }
  if (s.gather_count++ > 0) return;
  fetch(s, Exec());
  Exec().fence();
  staging16_pool_.release(s.staged16, s.padded);
  s.staged16 = nullptr;
}

void ModelState::fetch(Slot& s, const Exec& copies) {
  s.gathered = param_pool_.acquire(s.padded);
  const Exec exec;
  if (bf16_) {
    fetch_bf16(s, copies);
    return;
  }
  if (s.params_at == ParamPlacement::device) {  // ZeRO-3: from the data-parallel peers
    exec.fence();
    grid_.dp().all_gather(s.params.data(), s.gathered, s.shard);
  } else if (zero_ < 3) {  // host tier: copied in, on `copies` (the transfer instance when prefetching)
    Kokkos::deep_copy(copies, dev(s.gathered, s.padded), host(s.params_host.data(), s.padded));
  } else {  // both: the owned shard in, then the all-gather
    float* mine = staging_pool_.acquire(s.shard);
    Kokkos::deep_copy(exec, dev(mine, s.shard), host(s.params_host.data(), s.shard));
    exec.fence();
    grid_.dp().all_gather(mine, s.gathered, s.shard);
    staging_pool_.release(mine, s.shard);
  }
}

void ModelState::fetch_bf16(Slot& s, const Exec& copies) {
  const Exec exec;
  const Vec<Exec> out = dev(s.gathered, s.padded);
  if (s.params_at == ParamPlacement::device && zero_ < 3) {
    from_bf16(copies, out, Bf16Vec<Exec>(dev(s.params16.data(), s.padded)));
    return;
  }
  if (s.params_at == ParamPlacement::host && zero_ < 3) {
    // The staging buffer stays held until gather() has waited for the copies.
    s.staged16 = staging16_pool_.acquire(s.padded);
    Kokkos::deep_copy(copies, dev(s.staged16, s.padded), host(s.params16_host.data(), s.padded));
    from_bf16(copies, out, Bf16Vec<Exec>(dev(s.staged16, s.padded)));
    return;
  }
  // ZeRO-3: the bf16 shards are all-gathered (half the bytes of fp32), then widened.
  std::uint16_t* all = staging16_pool_.acquire(s.padded);
  std::uint16_t* mine = s.params16.data();
  if (s.params_at == ParamPlacement::host) {
    mine = staging16_pool_.acquire(s.shard);
    Kokkos::deep_copy(exec, dev(mine, s.shard), host(s.params16_host.data(), s.shard));
  }
  exec.fence();
  all_gather_bf16(grid_.dp(), mine, all, s.shard);
  from_bf16(exec, out, Bf16Vec<Exec>(dev(all, s.padded)));
  exec.fence();
  if (s.params_at == ParamPlacement::host) staging16_pool_.release(mine, s.shard);
  staging16_pool_.release(all, s.padded);
}

void ModelState::release(int layer) {
  Slot& s = slot(layer);
  if (resident(s) || --s.gather_count > 0) return;
  Exec().fence();
  param_pool_.release(s.gathered, s.padded);
  s.gathered = nullptr;
}

float* ModelState::params(int layer) const {
  const Slot& s = slot(layer);
  return resident(s) ? s.params.data() : s.gathered;
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
    s.flushed = false;
  }
}

void ModelState::flush_grads(int layer, Slot& s) {
  s.flushed = true;
  const std::int64_t begin = owned_begin(s), end = owned_end(s);
  if (s.optimizer_at == OptimizerPlacement::device || end <= begin) return;
  const auto groups = layout_.subgroups(layer, begin, end, opt_.subgroup_size);
  if (s.optimizer_at == OptimizerPlacement::dynamic) {
    // Placed now, with the device memory free now (what the budget leaves; unknown
    // without one), so that device subgroups' gradients never leave the device. Staging
    // the pool kept from an earlier update is free for this one.
    std::vector<std::int64_t> sizes;
    for (const Subgroup& g : groups) sizes.push_back(g.end - g.begin);
    const std::int64_t budget = memory_.device_budget;
    const std::int64_t used = tracker_.current(tier_label(MemTier::device)) - dos_pool_.idle_bytes();
    const std::int64_t free = budget > 0 ? budget - used : -1;
    s.plan = plan_dos(sizes, dos_, free, memory_.dos_split);
  }
  const DeviceWindow g = zero_ <= 1 ? DeviceWindow{s.grads.data(), 0} : DeviceWindow{s.grad_shard.data(), begin};
  const HostWindow h{s.grads_host.data(), begin};
  for (std::size_t x = 0; x < groups.size(); ++x) {
    if (s.optimizer_at == OptimizerPlacement::dynamic && s.plan.site[x] == UpdateSite::device) continue;
    Kokkos::deep_copy(transfer_, h(groups[x].begin, groups[x].end), g(groups[x].begin, groups[x].end));
  }
}

void ModelState::reduce_grads(int layer, bool final) {
  Slot& s = slot(layer);
  Exec().fence();  // the gradients are complete before the network reads them
  if (zero_ == 0) {
    // Subgroup-sized buckets: each can start as soon as it is ready and keeps messages bounded.
    for (std::int64_t b = 0; b < s.padded; b += opt_.subgroup_size) {
      const std::int64_t n = std::min(opt_.subgroup_size, s.padded - b);
      const bool last = b + n == s.padded;
      pending_.push_back({layer, grid_.dp().iallreduce(s.grads.data() + b, n, ReduceOp::sum), nullptr, nullptr,
                          final && last});
    }
    // Reductions already done complete now (in order, so a layer's last bucket completes
    // after its others): host-updated gradients leave before the rest of the backward pass.
    while (!pending_.empty() && pending_.front().request.test()) {
      complete(pending_.front());
      pending_.erase(pending_.begin());
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
  pending_.push_back(
      {layer, grid_.dp().ireduce_scatter(full, temp, s.shard), temp, zero_ >= 2 ? full : nullptr, final});
  if (zero_ >= 2) s.full_grads = nullptr;  // the next backward starts a fresh accumulator
}

void ModelState::complete(Pending& p) {
  p.request.wait();
  Slot& s = slot(p.layer);
  const Exec exec;
  if (p.temp != nullptr) {
    if (zero_ == 1) {
      // ZeRO-1 keeps its full gradient buffer; the reduced shard goes back into its place.
      Kokkos::deep_copy(exec, dev(s.grads.data() + owned_begin(s), s.shard), dev(p.temp, s.shard));
    } else {
      add(exec, s.grad_shard.data(), p.temp, s.shard);
    }
    exec.fence();
    staging_pool_.release(p.temp, s.shard);
  }
  if (p.full != nullptr) grad_pool_.release(p.full, s.padded);
  // The step's gradients of this layer are complete: those updated on the host start
  // their way there on the transfer instance, overlapping the rest of the backward pass
  // (the tied embedding waits for the other pipeline end's part).
  if (p.final && !(p.layer == 0 && grid_.pp_size() > 1)) {
    exec.fence();
    flush_grads(p.layer, s);
  }
}

void ModelState::finish_reductions() {
  for (auto& p : pending_) complete(p);
  pending_.clear();
  const Exec exec;
  if (grid_.pp_size() > 1 && holds(0)) {
    // The tied embedding: the first stage has the lookup's gradient, the last the head's.
    Slot& s = slot(0);
    exec.fence();
    if (zero_ == 0) {
      grid_.embedding().allreduce(s.grads.data(), s.padded, ReduceOp::sum);
    } else if (zero_ == 1) {
      grid_.embedding().allreduce(s.grads.data() + owned_begin(s), s.shard, ReduceOp::sum);
    } else {
      grid_.embedding().allreduce(s.grad_shard.data(), s.shard, ReduceOp::sum);
    }
  }
  // Gradients not on their way to the host yet (the update waits for them).
  exec.fence();
  for (auto& [l, s] : slots_)
    if (!s.flushed) flush_grads(l, s);
}

double ModelState::grad_sq_norm_local() const {
  const Exec exec;
  double sum = 0.0;
  for (const auto& [l, s] : slots_) {
    if (l == 0 && !grid_.first_stage()) continue;  // the last stage's copy of the tied embedding
    const std::int64_t begin = grid_.dp_rank() * s.shard, end = std::min(s.numel, begin + s.shard);
    const DeviceWindow g = zero_ <= 1 ? DeviceWindow{s.grads.data(), 0} : DeviceWindow{s.grad_shard.data(), begin};
    for (const TensorSpec& t : layout_.layers()[static_cast<std::size_t>(l)].tensors) {
      if (t.replicated() && grid_.tp_rank() != 0) continue;
      const std::int64_t b = std::max(begin, t.offset), e = std::min(end, t.offset + t.numel());
      if (b < e) sum += sum_of_squares(exec, ConstVec<Exec>(g(b, e)));
    }
  }
  return sum;
}

void ModelState::update_on_device(int layer, Slot& s, const AdamWStep& step) {
  const Exec exec;
  const std::int64_t begin = owned_begin(s), end = owned_end(s);
  // The master weights: the fp32 parameters themselves, or the owned range beside bf16 ones.
  const DeviceWindow p = bf16_ ? DeviceWindow{s.master.data(), begin} : DeviceWindow{s.params.data(), stored_begin(s)};
  const DeviceWindow g = zero_ <= 1 ? DeviceWindow{s.grads.data(), 0} : DeviceWindow{s.grad_shard.data(), begin};
  const DeviceWindow m{s.m.data(), begin}, v{s.v.data(), begin};
  const std::int64_t matrix_end = layout_.layers()[static_cast<std::size_t>(layer)].matrix_numel;
  for (const Subgroup& sg : layout_.subgroups(layer, begin, end, opt_.subgroup_size)) {
    adamw_update_range(exec, p(sg.begin, sg.end), m(sg.begin, sg.end), v(sg.begin, sg.end),
                       ConstVec<Exec>(g(sg.begin, sg.end)), sg.begin, matrix_end, step,
                       static_cast<float>(opt_.weight_decay), opt_.decay_biases_and_norms);
  }
  publish_from_device(s, begin, end, p(begin, end).data());
}

void ModelState::update_on_host(int layer, Slot& s, const AdamWStep& step) {
  const HostExec hexec;
  const std::int64_t begin = owned_begin(s), end = owned_end(s);
  const HostWindow p{master_host(s), begin}, g{s.grads_host.data(), begin};
  const HostWindow m{s.m_host.data(), begin}, v{s.v_host.data(), begin};
  const std::int64_t matrix_end = layout_.layers()[static_cast<std::size_t>(layer)].matrix_numel;
  transfer_.fence();  // the gradients have arrived
  for (const Subgroup& sg : layout_.subgroups(layer, begin, end, opt_.subgroup_size)) {
    adamw_update_range(hexec, p(sg.begin, sg.end), m(sg.begin, sg.end), v(sg.begin, sg.end),
                       ConstVec<HostExec>(g(sg.begin, sg.end)), sg.begin, matrix_end, step,
                       static_cast<float>(opt_.weight_decay), opt_.decay_biases_and_norms);
  }
  hexec.fence();
  publish_from_host(s, begin, end, p(begin, end).data());
}

void ModelState::update_dynamic(int layer, Slot& s, const AdamWStep& step) {
  const Exec exec;
  const HostExec hexec;
  const std::int64_t begin = owned_begin(s), end = owned_end(s);
  const auto groups = layout_.subgroups(layer, begin, end, opt_.subgroup_size);  // placed in s.plan by flush_grads

  const HostWindow p{master_host(s), begin}, gh{s.grads_host.data(), begin};
  const HostWindow m{s.m_host.data(), begin}, v{s.v_host.data(), begin};
  const DeviceWindow gd = zero_ <= 1 ? DeviceWindow{s.grads.data(), 0} : DeviceWindow{s.grad_shard.data(), begin};
  const bool device_params = s.params_at == ParamPlacement::device;
  const std::int64_t matrix_end = layout_.layers()[static_cast<std::size_t>(layer)].matrix_numel;
  const float wd = static_cast<float>(opt_.weight_decay);
  transfer_.fence();  // host gradients have arrived
  // Device subgroups first: their copies and kernels are queued on the device and run
  // while the host updates the others (on a host-only build they simply run in turn).
  // One staging size for every layer, so that the pool keeps just one set.
  const bool any = std::any_of(s.plan.site.begin(), s.plan.site.end(), [](UpdateSite u) { return u == UpdateSite::device; });
  const std::int64_t largest = any ? dos_stage_size_ : 0;
  float* stage[3] = {nullptr, nullptr, nullptr};
  if (largest > 0)
    for (auto& b : stage) b = dos_pool_.acquire(largest);
  for (std::size_t x = 0; x < groups.size(); ++x) {
    if (s.plan.site[x] != UpdateSite::device) continue;
    const Subgroup& g = groups[x];
    const std::int64_t n = g.end - g.begin;
    Kokkos::deep_copy(exec, dev(stage[0], n), p(g.begin, g.end));
    Kokkos::deep_copy(exec, dev(stage[1], n), m(g.begin, g.end));
    Kokkos::deep_copy(exec, dev(stage[2], n), v(g.begin, g.end));
    adamw_update_range(exec, dev(stage[0], n), dev(stage[1], n), dev(stage[2], n), ConstVec<Exec>(gd(g.begin, g.end)),
                       g.begin, matrix_end, step, wd, opt_.decay_biases_and_norms);
    if (device_params) publish_from_device(s, g.begin, g.end, stage[0]);
    Kokkos::deep_copy(exec, p(g.begin, g.end), dev(stage[0], n));
    Kokkos::deep_copy(exec, m(g.begin, g.end), dev(stage[1], n));
    Kokkos::deep_copy(exec, v(g.begin, g.end), dev(stage[2], n));
  }
  for (std::size_t x = 0; x < groups.size(); ++x) {
    if (s.plan.site[x] != UpdateSite::host) continue;
    const Subgroup& g = groups[x];
    adamw_update_range(hexec, p(g.begin, g.end), m(g.begin, g.end), v(g.begin, g.end),
                       ConstVec<HostExec>(gh(g.begin, g.end)), g.begin, matrix_end, step, wd,
                       opt_.decay_biases_and_norms);
  }
  hexec.fence();
  exec.fence();  // device subgroups are back in the host master weights too
  for (std::size_t x = 0; x < groups.size(); ++x) {
    const Subgroup& g = groups[x];
    if (s.plan.site[x] == UpdateSite::host || !device_params) publish_from_host(s, g.begin, g.end, p(g.begin, g.end).data());
  }
  exec.fence();
  if (largest > 0)
    for (auto* b : stage) dos_pool_.release(b, largest);
}

void ModelState::share_updated_params(Slot& s) {
  // ZeRO-1/2: every rank updated its shard of the replicated parameters; share them.
  const Exec exec;
  if (bf16_) {
    std::uint16_t* mine = staging16_pool_.acquire(s.shard);
    if (s.params_at == ParamPlacement::device) {
      Kokkos::deep_copy(exec, dev(mine, s.shard), dev(s.params16.data() + owned_begin(s), s.shard));
      exec.fence();
      all_gather_bf16(grid_.dp(), mine, s.params16.data(), s.shard);
    } else {
      std::uint16_t* full = staging16_pool_.acquire(s.padded);
      Kokkos::deep_copy(exec, dev(mine, s.shard), host(s.params16_host.data() + owned_begin(s), s.shard));
      exec.fence();
      all_gather_bf16(grid_.dp(), mine, full, s.shard);
      Kokkos::deep_copy(exec, host(s.params16_host.data(), s.padded), dev(full, s.padded));
      exec.fence();
      staging16_pool_.release(full, s.padded);
    }
    staging16_pool_.release(mine, s.shard);
    return;
  }
  float* mine = staging_pool_.acquire(s.shard);
  if (s.params_at == ParamPlacement::device) {
    Kokkos::deep_copy(exec, dev(mine, s.shard), dev(s.params.data() + owned_begin(s), s.shard));
    exec.fence();
    grid_.dp().all_gather(mine, s.params.data(), s.shard);
  } else {
    float* full = staging_pool_.acquire(s.padded);
    Kokkos::deep_copy(exec, dev(mine, s.shard), host(s.params_host.data() + owned_begin(s), s.shard));
    exec.fence();
    grid_.dp().all_gather(mine, full, s.shard);
    Kokkos::deep_copy(exec, host(s.params_host.data(), s.padded), dev(full, s.padded));
    exec.fence();
    staging_pool_.release(full, s.padded);
  }
  staging_pool_.release(mine, s.shard);
}

void ModelState::optimizer_step(double lr, double grad_scale) {
  ++t_;
  const AdamWStep step = AdamWStep::make(lr, opt_.beta1, opt_.beta2, opt_.eps, t_, grad_scale);
  for (auto& [l, s] : slots_) {
    if (owned_end(s) <= owned_begin(s)) continue;
    switch (s.optimizer_at) {
      case OptimizerPlacement::device: update_on_device(l, s, step); break;
      case OptimizerPlacement::host: update_on_host(l, s, step); break;
      case OptimizerPlacement::dynamic: update_dynamic(l, s, step); break;
    }
  }
  for (auto& [l, s] : slots_)
    if (zero_ == 1 || zero_ == 2) share_updated_params(s);
  Exec().fence();
}

std::vector<DosPlan> ModelState::dos_plans() const {
  std::vector<DosPlan> out;
  for (const auto& [l, s] : slots_)
    if (s.optimizer_at == OptimizerPlacement::dynamic && !s.plan.site.empty()) out.push_back(s.plan);
  return out;
}

std::vector<std::string> ModelState::dos_schedule() const {
  std::vector<std::string> out;
  for (const auto& [l, s] : slots_) {
    if (s.optimizer_at == OptimizerPlacement::dynamic && !s.plan.site.empty()) {
      out.push_back(layout_.layers()[static_cast<std::size_t>(l)].name + ": " + s.plan.describe());
    }
  }
  return out;
}

void ModelState::set_params(int layer, const std::vector<float>& values) {
  std::vector<float> full(values);
  full.resize(static_cast<std::size_t>(slot(layer).padded), 0.0f);
  scatter(layer, 0, full);
}

std::vector<float> ModelState::params_host(int layer) const {
  const Slot& s = slot(layer);
  std::vector<float> out(static_cast<std::size_t>(s.numel));
  if (bf16_) {
    std::vector<std::uint16_t> b(out.size());
    if (s.params_at == ParamPlacement::host) {
      std::copy(s.params16_host.data(), s.params16_host.data() + s.numel, b.begin());
    } else {
      Kokkos::deep_copy(host(b.data(), s.numel), dev(const_cast<std::uint16_t*>(s.params16.data()), s.numel));
    }
    std::transform(b.begin(), b.end(), out.begin(), [](std::uint16_t x) { return from_bf16(x); });
  } else if (s.params_at == ParamPlacement::host) {
    std::copy(s.params_host.data(), s.params_host.data() + s.numel, out.begin());
  } else {
    Kokkos::deep_copy(host(out.data(), s.numel), dev(s.params.data(), s.numel));
  }
  return out;
}

std::vector<float> ModelState::grads_host(int layer) const {
  const Slot& s = slot(layer);
  std::vector<float> out(static_cast<std::size_t>(s.numel));
  Kokkos::deep_copy(host(out.data(), s.numel), dev(s.grads.data(), s.numel));
  return out;
}

const float* ModelState::assemble(int layer, int which, std::vector<float>& out) {
  Slot& s = slot(layer);
  const Exec exec;
  out.assign(static_cast<std::size_t>(s.padded), 0.0f);
  // The stored part: fp32 parameters (whole or shard), or the master weights (under bf16)
  // and moments of the owned range.
  const bool params = which == 0 && !bf16_;
  const bool on_device = params ? s.params_at == ParamPlacement::device : s.optimizer_at == OptimizerPlacement::device;
  const bool sharded = params ? zero_ == 3 : zero_ >= 1;
  const float* part = params       ? (on_device ? s.params.data() : s.params_host.data())
                      : which == 0 ? (on_device ? s.master.data() : s.master_host.data())
                      : which == 1 ? (on_device ? s.m.data() : s.m_host.data())
                                   : (on_device ? s.v.data() : s.v_host.data());
  const std::int64_t n = sharded ? s.shard : s.padded;
  if (!sharded) {  // whole already: straight to the host
    if (on_device) {
      Kokkos::deep_copy(host(out.data(), n), dev(const_cast<float*>(part), n));
    } else {
      std::copy(part, part + n, out.begin());
    }
    return out.data();
  }
  // A shard: all-gathered over the data-parallel group on the device.
  float* mine = staging_pool_.acquire(s.shard);
  float* all = staging_pool_.acquire(s.padded);
  if (on_device) {
    Kokkos::deep_copy(exec, dev(mine, n), dev(const_cast<float*>(part), n));
  } else {
    Kokkos::deep_copy(exec, dev(mine, n), host(const_cast<float*>(part), n));
  }
  exec.fence();
  grid_.dp().all_gather(mine, all, s.shard);
  Kokkos::deep_copy(host(out.data(), s.padded), dev(all, s.padded));
  staging_pool_.release(all, s.padded);
  staging_pool_.release(mine, s.shard);
  return out.data();
}

// The inverse of assemble: from the full layer contents, what this rank stores.
void ModelState::scatter(int layer, int which, const std::vector<float>& full) {
  Slot& s = slot(layer);
  const Exec exec;
  float* f = const_cast<float*>(full.data());
  const std::int64_t ob = owned_begin(s), on = zero_ == 0 ? s.padded : s.shard;
  if (which == 0 && bf16_) {
    if (s.optimizer_at == OptimizerPlacement::device) {
      Kokkos::deep_copy(exec, dev(s.master.data(), on), host(f + ob, on));
    } else {
      std::copy(f + ob, f + ob + on, s.master_host.data());
    }
    const std::int64_t from = stored_begin(s), n = zero_ == 3 ? s.shard : s.padded;
    std::vector<std::uint16_t> b(static_cast<std::size_t>(n));
    std::transform(f + from, f + from + n, b.begin(), [](float x) { return to_bf16(x); });
    if (s.params_at == ParamPlacement::device) {
      Kokkos::deep_copy(exec, dev(s.params16.data(), n), host(b.data(), n));
    } else {
      std::copy(b.begin(), b.end(), s.params16_host.data());
    }
    exec.fence();
  } else if (which == 0) {
    const std::int64_t from = zero_ == 3 ? grid_.dp_rank() * s.shard : 0, n = zero_ == 3 ? s.shard : s.padded;
    if (s.params_at == ParamPlacement::device) {
      Kokkos::deep_copy(exec, dev(s.params.data(), n), host(f + from, n));
    } else {
      std::copy(f + from, f + from + n, s.params_host.data());
    }
    if (s.optimizer_at != OptimizerPlacement::device && s.params_at == ParamPlacement::device) {
      std::copy(f + ob, f + ob + on, s.master_host.data());  // the host's master copy
    }
  } else {
    const bool on_device = s.optimizer_at == OptimizerPlacement::device;
    float* dst = which == 1 ? (on_device ? s.m.data() : s.m_host.data()) : (on_device ? s.v.data() : s.v_host.data());
    if (on_device) {
      Kokkos::deep_copy(exec, dev(dst, on), host(f + ob, on));
    } else {
      std::copy(f + ob, f + ob + on, dst);
    }
  }
  exec.fence();
}

void ModelState::write_checkpoint(CheckpointWriter& writer) {
  std::vector<float> full;
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const bool held = holds(l);
    const LayerSpec& spec = layout_.layers()[static_cast<std::size_t>(l)];
    // One writer per piece: data-parallel rank 0, the first stage for the embedding, and
    // tensor-parallel rank 0 for tensors every tensor-parallel rank holds whole.
    const bool writer_rank = held && grid_.dp_rank() == 0 && (l != 0 || grid_.first_stage());
    for (int which = 0; which < 3; ++which) {
      const float* data = held ? assemble(l, which, full) : nullptr;
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
    }
  }
}

void ModelState::read_checkpoint(CheckpointReader& reader) {
  std::vector<float> full;
  for (int l = 0; l < layout_.num_layers(); ++l) {
    const bool held = holds(l);
    const LayerSpec& spec = layout_.layers()[static_cast<std::size_t>(l)];
    for (int which = 0; which < 3; ++which) {
      if (held) full.assign(static_cast<std::size_t>(slot(l).padded), 0.0f);
      for (const TensorSpec& t : spec.tensors) {
        TensorSlab slab;
        slab.name = kStateNames[which] + t.name;
        slab.global_shape = t.global_shape;
        slab.local_shape = t.shape;
        slab.data = held ? full.data() + t.offset : nullptr;
        if (held) {
          for (const SlabMap& m : t.slabs()) slab.pieces.push_back({m.global_offset, m.count});
        }
        reader.read(slab);
      }
      if (held) scatter(l, which, full);
    }
  }
}

}  // namespace lamina
