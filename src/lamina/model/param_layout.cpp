#include "lamina/model/param_layout.hpp"

#include <algorithm>

namespace lamina {

std::int64_t TensorSpec::numel() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

namespace {

// The blocks of a tensor's split dimension: global sizes (one block when none are given).
std::vector<std::int64_t> split_blocks(const TensorSpec& t) {
  if (!t.tp_blocks.empty()) return t.tp_blocks;
  return {t.global_shape[static_cast<std::size_t>(t.tp_split_dim)]};
}

}  // namespace

std::vector<SlabMap> TensorSpec::slabs() const {
  const std::size_t rank = shape.size();
  if (tp_split_dim < 0) {
    return {SlabMap{std::vector<std::int64_t>(rank, 0), std::vector<std::int64_t>(rank, 0), shape}};
  }
  const auto d = static_cast<std::size_t>(tp_split_dim);
  std::vector<SlabMap> out;
  std::int64_t global_begin = 0, local_begin = 0;
  for (const std::int64_t block : split_blocks(*this)) {
    const std::int64_t local = block / tp_size;
    SlabMap s{std::vector<std::int64_t>(rank, 0), std::vector<std::int64_t>(rank, 0), shape};
    s.global_offset[d] = global_begin + tp_rank * local;
    s.local_offset[d] = local_begin;
    s.count[d] = local;
    out.push_back(s);
    global_begin += block;
    local_begin += local;
  }
  return out;
}

std::int64_t TensorSpec::global_index(std::int64_t e) const {
  if (tp_split_dim < 0) return e;
  // Unravel e in the local shape, move the split coordinate to its global position, ravel.
  std::vector<std::int64_t> idx(shape.size());
  for (std::size_t k = shape.size(); k-- > 0;) {
    idx[k] = e % shape[k];
    e /= shape[k];
  }
  const auto d = static_cast<std::size_t>(tp_split_dim);
  std::int64_t global_begin = 0, local_begin = 0;
  for (const std::int64_t block : split_blocks(*this)) {
    const std::int64_t local = block / tp_size;
    if (idx[d] < local_begin + local) {
      idx[d] = global_begin + tp_rank * local + (idx[d] - local_begin);
      break;
    }
    global_begin += block;
    local_begin += local;
  }
  std::int64_t g = 0;
  for (std::size_t k = 0; k < shape.size(); ++k) g = g * global_shape[k] + idx[k];
  return g;
}

namespace {

LayerSpec make_layer(std::string name, std::vector<TensorSpec> tensors) {
  // Matrices first, so that the decayed part of a buffer is one prefix.
  std::stable_partition(tensors.begin(), tensors.end(), [](const TensorSpec& t) { return t.is_matrix; });
  LayerSpec l;
  l.name = std::move(name);
  for (auto& t : tensors) {
    t.offset = l.numel;
    l.numel += t.numel();
    if (t.is_matrix) l.matrix_numel = l.numel;
  }
  l.tensors = std::move(tensors);
  return l;
}

class Maker {
 public:
  Maker(int tp_size, int tp_rank) : tp_size_(tp_size), tp_rank_(tp_rank) {}

  // split: dimension split over tensor-parallel ranks (-1: none); blocks: the global sizes
  // of its separately split parts (empty: one).
  TensorSpec operator()(std::string name, std::vector<std::int64_t> shape, int split, bool matrix, InitKind init,
                        std::vector<std::int64_t> blocks = {}) const {
    TensorSpec t;
    t.name = std::move(name);
    t.global_shape = shape;
    t.shape = shape;
    t.tp_split_dim = tp_size_ > 1 ? split : -1;
    t.tp_blocks = std::move(blocks);
    t.tp_rank = tp_rank_;
    t.tp_size = tp_size_;
    t.is_matrix = matrix;
    t.init = init;
    if (t.tp_split_dim >= 0) t.shape[static_cast<std::size_t>(split)] /= tp_size_;
    return t;
  }

 private:
  int tp_size_, tp_rank_;
};

}  // namespace

ParamLayout ParamLayout::of(const ModelConfig& m, int tp_size, int tp_rank) {
  const std::int64_t C = m.d_model, V = m.vocab_size, T = m.seq_len;
  const std::int64_t hd = C / m.heads, Q = m.heads * hd, KV = m.key_value_heads() * hd, F = m.mlp_hidden();
  const BlockParts& parts = m.parts;
  const bool layernorm = parts.norm == NormKind::layernorm, swiglu = parts.mlp == MlpKind::swiglu;
  const Maker t(tp_size, tp_rank);
  const bool matrix = true, vector = false;
  ParamLayout p;
  std::vector<TensorSpec> embedding = {t("wte", {V, C}, 0, matrix, InitKind::normal)};
  if (parts.position == PositionKind::learned) embedding.push_back(t("wpe", {T, C}, -1, matrix, InitKind::normal));
  p.layers_.push_back(make_layer("embedding", std::move(embedding)));
  // A norm's gain, and LayerNorm's bias.
  auto norm = [&](std::vector<TensorSpec>& ts, const std::string& name) {
    ts.push_back(t(name + ".weight", {C}, -1, vector, InitKind::ones));
    if (layernorm) ts.push_back(t(name + ".bias", {C}, -1, vector, InitKind::zeros));
  };
  for (std::int64_t i = 0; i < m.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    std::vector<TensorSpec> ts;
    auto bias = [&](const std::string& name, std::int64_t n, int split, std::vector<std::int64_t> blocks = {}) {
      if (parts.bias) ts.push_back(t(h + name, {n}, split, vector, InitKind::zeros, std::move(blocks)));
    };
    norm(ts, h + "ln_1");
    ts.push_back(t(h + "attn.c_attn.weight", {C, Q + 2 * KV}, 1, matrix, InitKind::normal, {Q, KV, KV}));
    bias("attn.c_attn.bias", Q + 2 * KV, 0, {Q, KV, KV});
    ts.push_back(t(h + "attn.c_proj.weight", {Q, C}, 0, matrix, InitKind::scaled_normal));
    bias("attn.c_proj.bias", C, -1);
    norm(ts, h + "ln_2");
    if (swiglu) {
      ts.push_back(t(h + "mlp.c_fc.weight", {C, 2 * F}, 1, matrix, InitKind::normal, {F, F}));
    } else {
      ts.push_back(t(h + "mlp.c_fc.weight", {C, F}, 1, matrix, InitKind::normal));
    }
    bias("mlp.c_fc.bias", F, 0);
    ts.push_back(t(h + "mlp.c_proj.weight", {F, C}, 0, matrix, InitKind::scaled_normal));
    bias("mlp.c_proj.bias", C, -1);
    p.layers_.push_back(make_layer("h." + std::to_string(i), std::move(ts)));
  }
  std::vector<TensorSpec> head;
  norm(head, "ln_f");
  // An untied output layer is vocabulary-parallel, as the embedding.
  if (!m.tie_embeddings) head.push_back(t("lm_head", {V, C}, 0, matrix, InitKind::normal));
  p.layers_.push_back(make_layer("ln_f", std::move(head)));
  return p;
}

std::int64_t ParamLayout::total_numel() const {
  std::int64_t n = 0;
  for (const auto& l : layers_) n += l.numel;
  return n;
}

bool ParamLayout::find(const std::string& name, int& layer, const TensorSpec*& spec) const {
  for (int i = 0; i < num_layers(); ++i) {
    for (const auto& t : layers_[i].tensors) {
      if (t.name == name) {
        layer = i;
        spec = &t;
        return true;
      }
    }
  }
  return false;
}

std::vector<Subgroup> ParamLayout::subgroups(int layer, std::int64_t begin, std::int64_t end,
                                             std::int64_t subgroup_size) const {
  std::vector<Subgroup> out;
  for (std::int64_t b = begin; b < end; b += subgroup_size) out.push_back({layer, b, std::min(end, b + subgroup_size)});
  return out;
}

std::vector<Subgroup> ParamLayout::subgroups(std::int64_t subgroup_size) const {
  std::vector<Subgroup> out;
  for (int i = 0; i < num_layers(); ++i) {
    const auto s = subgroups(i, 0, layers_[i].numel, subgroup_size);
    out.insert(out.end(), s.begin(), s.end());
  }
  return out;
}

}  // namespace lamina
