#pragma once
// The optimizer of one layer on one rank, as the executor drives it: AdamW over the
// elements the rank owns, cut into subgroups, with its state wherever the plan put it
// (memory/optimizer_updaters.hpp: device, host, Deep Optimizer States). The parameter
// store receives what it updates through ParamSink. Both are interfaces so that the
// parallel runtime and the memory tiers need not know each other.
#include <cstdint>
#include <vector>

#include "lamina/core/copy_stream.hpp"
#include "lamina/optim/adamw.hpp"
#include "lamina/optim/placement.hpp"

namespace lamina {

// Where updated fp32 values go: the layer's stored parameters (implemented by the
// parameter store). Ranges are layer elements [begin, end).
class ParamSink {
 public:
  virtual ~ParamSink() = default;
  // values: device memory / host memory holding elements [begin, end). from_device: fp32
  // parameters stored on the device (bf16 ones are written by the update: device_rounded).
  virtual void from_device(int layer, std::int64_t begin, std::int64_t end, float* values) = 0;
  virtual void from_host(int layer, std::int64_t begin, std::int64_t end, float* values) = 0;
  // fp32 parameters are their own master weights: the owned range's first element in the
  // device tier / host tier, or null where the parameters live in the other tier or in bf16.
  virtual float* device_master(int layer) = 0;
  virtual float* host_master(int layer) = 0;
  // bf16 parameters stored on the device: the owned range's first element, which an update on
  // the device writes as it computes the new values (rounded); null otherwise.
  virtual std::uint16_t* device_rounded(int layer) = 0;
};

// Which part of the optimizer state (checkpoints read and write them by name).
enum class StateKind { master, exp_avg, exp_avg_sq };

class LayerOptimizer {
 public:
  virtual ~LayerOptimizer() = default;
  virtual OptimizerPlacement placement() const = 0;
  // Subgroups of the owned elements, in update order (empty: this rank owns none).
  virtual std::int64_t subgroups() const = 0;
  // The layer's reduced gradients are final (owned_grads: device memory, the first owned
  // element): those updated on the host start their way there, queued on `out` (the caller
  // waits for it before the update).
  virtual void gradients_ready(const float* owned_grads, CopyStream& out) = 0;
  // AdamW on subgroup g at `site` (device-resident state: always the device).
  virtual void update(std::int64_t g, UpdateSite site, const AdamWStep& step, const float* owned_grads,
                      ParamSink& sink) = 0;
  // The layer's updated values into the stored parameters, once every subgroup is done (the
  // caller has waited for the device subgroups' updates). Not for state on the device, whose
  // updates write the stored parameters themselves (update_program lists no publish for it).
  virtual void publish(ParamSink& sink) = 0;
  // The owned elements of a part of the state: in device memory (on_device) or host memory.
  // Null for the master weights where the parameters themselves are (fp32 on the device).
  virtual float* state(StateKind kind, bool& on_device) = 0;
  // Bytes of device memory the update of this layer stages (Deep Optimizer States).
  virtual std::int64_t staging_bytes() const { return 0; }
};

}  // namespace lamina
