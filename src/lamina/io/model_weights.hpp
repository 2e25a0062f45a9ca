#pragma once
// A model's weights in any of the files lamina reads and writes: its own checkpoints
// (HDF5), HuggingFace's safetensors (one file, a directory with config.json, or shards with
// model.safetensors.index.json; GPT2LMHeadModel's or LlamaForCausalLM's) and llm.c's model
// files (GPT-2). Every source hands out tensors by lamina's names and layout (HuggingFace
// GPT-2's names without `transformer.`, Conv1D matrices (in, out), float32; a Llama's q, k,
// v and gate, up joined as c_attn and c_fc), so that `lamina convert` and `model.init` need
// not know where they came from.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/io/stored_numbers.hpp"

namespace lamina {

enum class WeightsFormat { lamina, huggingface, llmc };
const char* weights_format_name(WeightsFormat f);

struct WeightsTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> values;
};

class WeightsSource {
 public:
  virtual ~WeightsSource() = default;
  virtual const std::string& path() const = 0;
  virtual WeightsFormat format() const = 0;
  // One line: the format, how numbers are stored, the model.
  virtual std::string describe() const = 0;
  // The model the file holds; heads = 0 where the file does not say (a safetensors file
  // without config.json beside it).
  virtual const ModelConfig& model() const = 0;
  // The tensor as stored (shape included); a name the file lacks is an InputError.
  virtual WeightsTensor tensor(const std::string& name) const = 0;
};

// Opens `path`, recognising the format from its contents (a directory: HuggingFace's).
// A file of none of them, or one that is damaged, is an InputError naming it.
std::unique_ptr<WeightsSource> open_weights(const std::string& path);

// The tensor `name` of `shape` from `source`: a file with a longer position table gives
// its first rows (a shorter context than the model was trained with). Another shape is an
// InputError naming the file, the tensor and both shapes.
std::vector<float> fetch_tensor(const WeightsSource& source, const std::string& name,
                                const std::vector<std::int64_t>& shape);

// What the tensors' shapes cannot show: the same number of blocks, and of heads where the
// file says. The InputError says what differs.
void check_weights_model(const WeightsSource& source, const ModelConfig& model);

struct WeightsOutput {
  WeightsFormat format = WeightsFormat::huggingface;
  StoredFloat type = StoredFloat::f32;
  std::int64_t max_shard_bytes = 0;  // HuggingFace: shards of at most this many bytes; 0: one file
};

// What `out` names: a `.h5` file is a lamina checkpoint, a `.bin` file llm.c's, anything else
// (a directory, `.safetensors`) HuggingFace's.
WeightsFormat weights_format_of(const std::string& out);

// Writes every tensor of `model` from `source` to `out`:
//  - lamina: a checkpoint at step 0 (fresh optimizer state), resumable and usable as model.init;
//  - huggingface: `out` a directory: model.safetensors (or model-0000i-of-0000n.safetensors
//    and model.safetensors.index.json) and config.json, GPT2LMHeadModel names with the
//    `transformer.` prefix and the tied lm_head left out, as save_pretrained writes them;
//    `out` ending in .safetensors: that one file;
//  - llmc: an llm.c model file.
// Returns the files written.
std::vector<std::string> write_weights(const std::string& out, const WeightsSource& source, const ModelConfig& model,
                                       const WeightsOutput& options);

}  // namespace lamina
