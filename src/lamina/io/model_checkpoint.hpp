#pragma once
// Reading and writing a model's state (parameters and both Adam moments) in checkpoints,
// driven by the parameter layout: every tensor of every layer in its global shape, each
// rank writing (reading) the pieces of the layers it holds. How a rank assembles a layer's
// whole contents from shards and tiers, or scatters them back, is the ModelStateAccess it
// passes (parallel/rank_state.hpp).
#include <cstdint>
#include <string>
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
  // Elements of the layer's (padded) flat buffer.
  virtual std::int64_t padded(int layer) const = 0;
  // The layer's whole contents (this tensor-parallel rank's shapes) on the host.
  // Collective over the data-parallel group.
  virtual const float* assemble(int layer, CheckpointPart part, std::vector<float>& out) = 0;
  virtual void scatter(int layer, CheckpointPart part, const std::vector<float>& full) = 0;
};

// Collective over the checkpoint's communicator: every rank walks every tensor.
void write_model_state(CheckpointWriter& writer, const ParamLayout& layout, ModelStateAccess& state);

// Bytes of the whole model state in a checkpoint (parameters and both moments, global shapes).
std::int64_t model_state_bytes(const ParamLayout& layout);

// The layers this rank writes, copied into host memory at a step boundary, so that a
// background thread can write them (write()) while training changes the state. Taking it
// is collective over the data-parallel group, like write_model_state, and reuses the
// buffers of the previous one; writing it is collective over the checkpoint's
// communicator and touches nothing of the run.
class ModelStateSnapshot {
 public:
  // Allocates (and touches) the buffers take() fills, so that the first checkpoint does
  // not pay for the pages; bytes() is then what they hold.
  void reserve(const ParamLayout& layout, const ModelStateAccess& state);
  void take(const ParamLayout& layout, ModelStateAccess& state);
  void write(CheckpointWriter& writer) const;  // what write_model_state writes
  std::int64_t bytes() const { return bytes_; }  // host memory it holds
  // The first tensor it holds with a NaN or an infinity, "" if none.
  const std::string& first_nonfinite() const { return nonfinite_; }
  // What a snapshot of `state` holds, without taking one.
  static std::int64_t bytes_of(const ParamLayout& layout, const ModelStateAccess& state);

 private:
  std::int64_t total_bytes_ = 0;  // the whole checkpoint's, for reserve()
  std::int64_t bytes_ = 0;
  std::vector<TensorSlab> slabs_;  // every tensor in order, into layers_
  std::vector<std::vector<float>> layers_;  // by layer and part: the layers this rank writes
  std::vector<float> scratch_;               // a layer this rank only helps assemble
  std::string nonfinite_;
};

void read_model_state(CheckpointReader& reader, const ParamLayout& layout, ModelStateAccess& state);

// Parameters only, from a weights file (model.init); the optimizer state is left as it is.
// Every rank reads what it holds; collective over the data-parallel group, like scatter.
void read_model_weights(const WeightsSource& source, const ParamLayout& layout, ModelStateAccess& state);

}  // namespace lamina
