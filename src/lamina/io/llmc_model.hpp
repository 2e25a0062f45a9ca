#pragma once
// llm.c's GPT-2 model files (gpt2_124M.bin, gpt2_124M_bf16.bin, its checkpoints): a header
// of 256 int32 (magic 20240326; version 3: float32 parameters, 5: bfloat16; max sequence
// length, vocabulary, layers, heads, channels, padded vocabulary), then the 16 parameter
// arrays, each layer's tensors of a kind one after the other: wte (Vp, C), wpe (T, C),
// ln_1 weight and bias (L, C), c_attn weight (L, 3C, C) and bias, attention c_proj (L, C, C)
// and bias, ln_2 weight and bias, c_fc (L, 4C, C) and bias, mlp c_proj (L, C, 4C) and bias,
// ln_f weight and bias (C). Matrices are nn.Linear's (out, in), the transpose of
// HuggingFace's Conv1D (in, out) that lamina keeps. The header is checked against itself
// and the file's size before anything is read.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/io/mapped_file.hpp"
#include "lamina/io/stored_numbers.hpp"

namespace lamina {

class LlmcModelFile {
 public:
  static constexpr std::int32_t kMagic = 20240326;

  explicit LlmcModelFile(const std::string& path);  // throws InputError
  const std::string& path() const { return file_.path(); }
  // The model (vocab_size: the real vocabulary, header[3]).
  const ModelConfig& model() const { return model_; }
  std::int64_t padded_vocab() const { return padded_vocab_; }
  StoredFloat stored() const { return stored_; }
  // A tensor by lamina's name in lamina's layout (matrices transposed back to (in, out)),
  // and its shape there. `wte` has the real vocabulary's rows.
  std::vector<float> tensor(const std::string& name, std::vector<std::int64_t>& shape) const;

 private:
  MappedFile file_;
  ModelConfig model_;
  std::int64_t padded_vocab_ = 0;
  StoredFloat stored_ = StoredFloat::f32;
};

// Whether the file starts with the llm.c model magic.
bool is_llmc_model_file(const std::uint8_t* head, std::int64_t size);

// llm.c pads the vocabulary to a multiple of 128 rows (zeros) for its kernels.
std::int64_t llmc_padded_vocab(std::int64_t vocab);

// The 16 arrays in llm.c's order, by lamina's tensor names for layer i ("h.{i}.ln_1.weight").
struct LlmcArray {
  std::string kind;  // lamina's name with "h.{i}." removed: "ln_1.weight", "attn.c_attn.weight", "wte", ...
  bool per_layer = false;
  bool transposed = false;  // stored (out, in)
};
const std::vector<LlmcArray>& llmc_arrays();

// Writes `model`'s tensors (`get(name)`: lamina's name and layout, wte with vocab_size rows)
// as an llm.c model file: version 3 for f32, 5 for bf16 (llm.c has no other), the
// vocabulary padded with zero rows. Written to `path`.tmp and renamed.
void write_llmc_model(const std::string& path, const ModelConfig& model, StoredFloat type,
                      const std::function<std::vector<float>(const std::string& name)>& get);

}  // namespace lamina
