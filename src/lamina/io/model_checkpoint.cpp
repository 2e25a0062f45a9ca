#include "lamina/io/model_checkpoint.hpp"

#include <algorithm>
#include <cmath>

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

std::int64_t model_state_bytes(const ParamLayout& layout) {
  std::int64_t bytes = 0;
  for (const LayerSpec& spec : layout.layers()) {
    for (const TensorSpec& t : spec.tensors) {
      std::int64_t n = 4 * static_cast<std::int64_t>(std::size(kParts));
      for (const auto c : t.global_shape) n *= c;
      bytes += n;
    }
  }
  return bytes;
}

namespace {

// Every tensor of the model state in the checkpoint's order, as this rank sees it: `visit`
// gets each one's slab, with pieces where this rank writes them. Collective over the
// data-parallel group (assemble).
template <class Visit>
void walk_model_state(const ParamLayout& layout, ModelStateAccess& state, Visit&& visit) {
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
        visit(slab);
      }
    }
  }
}

}  // namespace

void write_model_state(CheckpointWriter& writer, const ParamLayout& layout, ModelStateAccess& state) {
  writer.reserve(model_state_bytes(layout));
  walk_model_state(layout, state, [&](const TensorSlab& slab) { writer.write(slab); });
}

ModelStateSnapshot::ModelStateSnapshot(const ParamLayout& layout, ModelStateAccess& state)
    : total_bytes_(model_state_bytes(layout)) {
  walk_model_state(layout, state, [&](TensorSlab slab) {
    if (!slab.pieces.empty()) {
      std::int64_t n = 1;
      for (const auto c : slab.local_shape) n *= c;
      std::vector<float>& copy = data_.emplace_back(slab.data, slab.data + n);
      if (nonfinite_.empty() && !std::all_of(copy.begin(), copy.end(), [](float v) { return std::isfinite(v); })) {
        nonfinite_ = slab.name;
      }
      bytes_ += 4 * n;
    }
    slab.data = nullptr;  // set by write(): data_ may still move
    slabs_.push_back(std::move(slab));
  });
}

std::int64_t ModelStateSnapshot::bytes_of(const ParamLayout& layout, const ModelStateAccess& state) {
  std::int64_t bytes = 0;
  for (int l = 0; l < layout.num_layers(); ++l) {
    if (!state.holds(l) || !state.writes(l)) continue;
    for (const TensorSpec& t : layout.layers()[static_cast<std::size_t>(l)].tensors) {
      if (!t.replicated() || state.tp_rank() == 0) bytes += 4 * static_cast<std::int64_t>(std::size(kParts)) * t.numel();
    }
  }
  return bytes;
}

void ModelStateSnapshot::write(CheckpointWriter& writer) const {
  writer.reserve(total_bytes_);
  std::size_t copy = 0;
  for (TensorSlab slab : slabs_) {
    if (!slab.pieces.empty()) slab.data = const_cast<float*>(data_[copy++].data());
    writer.write(slab);
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
