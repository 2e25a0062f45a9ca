#include "lamina/model/param_layout.hpp"

#include <algorithm>

namespace lamina {

std::int64_t TensorSpec::numel() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

std::vector<SlabMap> TensorSpec::slabs() const {
  const std::size_t rank = shape.size();
  if (tp_split_dim < 0) {
    return {SlabMap{std::vector<std::int64_t>(rank, 0), std::vector<std::int64_t>(rank, 0), shape}};
  }
  const auto d = static_cast<std::size_t>(tp_split_dim);
  const std::int64_t block_global = global_shape[d] / tp_blocks, block_local = shape[d] / tp_blocks;
  std::vector<SlabMap> out;
  for (int b = 0; b < tp_blocks; ++b) {
    SlabMap s{std::vector<std::int64_t>(rank, 0), std::vector<std::int64_t>(rank, 0), shape};
    s.global_offset[d] = b * block_global + tp_rank * block_local;
    s.local_offset[d] = b * block_local;
    s.count[d] = block_local;
    out.push_back(s);
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
  const std::int64_t block_local = shape[d] / tp_blocks, block_global = global_shape[d] / tp_blocks;
  const std::int64_t block = idx[d] / block_local;
  idx[d] = block * block_global + tp_rank * block_local + idx[d] % block_local;
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

  // split: dimension split over tensor-parallel ranks (-1: none); blocks: separately split parts.
  TensorSpec operator()(std::string name, std::vector<std::int64_t> shape, int split, int blocks, bool matrix,
                        InitKind init) const {
    TensorSpec t;
    t.name = std::move(name);
    t.global_shape = shape;
    t.shape = shape;
    t.tp_split_dim = tp_size_ > 1 ? split : -1;
    t.tp_blocks = blocks;
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

ParamLayout ParamLayout::gpt2(const ModelConfig& m, int tp_size, int tp_rank) {
  const std::int64_t C = m.d_model, V = m.vocab_size, T = m.seq_len;
  const Maker t(tp_size, tp_rank);
  const bool matrix = true, vector = false;
  ParamLayout p;
  p.layers_.push_back(make_layer("embedding", {t("wte", {V, C}, 0, 1, matrix, InitKind::normal),
                                               t("wpe", {T, C}, -1, 1, matrix, InitKind::normal)}));
  for (std::int64_t i = 0; i < m.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    p.layers_.push_back(make_layer(
        "h." + std::to_string(i),
        {t(h + "ln_1.weight", {C}, -1, 1, vector, InitKind::ones),
         t(h + "ln_1.bias", {C}, -1, 1, vector, InitKind::zeros),
         t(h + "attn.c_attn.weight", {C, 3 * C}, 1, 3, matrix, InitKind::normal),
         t(h + "attn.c_attn.bias", {3 * C}, 0, 3, vector, InitKind::zeros),
         t(h + "attn.c_proj.weight", {C, C}, 0, 1, matrix, InitKind::scaled_normal),
         t(h + "attn.c_proj.bias", {C}, -1, 1, vector, InitKind::zeros),
         t(h + "ln_2.weight", {C}, -1, 1, vector, InitKind::ones),
         t(h + "ln_2.bias", {C}, -1, 1, vector, InitKind::zeros),
         t(h + "mlp.c_fc.weight", {C, 4 * C}, 1, 1, matrix, InitKind::normal),
         t(h + "mlp.c_fc.bias", {4 * C}, 0, 1, vector, InitKind::zeros),
         t(h + "mlp.c_proj.weight", {4 * C, C}, 0, 1, matrix, InitKind::scaled_normal),
         t(h + "mlp.c_proj.bias", {C}, -1, 1, vector, InitKind::zeros)}));
  }
  p.layers_.push_back(make_layer("ln_f", {t("ln_f.weight", {C}, -1, 1, vector, InitKind::ones),
                                          t("ln_f.bias", {C}, -1, 1, vector, InitKind::zeros)}));
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
