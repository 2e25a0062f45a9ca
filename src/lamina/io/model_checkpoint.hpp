#pragma once
// Reading and writing a model's state (parameters and both Adam moments) in checkpoints,
// driven by the parameter layout: every tensor of every layer in its global shape, each
// rank writing (reading) the pieces of the layers it holds. How a rank assembles a layer's
// whole contents from shards and tiers, or scatters them back, is the ModelStateAccess it
// passes (parallel/rank_state.hpp).
#include <cstdint>
#include <vector>

#include "lamina/io/checkpoint.hpp"
#include "lamina/io/model_weights.hpp"
#include "lamina/model/param_layout.hpp"

namespace lamina {

enum class CheckpointPart { params, exp_avg, exp_avg_sq };

class ModelStateAccess {
 public:
  virtual ~ModelStateAccess() = default;
  virtual bool holds(int layer) const = 0;
  // This rank writes the layer's pieces (one writer per piece of the global tensors).
  virtual bool writes(int layer) const = 0;
  virtual int tp_rank() const = 0;
  // Elements of the layer's (padded) flat buffer.
  virtual std::int64_t padded(int layer) const = 0;
  // The layer's whole contents (this tensor-parallel rank's shapes) on the host.
  // Collective over the data-parallel group.
  virtual const float* assemble(int layer, CheckpointPart part, std::vector<float>& out) = 0;
  virtual void scatter(int layer, CheckpointPart part, const std::vector<float>& full) = 0;
};

// Collective over the checkpoint's communicator: every rank walks every tensor.
void write_model_state(CheckpointWriter& writer, const ParamLayout& layout, ModelStateAccess& state);
void read_model_state(CheckpointReader& reader, const ParamLayout& layout, ModelStateAccess& state);

// Parameters only, from a weights file (model.init); the optimizer state is left as it is.
// Every rank reads what it holds; collective over the data-parallel group, like scatter.
void read_model_weights(const WeightsSource& source, const ParamLayout& layout, ModelStateAccess& state);

}  // namespace lamina
