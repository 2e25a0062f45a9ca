#include "lamina/parallel/param_store.hpp"

#include <algorithm>

#include "lamina/kernels/bf16.hpp"
#include "lamina/core/tier_views.hpp"

namespace lamina {

namespace {

using Exec = ParameterStore::Exec;
using HostExec = ParameterStore::HostExec;

// An all-gather moves bytes without arithmetic, so bf16 pairs travel as float words
// (bf16 shards have an even length).
Request all_gather_bf16(Communicator& c, const std::uint16_t* send, std::uint16_t* recv, std::int64_t count) {
  return c.iall_gather(reinterpret_cast<const float*>(send), reinterpret_cast<float*>(recv), count / 2);
}

}  // namespace

StoredParams StoredParams::of(const LayerShard& s, const LayerPolicy& p, int zero, Precision precision) {
  StoredParams out;
  const bool bf16 = precision == Precision::bf16;
  const std::int64_t stored = s.stored_size(zero);
  if (p.params == MemTier::device) {
    (bf16 ? out.device_bf16 : out.device_fp32) = stored;
  } else {
    (bf16 ? out.host_bf16 : out.host_fp32) = stored;
  }
  if (p.optimizer != OptimizerPlacement::device && p.params == MemTier::device && bf16) {
    out.host_rounded = s.owned_size(zero);
  }
  return out;
}

ParameterStore::ParameterStore(MemoryTracker& tracker, const ParamLayout& layout, const ProcessGrid& grid,
                               const std::vector<int>& held, const std::vector<LayerPolicy>& blocks, int zero,
                               Precision precision, DevicePools& pools, StageStreams& streams)
    : grid_(grid), zero_(zero), bf16_(precision == Precision::bf16), pools_(pools), streams_(streams) {
  for (int l : held) {
    const LayerSpec& spec = layout.layers()[static_cast<std::size_t>(l)];
    const LayerPolicy& policy = policy_of_layer(blocks, l);
    Slot s;
    s.shard = LayerShard::of(spec.numel, grid.data_size(), bf16_);
    s.tier = policy.params;
    s.owned_begin = s.shard.owned_begin(grid.data_rank(), zero);
    const StoredParams n = StoredParams::of(s.shard, policy, zero, precision);
    const std::string& name = spec.name;
    const MemTier h = MemTier::host;
    const MemCategory c = MemCategory::parameters;
    if (n.device_fp32) s.params = DeviceBuf(tracker, c, "lamina::params_" + name, n.device_fp32);
    if (n.device_bf16) s.params16 = DeviceBuf16(tracker, c, "lamina::params_bf16_" + name, n.device_bf16);
    if (n.host_fp32) s.params_host = HostBuf(tracker, c, "lamina::params_" + name, n.host_fp32, h);
    if (n.host_bf16) s.params16_host = HostBuf16(tracker, c, "lamina::params_bf16_" + name, n.host_bf16, h);
    if (n.host_rounded) s.rounded_host = HostBuf16(tracker, c, "lamina::params_bf16_out_" + name, n.host_rounded, h);
    slots_.emplace(l, std::move(s));
  }
}

bool ParameterStore::resident(int layer) const { return slot(layer).tier == MemTier::device && zero_ < 3; }

Completion ParameterStore::hold(int layer) {
  Slot& s = slot(layer);
  if (resident(layer) || s.holds++ > 0) return Completion();
  return fetch(s);
}

Completion ParameterStore::fetch(Slot& s) {
  if (bf16_) return fetch_bf16(s);
  const LayerShard& sh = s.shard;
  s.gathered = pools_.params.acquire(sh.padded);
  Completion done;
  CopyStream& in = streams_.fetch;
  if (s.tier == MemTier::device) {  // ZeRO-3: from the data-parallel peers
    done.add(grid_.data_fetch().iall_gather(s.params.data(), s.gathered, sh.shard));
  } else if (zero_ < 3) {  // host tier: copied in on the fetch stream
    in.copy(dev(s.gathered, sh.padded), host(s.params_host.data(), sh.padded));
    done.add(in.mark());
  } else {  // both: the owned shard in, then the all-gather
    float* mine = pools_.staging.acquire(sh.shard);
    in.copy(dev(mine, sh.shard), host(s.params_host.data(), sh.shard));
    in.wait();  // the network reads it
    done.add(grid_.data_fetch().iall_gather(mine, s.gathered, sh.shard));
    done.then([this, mine, n = sh.shard] { pools_.staging.release(mine, n); });
  }
  return done;
}

Completion ParameterStore::fetch_bf16(Slot& s) {
  const LayerShard& sh = s.shard;
  s.gathered16 = pools_.params16.acquire(sh.padded);
  Completion done;
  CopyStream& in = streams_.fetch;
  if (zero_ < 3) {  // host tier: copied in on the fetch stream
    in.copy(dev(s.gathered16, sh.padded), host(s.params16_host.data(), sh.padded));
    done.add(in.mark());
    return done;
  }
  // ZeRO-3: the bf16 shards are all-gathered (half the bytes of fp32).
  if (s.tier == MemTier::device) {
    done.add(all_gather_bf16(grid_.data_fetch(), s.params16.data(), s.gathered16, sh.shard));
    return done;
  }
  std::uint16_t* mine = pools_.staging16.acquire(sh.shard);
  in.copy(dev(mine, sh.shard), host(s.params16_host.data(), sh.shard));
  in.wait();  // the network reads it
  done.add(all_gather_bf16(grid_.data_fetch(), mine, s.gathered16, sh.shard));
  done.then([this, mine, n = sh.shard] { pools_.staging16.release(mine, n); });
  return done;
}

void ParameterStore::release(int layer) {
  Slot& s = slot(layer);
  if (resident(layer) || --s.holds > 0) return;
  if (bf16_) {
    pools_.params16.release(s.gathered16, s.shard.padded);
  } else {
    pools_.params.release(s.gathered, s.shard.padded);
  }
  s.gathered = nullptr;
  s.gathered16 = nullptr;
}

LayerParams ParameterStore::params(int layer) const {
  const Slot& s = slot(layer);
  LayerParams p;
  if (bf16_) {
    p.b16 = resident(layer) ? s.params16.data() : s.gathered16;
  } else {
    p.f32 = resident(layer) ? s.params.data() : s.gathered;
  }
  return p;
}

float* ParameterStore::device_master(int layer) {
  Slot& s = slot(layer);
  if (s.tier != MemTier::device || bf16_) return nullptr;
  return s.params.data() + (s.owned_begin - stored_begin(s));
}

float* ParameterStore::host_master(int layer) {
  Slot& s = slot(layer);
  if (s.tier != MemTier::host || bf16_) return nullptr;
  return s.params_host.data() + (zero_ < 3 ? s.owned_begin : 0);
}

std::uint16_t* ParameterStore::device_rounded(int layer) {
  Slot& s = slot(layer);
  if (s.tier != MemTier::device || !bf16_) return nullptr;
  return s.params16.data() + (s.owned_begin - stored_begin(s));
}

void ParameterStore::from_device(int layer, std::int64_t begin, std::int64_t end, float* values) {
  Slot& s = slot(layer);
  if (bf16_) throw std::logic_error("ParameterStore::from_device: bf16 parameters are written by their update");
  const std::int64_t n = end - begin;
  float* p = s.params.data() + (begin - stored_begin(s));
  if (p != values) Kokkos::deep_copy(Exec(), dev(p, n), dev(values, n));
}

void ParameterStore::from_host(int layer, std::int64_t begin, std::int64_t end, float* values) {
  Slot& s = slot(layer);
  const HostExec hexec;
  const std::int64_t n = end - begin;
  const std::int64_t at = begin - stored_begin(s);
  if (!bf16_) {
    if (s.tier == MemTier::device) streams_.h2d.copy(dev(s.params.data() + at, n), host(values, n));
    return;  // host fp32 parameters are the master weights
  }
  // Rounded on the host, so that half the bytes cross to the device.
  std::uint16_t* out =
      s.tier == MemTier::host ? s.params16_host.data() + at : s.rounded_host.data() + (begin - s.owned_begin);
  to_bf16(hexec, Bf16Vec<HostExec>(host(out, n)), ConstVec<HostExec>(host(values, n)));
  hexec.fence();
  if (s.tier == MemTier::device) streams_.h2d.copy(dev(s.params16.data() + at, n), host(out, n));
}

void ParameterStore::share(int layer) {
  // The copies around the all-gather run on the fetch stream and the host waits for them:
  // nothing else queued on the device is waited for.
  Slot& s = slot(layer);
  const LayerShard& sh = s.shard;
  CopyStream& on = streams_.fetch;
  if (bf16_) {
    std::uint16_t* mine = pools_.staging16.acquire(sh.shard);
    if (s.tier == MemTier::device) {
      on.copy(dev(mine, sh.shard), dev(s.params16.data() + s.owned_begin, sh.shard));
      on.wait();
      all_gather_bf16(grid_.data(), mine, s.params16.data(), sh.shard).wait();
    } else {
      std::uint16_t* full = pools_.staging16.acquire(sh.padded);
      on.copy(dev(mine, sh.shard), host(s.params16_host.data() + s.owned_begin, sh.shard));
      on.wait();
      all_gather_bf16(grid_.data(), mine, full, sh.shard).wait();
      on.copy(host(s.params16_host.data(), sh.padded), dev(full, sh.padded));
      on.wait();
      pools_.staging16.release(full, sh.padded);
    }
    pools_.staging16.release(mine, sh.shard);
    return;
  }
  float* mine = pools_.staging.acquire(sh.shard);
  if (s.tier == MemTier::device) {
    on.copy(dev(mine, sh.shard), dev(s.params.data() + s.owned_begin, sh.shard));
    on.wait();
    grid_.data().all_gather(mine, s.params.data(), sh.shard);
  } else {
    float* full = pools_.staging.acquire(sh.padded);
    on.copy(dev(mine, sh.shard), host(s.params_host.data() + s.owned_begin, sh.shard));
    on.wait();
    grid_.data().all_gather(mine, full, sh.shard);
    on.copy(host(s.params_host.data(), sh.padded), dev(full, sh.padded));
    on.wait();
    pools_.staging.release(full, sh.padded);
  }
  pools_.staging.release(mine, sh.shard);
}

const float* ParameterStore::stored_fp32(int layer, bool& on_device) const {
  const Slot& s = slot(layer);
  on_device = s.tier == MemTier::device;
  if (bf16_) return nullptr;
  return on_device ? s.params.data() : s.params_host.data();
}

void ParameterStore::read_stored(int layer, std::vector<float>& out) const {
  const Slot& s = slot(layer);
  const std::int64_t n = s.shard.stored_size(zero_);
  out.assign(static_cast<std::size_t>(n), 0.0f);
  if (bf16_) {
    std::vector<std::uint16_t> b(out.size());
    if (s.tier == MemTier::host) {
      std::copy(s.params16_host.data(), s.params16_host.data() + n, b.begin());
    } else {
      Kokkos::deep_copy(host(b.data(), n), dev(const_cast<std::uint16_t*>(s.params16.data()), n));
    }
    std::transform(b.begin(), b.end(), out.begin(), [](std::uint16_t x) { return from_bf16(x); });
  } else if (s.tier == MemTier::host) {
    std::copy(s.params_host.data(), s.params_host.data() + n, out.begin());
  } else {
    Kokkos::deep_copy(host(out.data(), n), dev(s.params.data(), n));
  }
}

void ParameterStore::write_stored(int layer, const std::vector<float>& full) {
  Slot& s = slot(layer);
  const Exec exec;
  float* f = const_cast<float*>(full.data());
  const std::int64_t from = stored_begin(s), n = s.shard.stored_size(zero_);
  if (bf16_) {
    std::vector<std::uint16_t> b(static_cast<std::size_t>(n));
    std::transform(f + from, f + from + n, b.begin(), [](float x) { return to_bf16(x); });
    if (s.tier == MemTier::device) {
      Kokkos::deep_copy(exec, dev(s.params16.data(), n), host(b.data(), n));
    } else {
      std::copy(b.begin(), b.end(), s.params16_host.data());
    }
  } else if (s.tier == MemTier::device) {
    Kokkos::deep_copy(exec, dev(s.params.data(), n), host(f + from, n));
  } else {
    std::copy(f + from, f + from + n, s.params_host.data());
  }
  exec.fence();
}

}  // namespace lamina
