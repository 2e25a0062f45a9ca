#include "lamina/model/param_layout.hpp"

#include <algorithm>

namespace lamina {

std::int64_t TensorSpec::numel() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
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

TensorSpec matrix(std::string name, std::int64_t rows, std::int64_t cols, int split, int blocks, InitKind init) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = {rows, cols};
  t.tp_split_dim = split;
  t.tp_blocks = blocks;
  t.is_matrix = true;
  t.init = init;
  return t;
}

TensorSpec vector(std::string name, std::int64_t n, int split, int blocks, InitKind init) {
  TensorSpec t;
  t.name = std::move(name);
  t.shape = {n};
  t.tp_split_dim = split;
  t.tp_blocks = blocks;
  t.init = init;
  return t;
}

}  // namespace

ParamLayout ParamLayout::gpt2(const ModelConfig& m) {
  const std::int64_t C = m.d_model, V = m.vocab_size, T = m.seq_len;
  ParamLayout p;
  // Megatron-style tensor parallelism: vocabulary-parallel embedding, column-parallel
  // QKV and fc (split output columns), row-parallel projections (split input rows).
  p.layers_.push_back(make_layer("embedding", {matrix("wte", V, C, 0, 1, InitKind::normal),
                                               matrix("wpe", T, C, -1, 1, InitKind::normal)}));
  for (std::int64_t i = 0; i < m.layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    p.layers_.push_back(make_layer(
        "h." + std::to_string(i),
        {vector(h + "ln_1.weight", C, -1, 1, InitKind::ones), vector(h + "ln_1.bias", C, -1, 1, InitKind::zeros),
         matrix(h + "attn.c_attn.weight", C, 3 * C, 1, 3, InitKind::normal),
         vector(h + "attn.c_attn.bias", 3 * C, 0, 3, InitKind::zeros),
         matrix(h + "attn.c_proj.weight", C, C, 0, 1, InitKind::scaled_normal),
         vector(h + "attn.c_proj.bias", C, -1, 1, InitKind::zeros),
         vector(h + "ln_2.weight", C, -1, 1, InitKind::ones), vector(h + "ln_2.bias", C, -1, 1, InitKind::zeros),
         matrix(h + "mlp.c_fc.weight", C, 4 * C, 1, 1, InitKind::normal),
         vector(h + "mlp.c_fc.bias", 4 * C, 0, 1, InitKind::zeros),
         matrix(h + "mlp.c_proj.weight", 4 * C, C, 0, 1, InitKind::scaled_normal),
         vector(h + "mlp.c_proj.bias", C, -1, 1, InitKind::zeros)}));
  }
  p.layers_.push_back(make_layer("ln_f", {vector("ln_f.weight", C, -1, 1, InitKind::ones),
                                          vector("ln_f.bias", C, -1, 1, InitKind::zeros)}));
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

std::vector<Subgroup> ParamLayout::subgroups(std::int64_t subgroup_size) const {
  std::vector<Subgroup> out;
  for (int i = 0; i < num_layers(); ++i) {
    for (std::int64_t b = 0; b < layers_[i].numel; b += subgroup_size) {
      out.push_back({i, b, std::min(layers_[i].numel, b + subgroup_size)});
    }
  }
  return out;
}

}  // namespace lamina
