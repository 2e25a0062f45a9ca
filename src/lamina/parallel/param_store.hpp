#pragma once
// The parameters one rank stores, layer by layer: the whole layer (below ZeRO-3) or its
// data-parallel shard (ZeRO-3), in the device tier or the host tier (ZeRO-Infinity's
// parameter offload), in fp32 or bf16. Compute reads the parameters on the device as they
// are stored (kernels widen bf16 where they must): whole layers in the device tier
// (resident) directly, the others through hold() ... release(): the first hold starts
// all-gathering the shards (a non-blocking collective on the data-parallel group's fetch
// communicator) and/or copying them in from the host tier (on the fetch stream) into a
// pooled buffer of the storage's format, and returns when that is queued, with its
// Completion for whoever needs the parameters. Updated values published from the host go
// to the device on the rank's host-to-device stream.
// The optimizer writes updated values back through the ParamSink interface, and ZeRO-1/2
// ranks share their updated shards with share().
#include <Kokkos_Core.hpp>
#include <cstdint>
#include <map>
#include <vector>

#include "lamina/core/buffer.hpp"
#include "lamina/core/buffer_pool.hpp"
#include "lamina/core/kokkos_compat.hpp"
#include "lamina/core/precision.hpp"
#include "lamina/model/gpt_tensors.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/optim/layer_optimizer.hpp"
#include "lamina/parallel/completion.hpp"
#include "lamina/parallel/layout.hpp"
#include "lamina/parallel/process_grid.hpp"
#include "lamina/parallel/shard.hpp"
#include "lamina/parallel/stage_streams.hpp"

namespace lamina {

using DeviceExec = Kokkos::DefaultExecutionSpace;
using DeviceMem = DeviceExec::memory_space;

// Transient device buffers shared by the parts of a rank's state (one pool per kind, as
// the memory estimate counts them): gathered parameters (fp32 and bf16), full-size
// gradients before their reduce-scatter, communication staging (fp32 and bf16), Deep
// Optimizer States staging.
struct DevicePools {
  explicit DevicePools(MemoryTracker& tracker)
      : params(tracker, MemCategory::parameters, "lamina::gathered_params"),
        grads(tracker, MemCategory::gradients, "lamina::full_grads"),
        staging(tracker, MemCategory::communication, "lamina::comm_staging"),
        params16(tracker, MemCategory::parameters, "lamina::gathered_params_bf16"),
        staging16(tracker, MemCategory::communication, "lamina::comm_staging_bf16"),
        dos(tracker, MemCategory::optimizer_state, "lamina::dos_staging") {}
  BufferPool<DeviceMem> params, grads, staging;
  BufferPool<DeviceMem, std::uint16_t> params16, staging16;
  BufferPool<DeviceMem> dos;
};

// Elements of each stored buffer of a layer; the store allocates these and the memory
// estimate counts them.
struct StoredParams {
  std::int64_t device_fp32 = 0, device_bf16 = 0, host_fp32 = 0, host_bf16 = 0;
  std::int64_t host_rounded = 0;  // bf16 of host-updated master weights on their way to the device
  static StoredParams of(const LayerShard& s, const LayerPolicy& p, int zero, Precision precision);
};

class ParameterStore : public ParamSink {
 public:
  using Exec = DeviceExec;
  using Mem = DeviceMem;
  using HostExec = Kokkos::DefaultHostExecutionSpace;

  // held: the layers this rank's pipeline stage holds; blocks: the plan's policies.
  ParameterStore(MemoryTracker& tracker, const ParamLayout& layout, const ProcessGrid& grid,
                 const std::vector<int>& held, const std::vector<LayerPolicy>& blocks, int zero, Precision precision,
                 DevicePools& pools, StageStreams& streams);
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;

  bool holds(int layer) const { return slots_.count(layer) != 0; }
  const LayerShard& shard(int layer) const { return slot(layer).shard; }
  // The whole layer on the device between uses: hold() and release() do nothing.
  bool resident(int layer) const;

  // Parameters of a layer on the device: always there for resident layers, else from the
  // completion of the first hold() to the last release(). Both count holds, so nested ones
  // are fine; only the first fetches (and returns a non-empty completion). The caller of
  // release() has waited for the compute that read the parameters.
  Completion hold(int layer);
  void release(int layer);
  // fp32 or bf16 (the other null); a bf16 layer's vectors are the caller's to widen.
  LayerParams params(int layer) const;

  // ParamSink: updated values into the stored parameters.
  void from_device(int layer, std::int64_t begin, std::int64_t end, float* values) override;
  std::uint16_t* device_rounded(int layer) override;
  void from_host(int layer, std::int64_t begin, std::int64_t end, float* values) override;
  float* device_master(int layer) override;
  float* host_master(int layer) override;
  // ZeRO-1/2: every rank updated its shard of the replicated parameters; all-gather them
  // (blocking: the host waits for it).
  void share(int layer);

  // The stored parameters as fp32 (bf16 widened): the whole layer, or the shard (ZeRO-3).
  void read_stored(int layer, std::vector<float>& out) const;
  // Sets the stored parameters from the whole layer's values (rounded to bf16 where stored so).
  void write_stored(int layer, const std::vector<float>& full);
  // fp32 stored parameters, whole or shard, and whether they are in device memory (null under bf16).
  const float* stored_fp32(int layer, bool& on_device) const;

 private:
  using DeviceBuf = Buffer<float, Mem>;
  using HostBuf = Buffer<float, HostTierSpace>;
  using DeviceBuf16 = Buffer<std::uint16_t, Mem>;
  using HostBuf16 = Buffer<std::uint16_t, HostTierSpace>;
  struct Slot {
    LayerShard shard;
    MemTier tier = MemTier::device;
    std::int64_t owned_begin = 0;
    DeviceBuf params;
    HostBuf params_host;
    DeviceBuf16 params16;
    HostBuf16 params16_host, rounded_host;
    float* gathered = nullptr;  // device parameters while held (when not resident)
    std::uint16_t* gathered16 = nullptr;  // ... in bf16
    int holds = 0;
  };
  Slot& slot(int layer) { return slots_.at(layer); }
  const Slot& slot(int layer) const { return slots_.at(layer); }
  std::int64_t stored_begin(const Slot& s) const { return s.shard.stored_begin(grid_.data_rank(), zero_); }
  Completion fetch(Slot& s);
  Completion fetch_bf16(Slot& s);

  const ProcessGrid& grid_;
  int zero_;
  bool bf16_;
  std::map<int, Slot> slots_;
  DevicePools& pools_;
  StageStreams& streams_;
};

}  // namespace lamina
