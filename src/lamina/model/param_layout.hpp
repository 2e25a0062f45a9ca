#pragma once
// Where every parameter lives: per-layer flat buffers (docs/architecture.md, idea 2), tensor names
// and global shapes as in HuggingFace GPT-2 (a Llama block's tensors under the same names:
// c_attn holds [q | k | v], c_fc [gate | up]), how tensor parallelism splits each tensor
// (and so where this rank's piece sits in the global tensor), and the optimizer-state
// subgroups. Checkpoints, initialisation, the optimizer and sharding all read this one
// description.
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "lamina/core/config.hpp"

namespace lamina {

enum class InitKind { normal, scaled_normal, zeros, ones };

// A rectangle of this rank's local tensor and where it sits in the global tensor.
struct SlabMap {
  std::vector<std::int64_t> global_offset, local_offset, count;
  // Whether this rank holds the first of the copies of the rectangle that tensor-parallel
  // ranks hold (a replicated tensor's, or a replicated K/V head's): it is written and
  // counted in the gradient norm by that copy alone.
  bool first_copy = true;
  int copies = 1;  // how many tensor-parallel ranks hold it
};

struct TensorSpec {
  std::string name;                        // "wte", "h.3.attn.c_attn.weight", ...
  std::vector<std::int64_t> global_shape;  // row-major, as in the checkpoint
  std::vector<std::int64_t> shape;         // this tensor-parallel rank's piece
  int tp_split_dim = -1;                   // dimension split over tensor-parallel ranks; -1: replicated
  // The global sizes of the blocks of the split dimension that split separately ([q|k|v]:
  // three, unequal with grouped-query attention); empty: one block.
  std::vector<std::int64_t> tp_blocks;
  // How many tensor-parallel ranks hold each block's piece (Megatron's K/V heads where tp
  // exceeds kv_heads: tp / kv_heads ranks share one); empty: one each.
  std::vector<int> tp_replicas;
  int tp_rank = 0, tp_size = 1;
  bool is_matrix = false;                  // matrices and embeddings decay; biases and gains on request
  // A norm's gain or bias: it reads the residual stream's rows, so under sequence parallelism
  // each tensor-parallel rank's gradient of it covers that rank's rows alone.
  bool norm = false;
  InitKind init = InitKind::zeros;
  std::int64_t offset = 0;                 // first element in the layer's flat buffer

  std::int64_t numel() const;
  bool replicated() const { return tp_split_dim < 0; }
  // One slab per block of the split dimension (one for an unsplit tensor).
  std::vector<SlabMap> slabs() const;
  // The runs [first, last) of local flat indices a slab covers.
  std::vector<std::pair<std::int64_t, std::int64_t>> runs(const SlabMap& slab) const;
  // Whether some block's piece is held by several tensor-parallel ranks.
  bool has_replicated_blocks() const;
  // Flat index in the global tensor of flat index `e` of the local piece.
  std::int64_t global_index(std::int64_t e) const;
};

// One flat buffer: the embedding, one transformer block, or the final norm.
struct LayerSpec {
  std::string name;  // "embedding", "h.0", ..., "ln_f"
  std::vector<TensorSpec> tensors;
  std::int64_t numel = 0;
  std::int64_t matrix_numel = 0;  // matrices first: elements [0, matrix_numel) are matrices
};

// A contiguous slice of one layer's flat buffer: the unit of optimizer placement.
struct Subgroup {
  int layer = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
};

class ParamLayout {
 public:
  // The model as tensor-parallel rank `tp_rank` of `tp_size` holds it (Megatron's split:
  // vocabulary-parallel embedding, column-parallel QKV and fc, row-parallel projections;
  // norms, position table and the projections' biases replicated). Its block's parts
  // decide which tensors there are: no position table with rotary positions, no norm
  // biases with RMSNorm, no projection biases without `bias`.
  // Layer 0 = embedding (wte, wpe), layers 1..L = blocks h.0..h.{L-1}, layer L+1 = ln_f
  // (and lm_head, an untied output layer).
  static ParamLayout of(const ModelConfig& model, int tp_size = 1, int tp_rank = 0);

  const std::vector<LayerSpec>& layers() const { return layers_; }
  int num_layers() const { return static_cast<int>(layers_.size()); }
  int block_layer(std::int64_t block) const { return static_cast<int>(block) + 1; }
  int final_layer() const { return num_layers() - 1; }
  // Whether the head reads the token embedding (no lm_head of its own).
  bool tied_embeddings() const { return tied_; }
  std::int64_t total_numel() const;
  // Returns false when no tensor has this name.
  bool find(const std::string& name, int& layer, const TensorSpec*& spec) const;
  // Elements [begin, end) of layers()[layer] cut into slices of at most `subgroup_size`.
  std::vector<Subgroup> subgroups(int layer, std::int64_t begin, std::int64_t end, std::int64_t subgroup_size) const;
  // Each whole layer buffer cut into subgroups.
  std::vector<Subgroup> subgroups(std::int64_t subgroup_size) const;

 private:
  std::vector<LayerSpec> layers_;
  bool tied_ = true;
};

}  // namespace lamina
