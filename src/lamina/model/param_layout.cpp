#include "lamina/model/param_layout.hpp"

#include <algorithm>

namespace lamina {

std::int64_t TensorSpec::numel() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

namespace {

// The blocks of a tensor's split dimension: global size and how many ranks hold each piece.
struct Block {
  std::int64_t size;
  int replicas;
  std::int64_t local(int tp_size) const { return size / (tp_size / replicas); }
};

std::vector<Block> split_blocks(const TensorSpec& t) {
  if (t.tp_blocks.empty()) return {{t.global_shape[static_cast<std::size_t>(t.tp_split_dim)], 1}};
  std::vector<Block> out;
  for (std::size_t b = 0; b < t.tp_blocks.size(); ++b) {
    out.push_back({t.tp_blocks[b], t.tp_replicas.empty() ? 1 : t.tp_replicas[b]});
  }
  return out;
}

}  // namespace

std::vector<SlabMap> TensorSpec::slabs() const {
  const std::size_t rank = shape.size();
  if (tp_split_dim < 0) {
    return {SlabMap{std::vector<std::int64_t>(rank, 0), std::vector<std::int64_t>(rank, 0), shape, tp_rank == 0, tp_size}};
  }
  const auto d = static_cast<std::size_t>(tp_split_dim);
  std::vector<SlabMap> out;
  std::int64_t global_begin = 0, local_begin = 0;
  for (const Block& block : split_blocks(*this)) {
    const std::int64_t local = block.local(tp_size);
    SlabMap s{std::vector<std::int64_t>(rank, 0), std::vector<std::int64_t>(rank, 0), shape, true, block.replicas};
    s.global_offset[d] = global_begin + (tp_rank / block.replicas) * local;
    s.local_offset[d] = local_begin;
    s.count[d] = local;
    s.first_copy = tp_rank % block.replicas == 0;
    out.push_back(s);
    global_begin += block.size;
    local_begin += local;
  }
  return out;
}

std::vector<std::pair<std::int64_t, std::int64_t>> TensorSpec::runs(const SlabMap& slab) const {
  if (tp_split_dim < 0) return {{0, numel()}};
  const auto d = static_cast<std::size_t>(tp_split_dim);
  std::int64_t outer = 1, inner = 1;
  for (std::size_t k = 0; k < d; ++k) outer *= shape[k];
  for (std::size_t k = d + 1; k < shape.size(); ++k) inner *= shape[k];
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  for (std::int64_t o = 0; o < outer; ++o) {
    const std::int64_t first = (o * shape[d] + slab.local_offset[d]) * inner, last = first + slab.count[d] * inner;
    if (!out.empty() && out.back().second == first) {
      out.back().second = last;
    } else {
      out.emplace_back(first, last);
    }
  }
  return out;
}

bool TensorSpec::has_replicated_blocks() const {
  return tp_split_dim >= 0 && std::any_of(tp_replicas.begin(), tp_replicas.end(), [](int r) { return r > 1; });
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
  for (const Block& block : split_blocks(*this)) {
    const std::int64_t local = block.local(tp_size);
    if (idx[d] < local_begin + local) {
      idx[d] = global_begin + (tp_rank / block.replicas) * local + (idx[d] - local_begin);
      break;
    }
    global_begin += block.size;
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
  // of its separately split parts (empty: one), replicas: how many ranks share each one's
  // piece (empty: one each).
  TensorSpec operator()(std::string name, std::vector<std::int64_t> shape, int split, bool matrix, InitKind init,
                        std::vector<std::int64_t> blocks = {}, std::vector<int> replicas = {}) const {
    TensorSpec t;
    t.name = std::move(name);
    t.global_shape = shape;
    t.shape = shape;
    t.tp_split_dim = tp_size_ > 1 ? split : -1;
    t.tp_blocks = std::move(blocks);
    t.tp_replicas = std::move(replicas);
    t.tp_rank = tp_rank_;
    t.tp_size = tp_size_;
    t.is_matrix = matrix;
    t.init = init;
    if (t.tp_split_dim >= 0) {
      std::int64_t local = 0;
      for (const Block& b : split_blocks(t)) local += b.local(tp_size_);
      t.shape[static_cast<std::size_t>(split)] = local;
    }
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
  // Where tp exceeds the key/value heads, tp / kv_heads ranks hold each one (Megatron's).
  const int kv_replicas = tp_size > m.key_value_heads() ? tp_size / static_cast<int>(m.key_value_heads()) : 1;
  const std::vector<int> qkv_replicas = {1, kv_replicas, kv_replicas};
  const bool matrix = true, vector = false;
  ParamLayout p;
  std::vector<TensorSpec> embedding = {t("wte", {V, C}, 0, matrix, InitKind::normal)};
  if (parts.position == PositionKind::learned) embedding.push_back(t("wpe", {T, C}, -1, matrix, InitKind::normal));
  p.layers_.push_back(make_layer("embedding", std::move(embedding)));
  // A norm's gain, and LayerNorm's bias.
  auto norm = [&](std::vector<TensorSpec>& ts, const std::string& name) {
    ts.push_back(t(name + ".weight", {C}, -1, vector, InitKind::ones));
    if (layernorm) ts.push_back(t(name + ".bias", {C}, -1, vector, InitKind::zeros));
    for (auto it = ts.end() - (layernorm ? 2 : 1); it != ts.end(); ++it) it->norm = true;
  };
  for (std::int64_t i = 0; i < m.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    std::vector<TensorSpec> ts;
    auto bias = [&](const std::string& name, std::int64_t n, int split, std::vector<std::int64_t> blocks = {},
                    std::vector<int> replicas = {}) {
      if (parts.bias) {
        ts.push_back(t(h + name, {n}, split, vector, InitKind::zeros, std::move(blocks), std::move(replicas)));
      }
    };
    norm(ts, h + "ln_1");
    ts.push_back(t(h + "attn.c_attn.weight", {C, Q + 2 * KV}, 1, matrix, InitKind::normal, {Q, KV, KV},
                 qkv_replicas));
    bias("attn.c_attn.bias", Q + 2 * KV, 0, {Q, KV, KV}, qkv_replicas);
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
  p.tied_ = m.tie_embeddings;
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
