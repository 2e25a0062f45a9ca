#include "lamina/memory/optimizer_updaters.hpp"

#include <algorithm>

#include "lamina/core/tier_views.hpp"

namespace lamina {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;
using Mem = Exec::memory_space;
using HostExec = Kokkos::DefaultHostExecutionSpace;
using DeviceBuf = Buffer<float, Mem>;
using HostBuf = Buffer<float, HostTierSpace>;

// Scalars every subgroup's update shares.
struct Hyper {
  float weight_decay;
  bool decay_vectors;
  std::int64_t matrix_end;
};

template <class E, class V>
void adamw(const E& exec, const V& p, const V& m, const V& v, const V& g, std::int64_t begin, const AdamWStep& step,
           const Hyper& h, const Bf16Vec<E>& rounded = Bf16Vec<E>()) {
  adamw_update_range(exec, Vec<E>(p), Vec<E>(m), Vec<E>(v), ConstVec<E>(g), begin, h.matrix_end, step,
                     h.weight_decay, h.decay_vectors, rounded);
}

// The stored bf16 parameters of layer elements [begin, end) on the device, which the update
// writes (empty where they are fp32 or in host memory).
Bf16Vec<Exec> rounded_params(ParamSink& sink, int layer, std::int64_t origin, std::int64_t begin, std::int64_t end) {
  std::uint16_t* r = sink.device_rounded(layer);
  return r == nullptr ? Bf16Vec<Exec>() : Bf16Vec<Exec>(DeviceWindow16{r, origin}(begin, end));
}

class DeviceAdamW final : public LayerOptimizer {
 public:
  DeviceAdamW(MemoryTracker& t, const std::string& name, const LayerOptimizerSpec& spec, const Hyper& h)
      : spec_(spec), h_(h) {
    const OptimizerBuffers n = OptimizerBuffers::of(spec.owned_size, spec.placement, spec.params, spec.bf16);
    const MemCategory c = MemCategory::optimizer_state;
    m_ = DeviceBuf(t, c, "lamina::exp_avg_" + name, n.device_m);
    v_ = DeviceBuf(t, c, "lamina::exp_avg_sq_" + name, n.device_v);
    if (n.device_master) master_ = DeviceBuf(t, c, "lamina::master_" + name, n.device_master);
  }
  OptimizerPlacement placement() const override { return OptimizerPlacement::device; }
  std::int64_t subgroups() const override { return static_cast<std::int64_t>(spec_.subgroups.size()); }
  void gradients_ready(const float*, CopyStream&) override {}
  void update(std::int64_t g, UpdateSite, const AdamWStep& step, const float* owned_grads, ParamSink& sink) override {
    const Subgroup& sg = spec_.subgroups[static_cast<std::size_t>(g)];
    const DeviceWindow p = master(sink), m{m_.data(), spec_.begin}, v{v_.data(), spec_.begin};
    const DeviceWindow gr{const_cast<float*>(owned_grads), spec_.begin};
    adamw(Exec(), p(sg.begin, sg.end), m(sg.begin, sg.end), v(sg.begin, sg.end), gr(sg.begin, sg.end), sg.begin, step,
          h_, rounded_params(sink, spec_.layer, spec_.begin, sg.begin, sg.end));
  }
  // The updates wrote the stored parameters: fp32 ones in place, bf16 ones rounded.
  void publish(ParamSink&) override {}
  float* state(StateKind kind, bool& on_device) override {
    on_device = true;
    return kind == StateKind::exp_avg ? m_.data() : kind == StateKind::exp_avg_sq ? v_.data() : master_.data();
  }

 private:
  // The master weights: the fp32 parameters themselves, or the owned range beside bf16 ones.
  DeviceWindow master(ParamSink& sink) const {
    return spec_.bf16 ? DeviceWindow{master_.data(), spec_.begin} : DeviceWindow{sink.device_master(spec_.layer), spec_.begin};
  }
  LayerOptimizerSpec spec_;
  Hyper h_;
  DeviceBuf m_, v_, master_;
};

// State in host memory; subgroups at UpdateSite::device (dynamic layers only) are staged
// through the device.
class HostAdamW final : public LayerOptimizer {
 public:
  HostAdamW(MemoryTracker& t, const std::string& name, const LayerOptimizerSpec& spec, const Hyper& h,
            BufferPool<Mem>& dos_pool, std::int64_t dos_stage)
      : spec_(spec), h_(h), dos_pool_(dos_pool), dos_stage_(dos_stage) {
    if (spec_.placement == OptimizerPlacement::host) spec_.sites.assign(spec_.subgroups.size(), UpdateSite::host);
    const OptimizerBuffers n = OptimizerBuffers::of(spec.owned_size, spec.placement, spec.params, spec.bf16);
    const MemTier tier = MemTier::host;
    const MemCategory c = MemCategory::optimizer_state;
    m_ = HostBuf(t, c, "lamina::exp_avg_" + name, n.host_m, tier);
    v_ = HostBuf(t, c, "lamina::exp_avg_sq_" + name, n.host_v, tier);
    grads_ = HostBuf(t, MemCategory::gradients, "lamina::host_grads_" + name, n.host_grads, tier);
    if (n.host_master) master_ = HostBuf(t, c, "lamina::master_" + name, n.host_master, tier);
  }
  OptimizerPlacement placement() const override { return spec_.placement; }
  std::int64_t subgroups() const override { return static_cast<std::int64_t>(spec_.subgroups.size()); }

  void gradients_ready(const float* owned_grads, CopyStream& out) override {
    // Only host subgroups' gradients cross: device ones are updated where they are.
    const DeviceWindow g{const_cast<float*>(owned_grads), spec_.begin};
    const HostWindow h{grads_.data(), spec_.begin};
    for (std::size_t x = 0; x < spec_.subgroups.size(); ++x) {
      if (spec_.sites[x] == UpdateSite::device) continue;
      const Subgroup& sg = spec_.subgroups[x];
      out.copy(h(sg.begin, sg.end), g(sg.begin, sg.end));
    }
  }

  void update(std::int64_t g, UpdateSite site, const AdamWStep& step, const float* owned_grads,
              ParamSink& sink) override {
    const Subgroup& sg = spec_.subgroups[static_cast<std::size_t>(g)];
    const HostWindow p{master(sink), spec_.begin}, m{m_.data(), spec_.begin}, v{v_.data(), spec_.begin};
    if (site == UpdateSite::host) {  // the step waited for its gradients' flush
      const HostWindow gh{grads_.data(), spec_.begin};
      adamw(HostExec(), p(sg.begin, sg.end), m(sg.begin, sg.end), v(sg.begin, sg.end), gh(sg.begin, sg.end), sg.begin,
            step, h_);
      return;
    }
    // Device subgroup: its state in, the device kernel, its state back out; queued on the
    // device, so that they run while the host updates the others.
    const Exec exec;
    if (stage_[0] == nullptr)
      for (auto& b : stage_) b = dos_pool_.acquire(dos_stage_);
    const std::int64_t n = sg.end - sg.begin;
    Kokkos::deep_copy(exec, dev(stage_[0], n), p(sg.begin, sg.end));
    Kokkos::deep_copy(exec, dev(stage_[1], n), m(sg.begin, sg.end));
    Kokkos::deep_copy(exec, dev(stage_[2], n), v(sg.begin, sg.end));
    const DeviceWindow gd{const_cast<float*>(owned_grads), spec_.begin};
    const bool stored_here = spec_.params == MemTier::device;  // else published from the host
    adamw(exec, dev(stage_[0], n), dev(stage_[1], n), dev(stage_[2], n), gd(sg.begin, sg.end), sg.begin, step, h_,
          stored_here ? rounded_params(sink, spec_.layer, spec_.begin, sg.begin, sg.end) : Bf16Vec<Exec>());
    if (stored_here && !spec_.bf16) sink.from_device(spec_.layer, sg.begin, sg.end, stage_[0]);
    Kokkos::deep_copy(exec, p(sg.begin, sg.end), dev(stage_[0], n));
    Kokkos::deep_copy(exec, m(sg.begin, sg.end), dev(stage_[1], n));
    Kokkos::deep_copy(exec, v(sg.begin, sg.end), dev(stage_[2], n));
  }

  void publish(ParamSink& sink) override {
    if (spec_.placement == OptimizerPlacement::host) {
      sink.from_host(spec_.layer, spec_.begin, spec_.end, master(sink));
      return;
    }
    // Device subgroups are back in the host master weights too (the caller waited for them).
    const HostWindow p{master(sink), spec_.begin};
    for (std::size_t x = 0; x < spec_.subgroups.size(); ++x) {
      const Subgroup& sg = spec_.subgroups[x];
      if (spec_.sites[x] == UpdateSite::host || spec_.params != MemTier::device) {
        sink.from_host(spec_.layer, sg.begin, sg.end, p(sg.begin, sg.end).data());
      }
    }
    if (stage_[0] != nullptr)
      for (auto& b : stage_) {
        dos_pool_.release(b, dos_stage_);
        b = nullptr;
      }
  }

  float* state(StateKind kind, bool& on_device) override {
    on_device = false;
    return kind == StateKind::exp_avg ? m_.data() : kind == StateKind::exp_avg_sq ? v_.data() : master_.data();
  }
  std::int64_t staging_bytes() const override {
    const bool any = std::count(spec_.sites.begin(), spec_.sites.end(), UpdateSite::device) > 0;
    return any ? 3 * dos_stage_ * static_cast<std::int64_t>(sizeof(float)) : 0;
  }

 private:
  // Host fp32 parameters are the master weights; otherwise the host keeps the owned range.
  float* master(ParamSink& sink) {
    float* p = sink.host_master(spec_.layer);
    return p != nullptr ? p : master_.data();
  }
  LayerOptimizerSpec spec_;
  Hyper h_;
  BufferPool<Mem>& dos_pool_;
  std::int64_t dos_stage_;
  HostBuf m_, v_, grads_, master_;
  float* stage_[3] = {nullptr, nullptr, nullptr};
};

}  // namespace

OptimizerBuffers OptimizerBuffers::of(std::int64_t owned, OptimizerPlacement placement, MemTier params, bool bf16) {
  OptimizerBuffers b;
  if (placement == OptimizerPlacement::device) {
    b.device_m = b.device_v = owned;
    if (bf16) b.device_master = owned;
  } else {
    b.host_m = b.host_v = b.host_grads = owned;
    if (params == MemTier::device || bf16) b.host_master = owned;
  }
  return b;
}

std::unique_ptr<LayerOptimizer> make_layer_optimizer(MemoryTracker& tracker, const std::string& name,
                                                     const LayerOptimizerSpec& spec, const OptimizerConfig& config,
                                                     BufferPool<Mem>& dos_pool, std::int64_t dos_stage) {
  const Hyper h{static_cast<float>(config.weight_decay), config.decay_biases_and_norms, spec.matrix_numel};
  if (spec.placement == OptimizerPlacement::device) return std::make_unique<DeviceAdamW>(tracker, name, spec, h);
  return std::make_unique<HostAdamW>(tracker, name, spec, h, dos_pool, dos_stage);
}

}  // namespace lamina
