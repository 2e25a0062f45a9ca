#include "lamina/parallel/rank_state.hpp"

#include <algorithm>

#include "lamina/core/tier_views.hpp"
#include "lamina/kernels/bf16.hpp"
#include "lamina/model/init.hpp"

namespace lamina {

namespace {

StateKind kind_of(CheckpointPart p) {
  return p == CheckpointPart::exp_avg ? StateKind::exp_avg : p == CheckpointPart::exp_avg_sq ? StateKind::exp_avg_sq
                                                                                             : StateKind::master;
}

}  // namespace

RankState::RankState(const ModelConfig& model, const ParamLayout& layout, const ProcessGrid& grid, int zero,
                     Precision precision, std::unique_ptr<ParameterStore> store,
                     std::unique_ptr<GradientReducer> reducer,
                     std::map<int, std::unique_ptr<LayerOptimizer>> optimizers, DevicePools& pools,
                     StageStreams& streams)
    : model_(model),
      layout_(layout),
      grid_(grid),
      zero_(zero),
      bf16_(precision == Precision::bf16),
      store_(std::move(store)),
      reducer_(std::move(reducer)),
      optimizers_(std::move(optimizers)),
      pools_(pools),
      streams_(streams) {}

LayerParams RankState::widened(int layer, const Vec<Exec>& vectors) const {
  LayerParams p = store_->params(layer);
  if (p.b16 != nullptr) {
    const LayerSpec& l = layout_.layers()[static_cast<std::size_t>(layer)];
    const std::int64_t n = l.numel - l.matrix_numel;
    from_bf16(Exec(), as_vec<Exec>(vectors.data(), n),
              Bf16Vec<Exec>(const_cast<std::uint16_t*>(p.b16) + l.matrix_numel, static_cast<std::size_t>(n)));
    p.vectors = vectors.data();
  }
  return p;
}

bool RankState::writes(int layer) const { return grid_.data_rank() == 0 && (layer != 0 || grid_.first_stage()); }

void RankState::init(std::uint64_t seed) {
  std::vector<float> full;
  for (const auto& [l, opt] : optimizers_) {
    full.assign(static_cast<std::size_t>(padded(l)), 0.0f);
    initial_values(layout_, model_, seed, l, 0, layout_.layers()[static_cast<std::size_t>(l)].numel, full.data());
    scatter(l, CheckpointPart::params, full);
  }
  Exec().fence();
}

void RankState::set_params(int layer, const std::vector<float>& values) {
  std::vector<float> full(values);
  full.resize(static_cast<std::size_t>(padded(layer)), 0.0f);
  scatter(layer, CheckpointPart::params, full);
}

std::vector<float> RankState::params_host(int layer) const {
  std::vector<float> out;
  store_->read_stored(layer, out);
  out.resize(static_cast<std::size_t>(store_->shard(layer).numel));
  return out;
}

const float* RankState::assemble(int layer, CheckpointPart part, std::vector<float>& out) {
  const LayerShard& sh = store_->shard(layer);
  const Exec exec;
  out.assign(static_cast<std::size_t>(sh.padded), 0.0f);
  // The stored part: fp32 parameters (whole or shard), or the master weights (under bf16)
  // and moments of the owned range.
  const bool params = part == CheckpointPart::params && !bf16_;
  bool on_device = false;
  const float* data =
      params ? store_->stored_fp32(layer, on_device) : optimizer(layer).state(kind_of(part), on_device);
  const bool sharded = params ? zero_ == 3 : zero_ >= 1;
  const std::int64_t n = sharded ? sh.shard : sh.padded;
  float* src = const_cast<float*>(data);
  if (!sharded) {  // whole already: straight to the host
    if (on_device) {
      Kokkos::deep_copy(host(out.data(), n), dev(src, n));
    } else {
      std::copy(data, data + n, out.begin());
    }
    return out.data();
  }
  // A shard: all-gathered over the data-parallel group on the device.
  float* mine = pools_.staging.acquire(sh.shard);
  float* all = pools_.staging.acquire(sh.padded);
  if (on_device) {
    Kokkos::deep_copy(exec, dev(mine, n), dev(src, n));
  } else {
    Kokkos::deep_copy(exec, dev(mine, n), host(src, n));
  }
  exec.fence();
  grid_.data().all_gather(mine, all, sh.shard);
  Kokkos::deep_copy(host(out.data(), sh.padded), dev(all, sh.padded));
  pools_.staging.release(all, sh.padded);
  pools_.staging.release(mine, sh.shard);
  return out.data();
}

void RankState::scatter(int layer, CheckpointPart part, const std::vector<float>& full) {
  const LayerShard& sh = store_->shard(layer);
  const Exec exec;
  float* f = const_cast<float*>(full.data());
  const std::int64_t ob = sh.owned_begin(grid_.data_rank(), zero_), on = sh.owned_size(zero_);
  if (part == CheckpointPart::params) store_->write_stored(layer, full);
  // The optimizer's own copy of the owned range: moments, and master weights where they
  // are not the stored parameters themselves.
  bool on_device = false;
  float* dst = optimizer(layer).state(kind_of(part), on_device);
  if (dst != nullptr) {
    if (on_device) {
      Kokkos::deep_copy(exec, dev(dst, on), host(f + ob, on));
    } else {
      std::copy(f + ob, f + ob + on, dst);
    }
  }
  exec.fence();
}

}  // namespace lamina
