#pragma once
// Named views of one GPT-2 (parameters or their gradients) into per-layer flat buffers.
#include <stdexcept>
#include <vector>

#include "lamina/kernels/common.hpp"
#include "lamina/model/param_layout.hpp"

namespace lamina {

template <class Exec>
struct BlockTensors {
  Vec<Exec> ln1_w, ln1_b;       // (C)
  Mat<Exec> qkv_w;              // (C, 3C)
  Vec<Exec> qkv_b;              // (3C)
  Mat<Exec> proj_w;             // (C, C)
  Vec<Exec> proj_b;             // (C)
  Vec<Exec> ln2_w, ln2_b;       // (C)
  Mat<Exec> fc_w;               // (C, 4C)
  Vec<Exec> fc_b;               // (4C)
  Mat<Exec> fcproj_w;           // (4C, C)
  Vec<Exec> fcproj_b;           // (C)
};

template <class Exec>
struct GptTensors {
  Mat<Exec> wte;  // (V, C), also the LM head
  Mat<Exec> wpe;  // (T, C)
  std::vector<BlockTensors<Exec>> blocks;
  Vec<Exec> lnf_w, lnf_b;  // (C)
};

// Binds named views to flat per-layer storage; bases[i] is the start of layer i's buffer
// (a layer's pointer may be null when this rank does not hold it).
template <class Exec>
GptTensors<Exec> bind_gpt_tensors(const ParamLayout& layout, const std::vector<float*>& bases) {
  auto ptr = [&](const std::string& name) -> float* {
    int layer = 0;
    const TensorSpec* spec = nullptr;
    if (!layout.find(name, layer, spec)) throw std::logic_error("no parameter named " + name);
    return bases[layer] == nullptr ? nullptr : bases[layer] + spec->offset;
  };
  auto mat = [&](const std::string& name) {
    int layer = 0;
    const TensorSpec* spec = nullptr;
    layout.find(name, layer, spec);
    return as_mat<Exec>(ptr(name), spec->shape[0], spec->shape[1]);
  };
  auto vec = [&](const std::string& name) {
    int layer = 0;
    const TensorSpec* spec = nullptr;
    layout.find(name, layer, spec);
    return as_vec<Exec>(ptr(name), spec->shape[0]);
  };
  GptTensors<Exec> g;
  g.wte = mat("wte");
  g.wpe = mat("wpe");
  const int L = layout.num_layers() - 2;
  for (int i = 0; i < L; ++i) {
    const std::string h = "h." + std::to_string(i) + ".";
    BlockTensors<Exec> b;
    b.ln1_w = vec(h + "ln_1.weight");
    b.ln1_b = vec(h + "ln_1.bias");
    b.qkv_w = mat(h + "attn.c_attn.weight");
    b.qkv_b = vec(h + "attn.c_attn.bias");
    b.proj_w = mat(h + "attn.c_proj.weight");
    b.proj_b = vec(h + "attn.c_proj.bias");
    b.ln2_w = vec(h + "ln_2.weight");
    b.ln2_b = vec(h + "ln_2.bias");
    b.fc_w = mat(h + "mlp.c_fc.weight");
    b.fc_b = vec(h + "mlp.c_fc.bias");
    b.fcproj_w = mat(h + "mlp.c_proj.weight");
    b.fcproj_b = vec(h + "mlp.c_proj.bias");
    g.blocks.push_back(b);
  }
  g.lnf_w = vec("ln_f.weight");
  g.lnf_b = vec("ln_f.bias");
  return g;
}

}  // namespace lamina
