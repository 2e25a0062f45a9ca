#pragma once
// Named views of GPT-2 parameters (or their gradients) into per-layer flat buffers, in
// this rank's tensor-parallel shapes. Layers are bound one at a time, so that a layer
// whose parameters live elsewhere (ZeRO-3, another pipeline stage) is bound only while
// its buffer is present. Gradients are fp32 (*Tensors); what the compute reads of the
// parameters (*Weights) has its matrices as stored, fp32 or bf16, and its norm gains and
// biases in fp32 (a bf16 layer's widened per use: every layer stores its matrices first).
#include <stdexcept>
#include <vector>

#include "lamina/kernels/common.hpp"
#include "lamina/model/param_layout.hpp"

namespace lamina {

template <class Exec>
struct EmbeddingTensors {
  Mat<Exec> wte;  // (V, C), also the LM head unless it is untied
  Mat<Exec> wpe;  // (T, C); empty with rotary positions
};

template <class Exec>
struct BlockTensors {
  Vec<Exec> ln1_w, ln1_b;       // (C)
  Mat<Exec> qkv_w;              // (C, 3A)
  Vec<Exec> qkv_b;              // (3A)
  Mat<Exec> proj_w;             // (A, C)
  Vec<Exec> proj_b;             // (C)
  Vec<Exec> ln2_w, ln2_b;       // (C)
  Mat<Exec> fc_w;               // (C, F)
  Vec<Exec> fc_b;               // (F)
  Mat<Exec> fcproj_w;           // (F, C)
  Vec<Exec> fcproj_b;           // (C)
};

template <class Exec>
struct FinalNormTensors {
  Vec<Exec> w, b;     // (C); no b with RMSNorm
  Mat<Exec> lm_head;  // (V, C): an untied output layer; empty when tied to wte
};

template <class Exec>
struct FinalWeights {
  ConstVec<Exec> w, b;   // (C); no b with RMSNorm
  MatRef<Exec> lm_head;  // (V, C) as stored: an untied output layer; empty when tied to wte
};

template <class Exec>
struct EmbeddingWeights {
  MatRef<Exec> wte;  // (V, C), also the LM head unless it is untied
  MatRef<Exec> wpe;  // (T, C); empty with rotary positions
};

template <class Exec>
struct BlockWeights {
  ConstVec<Exec> ln1_w, ln1_b;  // (C)
  MatRef<Exec> qkv_w;           // (C, 3A)
  ConstVec<Exec> qkv_b;         // (3A)
  MatRef<Exec> proj_w;          // (A, C)
  ConstVec<Exec> proj_b;        // (C)
  ConstVec<Exec> ln2_w, ln2_b;  // (C)
  MatRef<Exec> fc_w;            // (C, F)
  ConstVec<Exec> fc_b;          // (F)
  MatRef<Exec> fcproj_w;        // (F, C)
  ConstVec<Exec> fcproj_b;      // (C)
};

// A layer's parameters as stored: fp32 (f32), or bf16 (b16) with its norm gains and biases
// (the elements past its matrices) widened into `vectors`.
struct LayerParams {
  const float* f32 = nullptr;
  const std::uint16_t* b16 = nullptr;
  float* vectors = nullptr;
};

namespace detail {
// Where a layer has no such tensor (the block's parts leave it out): binds an empty view.
constexpr std::size_t kAbsent = static_cast<std::size_t>(-1);
template <class Exec>
Mat<Exec> bind_mat(const LayerSpec& l, std::size_t i, float* base) {
  if (i == kAbsent) return Mat<Exec>();
  const TensorSpec& t = l.tensors[i];
  return as_mat<Exec>(base + t.offset, t.shape[0], t.shape[1]);
}
template <class Exec>
Vec<Exec> bind_vec(const LayerSpec& l, std::size_t i, float* base) {
  if (i == kAbsent) return Vec<Exec>();
  const TensorSpec& t = l.tensors[i];
  return as_vec<Exec>(base + t.offset, t.shape[0]);
}
// The tensor whose name ends in `suffix`; kAbsent where the parts leave it out (norm and
// projection biases, the position table), an error for any other.
inline std::size_t index_of(const LayerSpec& l, const std::string& suffix, bool optional = false) {
  for (std::size_t i = 0; i < l.tensors.size(); ++i) {
    const std::string& n = l.tensors[i].name;
    if (n.size() >= suffix.size() && n.compare(n.size() - suffix.size(), suffix.size(), suffix) == 0) return i;
  }
  if (optional) return kAbsent;
  throw std::logic_error("layer " + l.name + " has no tensor *" + suffix);
}
inline std::size_t optional_index(const LayerSpec& l, const std::string& suffix) { return index_of(l, suffix, true); }
template <class Exec>
MatRef<Exec> bind_weight(const LayerSpec& l, std::size_t i, const LayerParams& p) {
  if (i == kAbsent) return MatRef<Exec>();
  const TensorSpec& t = l.tensors[i];
  if (p.f32 != nullptr) return ConstMat<Exec>(p.f32 + t.offset, t.shape[0], t.shape[1]);
  return ConstMat16<Exec>(p.b16 + t.offset, t.shape[0], t.shape[1]);
}
template <class Exec>
ConstVec<Exec> bind_gain(const LayerSpec& l, std::size_t i, const LayerParams& p) {
  if (i == kAbsent) return ConstVec<Exec>();
  const TensorSpec& t = l.tensors[i];
  if (p.f32 != nullptr) return ConstVec<Exec>(p.f32 + t.offset, t.shape[0]);
  return ConstVec<Exec>(p.vectors + (t.offset - l.matrix_numel), t.shape[0]);
}
}  // namespace detail

template <class Exec>
EmbeddingWeights<Exec> bind_embedding_weights(const ParamLayout& layout, const LayerParams& p) {
  const LayerSpec& l = layout.layers().front();
  return {detail::bind_weight<Exec>(l, detail::index_of(l, "wte"), p),
          detail::bind_weight<Exec>(l, detail::optional_index(l, "wpe"), p)};
}

template <class Exec>
BlockWeights<Exec> bind_block_weights(const ParamLayout& layout, std::int64_t block, const LayerParams& p) {
  const LayerSpec& l = layout.layers()[layout.block_layer(block)];
  using detail::index_of;
  using detail::optional_index;
  BlockWeights<Exec> b;
  b.ln1_w = detail::bind_gain<Exec>(l, index_of(l, "ln_1.weight"), p);
  b.ln1_b = detail::bind_gain<Exec>(l, optional_index(l, "ln_1.bias"), p);
  b.qkv_w = detail::bind_weight<Exec>(l, index_of(l, "c_attn.weight"), p);
  b.qkv_b = detail::bind_gain<Exec>(l, optional_index(l, "c_attn.bias"), p);
  b.proj_w = detail::bind_weight<Exec>(l, index_of(l, "attn.c_proj.weight"), p);
  b.proj_b = detail::bind_gain<Exec>(l, optional_index(l, "attn.c_proj.bias"), p);
  b.ln2_w = detail::bind_gain<Exec>(l, index_of(l, "ln_2.weight"), p);
  b.ln2_b = detail::bind_gain<Exec>(l, optional_index(l, "ln_2.bias"), p);
  b.fc_w = detail::bind_weight<Exec>(l, index_of(l, "c_fc.weight"), p);
  b.fc_b = detail::bind_gain<Exec>(l, optional_index(l, "c_fc.bias"), p);
  b.fcproj_w = detail::bind_weight<Exec>(l, index_of(l, "mlp.c_proj.weight"), p);
  b.fcproj_b = detail::bind_gain<Exec>(l, optional_index(l, "mlp.c_proj.bias"), p);
  return b;
}

template <class Exec>
FinalWeights<Exec> bind_final_norm_weights(const ParamLayout& layout, const LayerParams& p) {
  const LayerSpec& l = layout.layers().back();
  return {detail::bind_gain<Exec>(l, detail::index_of(l, "ln_f.weight"), p),
          detail::bind_gain<Exec>(l, detail::optional_index(l, "ln_f.bias"), p),
          detail::bind_weight<Exec>(l, detail::optional_index(l, "lm_head"), p)};
}

template <class Exec>
EmbeddingTensors<Exec> bind_embedding(const ParamLayout& layout, float* base) {
  const LayerSpec& l = layout.layers().front();
  return {detail::bind_mat<Exec>(l, detail::index_of(l, "wte"), base),
          detail::bind_mat<Exec>(l, detail::optional_index(l, "wpe"), base)};
}

// block: 0-based transformer block index
template <class Exec>
BlockTensors<Exec> bind_block(const ParamLayout& layout, std::int64_t block, float* base) {
  const LayerSpec& l = layout.layers()[layout.block_layer(block)];
  using detail::index_of;
  using detail::optional_index;
  BlockTensors<Exec> b;
  b.ln1_w = detail::bind_vec<Exec>(l, index_of(l, "ln_1.weight"), base);
  b.ln1_b = detail::bind_vec<Exec>(l, optional_index(l, "ln_1.bias"), base);
  b.qkv_w = detail::bind_mat<Exec>(l, index_of(l, "c_attn.weight"), base);
  b.qkv_b = detail::bind_vec<Exec>(l, optional_index(l, "c_attn.bias"), base);
  b.proj_w = detail::bind_mat<Exec>(l, index_of(l, "attn.c_proj.weight"), base);
  b.proj_b = detail::bind_vec<Exec>(l, optional_index(l, "attn.c_proj.bias"), base);
  b.ln2_w = detail::bind_vec<Exec>(l, index_of(l, "ln_2.weight"), base);
  b.ln2_b = detail::bind_vec<Exec>(l, optional_index(l, "ln_2.bias"), base);
  b.fc_w = detail::bind_mat<Exec>(l, index_of(l, "c_fc.weight"), base);
  b.fc_b = detail::bind_vec<Exec>(l, optional_index(l, "c_fc.bias"), base);
  b.fcproj_w = detail::bind_mat<Exec>(l, index_of(l, "mlp.c_proj.weight"), base);
  b.fcproj_b = detail::bind_vec<Exec>(l, optional_index(l, "mlp.c_proj.bias"), base);
  return b;
}

template <class Exec>
FinalNormTensors<Exec> bind_final_norm(const ParamLayout& layout, float* base) {
  const LayerSpec& l = layout.layers().back();
  return {detail::bind_vec<Exec>(l, detail::index_of(l, "ln_f.weight"), base),
          detail::bind_vec<Exec>(l, detail::optional_index(l, "ln_f.bias"), base),
          detail::bind_mat<Exec>(l, detail::optional_index(l, "lm_head"), base)};
}

}  // namespace lamina
