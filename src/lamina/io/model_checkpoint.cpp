#include "lamina/io/model_checkpoint.hpp"

namespace lamina {

namespace {

const char* prefix(CheckpointPart p) {
  switch (p) {
    case CheckpointPart::params: return "model/";
    case CheckpointPart::exp_avg: return "optimizer/exp_avg/";
    case CheckpointPart::exp_avg_sq: return "optimizer/exp_avg_sq/";
  }
  return "?";
}

constexpr CheckpointPart kParts[] = {CheckpointPart::params, CheckpointPart::exp_avg, CheckpointPart::exp_avg_sq};

}  // namespace

void write_model_state(CheckpointWriter& writer, const ParamLayout& layout, ModelStateAccess& state) {
  std::int64_t bytes = 0;
  for (const LayerSpec& spec : layout.layers()) {
    for (const TensorSpec& t : spec.tensors) {
      std::int64_t n = 4 * static_cast<std::int64_t>(std::size(kParts));
      for (const auto c : t.global_shape) n *= c;
      bytes += n;
    }
  }
  writer.reserve(bytes);
  std::vector<float> full;
  for (int l = 0; l < layout.num_layers(); ++l) {
    const bool held = state.holds(l);
    const bool writer_rank = held && state.writes(l);
    const LayerSpec& spec = layout.layers()[static_cast<std::size_t>(l)];
    for (const CheckpointPart part : kParts) {
      const float* data = held ? state.assemble(l, part, full) : nullptr;
      for (const TensorSpec& t : spec.tensors) {
        TensorSlab slab;
        slab.name = prefix(part) + t.name;
        slab.global_shape = t.global_shape;
        slab.local_shape = t.shape;
        slab.data = data == nullptr ? nullptr : const_cast<float*>(data) + t.offset;
        // Tensors every tensor-parallel rank holds whole are written by the first.
        if (writer_rank && (!t.replicated() || state.tp_rank() == 0)) {
          for (const SlabMap& m : t.slabs()) slab.pieces.push_back({m.global_offset, m.count});
        }
        writer.write(slab);
      }
    }
  }
}

void read_model_state(CheckpointReader& reader, const ParamLayout& layout, ModelStateAccess& state) {
  std::vector<float> full;
  for (int l = 0; l < layout.num_layers(); ++l) {
    const bool held = state.holds(l);
    const LayerSpec& spec = layout.layers()[static_cast<std::size_t>(l)];
    for (const CheckpointPart part : kParts) {
      if (held) full.assign(static_cast<std::size_t>(state.padded(l)), 0.0f);
      for (const TensorSpec& t : spec.tensors) {
        TensorSlab slab;
        slab.name = prefix(part) + t.name;
        slab.global_shape = t.global_shape;
        slab.local_shape = t.shape;
        slab.data = held ? full.data() + t.offset : nullptr;
        if (held) {
          for (const SlabMap& m : t.slabs()) slab.pieces.push_back({m.global_offset, m.count});
        }
        reader.read(slab);
      }
      if (held) state.scatter(l, part, full);
    }
  }
}

void read_model_weights(const WeightsSource& source, const ParamLayout& layout, ModelStateAccess& state) {
  std::vector<float> full;
  for (int l = 0; l < layout.num_layers(); ++l) {
    if (!state.holds(l)) continue;
    full.assign(static_cast<std::size_t>(state.padded(l)), 0.0f);
    for (const TensorSpec& t : layout.layers()[static_cast<std::size_t>(l)].tensors) {
      const std::vector<float> global = fetch_tensor(source, t.name, t.global_shape);
      for (std::int64_t e = 0; e < t.numel(); ++e) full[static_cast<std::size_t>(t.offset + e)] = global[static_cast<std::size_t>(t.global_index(e))];
    }
    state.scatter(l, CheckpointPart::params, full);
  }
}

}  // namespace lamina
