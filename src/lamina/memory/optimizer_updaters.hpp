#pragma once
// The three places a layer's AdamW state can live, chosen once per layer from the plan:
//   device   fp32 master weights (the parameters themselves in fp32, a separate copy
//            beside bf16 parameters), m and v in device memory; updated by the device kernel
//   host     the same state in host memory plus a host copy of the owned gradients, which
//            leave the device as soon as the layer's reduction is final; the same AdamW
//            kernel runs on the host execution space (ZeRO-Offload, Ren et al. 2021)
//   dynamic  host-resident like `host`, but the subgroups the Deep Optimizer States
//            schedule (dos_scheduler.hpp) sends to the device are copied in, updated by the
//            device kernel and copied back, while the host updates the others (Maurya et
//            al. 2024); their gradients never leave the device.
// Every placement runs the same kernel in the same order on the same values: results are
// bitwise identical whichever is chosen.
#include <cstdint>
#include <memory>
#include <vector>

#include "lamina/core/buffer.hpp"
#include "lamina/core/buffer_pool.hpp"
#include "lamina/core/config.hpp"
#include "lamina/core/kokkos_compat.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/optim/layer_optimizer.hpp"

namespace lamina {

// One layer's optimizer on one rank.
struct LayerOptimizerSpec {
  int layer = 0;
  std::int64_t matrix_numel = 0;   // layer elements below it are matrices (always decayed)
  std::int64_t begin = 0, end = 0;  // the owned elements
  std::int64_t owned_size = 0;      // elements of the owned buffers (padded)
  std::vector<Subgroup> subgroups;  // the owned elements cut at parameter boundaries
  OptimizerPlacement placement = OptimizerPlacement::device;
  MemTier params = MemTier::device;  // where the layer's parameters are stored
  bool bf16 = false;
  std::vector<UpdateSite> sites;  // dynamic: one per subgroup (the Deep Optimizer States schedule)
};

// Elements of each optimizer-state buffer of a layer; the updaters allocate these and the
// memory estimate counts them.
struct OptimizerBuffers {
  std::int64_t device_m = 0, device_v = 0, device_master = 0;
  std::int64_t host_m = 0, host_v = 0, host_master = 0, host_grads = 0;
  static OptimizerBuffers of(std::int64_t owned_size, OptimizerPlacement placement, MemTier params, bool bf16);
};

// dos_pool and dos_stage: the device staging of Deep Optimizer States (three buffers of
// dos_stage elements while a dynamic layer updates device subgroups; one size for all
// layers, so that the pool keeps a single set).
std::unique_ptr<LayerOptimizer> make_layer_optimizer(MemoryTracker& tracker, const std::string& name,
                                                     const LayerOptimizerSpec& spec, const OptimizerConfig& config,
                                                     BufferPool<Kokkos::DefaultExecutionSpace::memory_space>& dos_pool,
                                                     std::int64_t dos_stage);

}  // namespace lamina
