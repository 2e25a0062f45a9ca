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
// gets each one's slab, with pieces where this rank writes them; each layer's part is
// assembled into buffer(layer, part). Collective over the data-parallel group (assemble).
template <class Buffer, class Visit>
void walk_model_state(const ParamLayout& layout, ModelStateAccess& state, Buffer&& buffer, Visit&& visit) {
  for (int l = 0; l < layout.num_layers(); ++l) {
    const bool held = state.holds(l);
    const bool writer_rank = held && state.writes(l);
    const LayerSpec& spec = layout.layers()[static_cast<std::size_t>(l)];
    for (const CheckpointPart part : kParts) {
      const float* data = nullptr;
      if (held) {
        std::vector<float>& out = buffer(l, part);
        data = state.assemble(l, part, out);
        if (data != out.data()) out.assign(data, data + state.padded(l));  // a buffer of the state's own
        data = out.data();
      }
      for (const TensorSpec& t : spec.tensors) {
        TensorSlab slab;
        slab.name = prefix(part) + t.name;
        slab.global_shape = t.global_shape;
        slab.local_shape = t.shape;
        slab.data = data == nullptr ? nullptr : const_cast<float*>(data) + t.offset;
        // What several tensor-parallel ranks hold is written by the first copy.
        if (writer_rank) {
          for (const SlabMap& m : t.slabs())
            if (m.first_copy) slab.pieces.push_back({m.global_offset, m.count, m.local_offset});
        }
        visit(slab);
      }
    }
  }
}

}  // namespace

void write_model_state(CheckpointWriter& writer, const ParamLayout& layout, ModelStateAccess& state) {
  writer.reserve(model_state_bytes(layout));
  std::vector<float> full;
  walk_model_state(
      layout, state, [&](int, CheckpointPart) -> std::vector<float>& { return full; },
      [&](const TensorSlab& slab) { writer.write(slab); });
}

void ModelStateSnapshot::reserve(const ParamLayout& layout, const ModelStateAccess& state) {
  layers_.resize(static_cast<std::size_t>(layout.num_layers()) * std::size(kParts));
  bytes_ = 0;
  for (int l = 0; l < layout.num_layers(); ++l) {
    if (!state.holds(l)) continue;
    const auto n = static_cast<std::size_t>(state.padded(l));
    if (!state.writes(l)) {
      scratch_.resize(std::max(scratch_.size(), n));
      continue;
    }
    for (std::size_t p = 0; p < std::size(kParts); ++p) layers_[static_cast<std::size_t>(l) * std::size(kParts) + p].resize(n);
    bytes_ += 4 * static_cast<std::int64_t>(std::size(kParts) * n);
  }
}

void ModelStateSnapshot::take(const ParamLayout& layout, ModelStateAccess& state) {
  total_bytes_ = model_state_bytes(layout);
  bytes_ = 0;
  slabs_.clear();
  nonfinite_.clear();
  layers_.resize(static_cast<std::size_t>(layout.num_layers()) * std::size(kParts));
  // The buffers of the layers this rank writes are kept from one snapshot to the next (no
  // page faults after the first); a layer it only helps assemble passes through scratch_.
  walk_model_state(
      layout, state,
      [&](int l, CheckpointPart part) -> std::vector<float>& {
        if (!state.writes(l)) return scratch_;
        bytes_ += 4 * state.padded(l);
        return layers_[static_cast<std::size_t>(l) * std::size(kParts) + static_cast<std::size_t>(part)];
      },
      [&](TensorSlab slab) {
        if (slab.pieces.empty()) {
          slab.data = nullptr;  // nothing of it written here
        } else if (nonfinite_.empty()) {
          std::int64_t n = 1;
          for (const auto c : slab.local_shape) n *= c;
          if (!std::all_of(slab.data, slab.data + n, [](float v) { return std::isfinite(v); })) nonfinite_ = slab.name;
        }
        slabs_.push_back(std::move(slab));
      });
}

std::int64_t ModelStateSnapshot::bytes_of(const ParamLayout& layout, const ModelStateAccess& state) {
  std::int64_t bytes = 0, scratch = 0;
  for (int l = 0; l < layout.num_layers(); ++l) {
    if (!state.holds(l)) continue;
    if (state.writes(l)) {
      bytes += 4 * static_cast<std::int64_t>(std::size(kParts)) * state.padded(l);
    } else {
      scratch = std::max(scratch, 4 * state.padded(l));
    }
  }
  return bytes + scratch;
}

void ModelStateSnapshot::write(CheckpointWriter& writer) const {
  writer.reserve(total_bytes_);
  for (const TensorSlab& slab : slabs_) writer.write(slab);
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
          for (const SlabMap& m : t.slabs()) slab.pieces.push_back({m.global_offset, m.count, m.local_offset});
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
