#pragma once
// The input deck: one typed struct per TOML section, validated once at start-up.
// Hot code receives these structs (or objects built from them), never the TOML.
#include <cstdint>
#include <algorithm>
#include <string>
#include <vector>

namespace lamina {

struct ModelConfig {
  std::int64_t layers = 0;
  std::int64_t d_model = 0;
  std::int64_t heads = 0;
  std::int64_t seq_len = 0;  // context length = size of the position table
  std::int64_t vocab_size = 0;
  double init_std = 0.02;
};

enum class DataFormat { text, megatron, llmc, synthetic };
const char* data_format_name(DataFormat f);

struct DataConfig {
  DataFormat format = DataFormat::text;
  std::vector<std::string> paths;  // text/llmc: files; megatron: prefixes (P -> P.bin, P.idx)
  std::int64_t batch_size = 0;        // global sequences per optimizer step
  std::int64_t micro_batch_size = 0;  // sequences per forward/backward pass on one rank
  bool shuffle = true;
};

enum class Precision { fp32, bf16 };

struct TrainConfig {
  std::int64_t steps = 0;
  std::uint64_t seed = 1234;
  Precision precision = Precision::fp32;
  bool skip_nonfinite = false;  // skip steps with non-finite loss/gradients instead of stopping
};

enum class LrSchedule { constant, cosine };

struct OptimizerConfig {
  double lr = 3e-4;
  double min_lr = 0.0;
  double weight_decay = 0.1;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double grad_clip = 1.0;  // global-norm clipping threshold; 0 disables
  std::int64_t warmup_steps = 0;
  std::int64_t decay_steps = 0;  // cosine: steps from the end of warm-up to min_lr (0: until train.steps)
  LrSchedule schedule = LrSchedule::cosine;
  std::int64_t subgroup_size = 1 << 22;  // elements per optimizer-state subgroup
  bool decay_biases_and_norms = false;   // PyTorch's AdamW default decays every tensor
};

struct ParallelConfig {
  std::int64_t dp = 1;
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::int64_t zero = 0;
  std::string schedule = "1f1b";
  std::int64_t virtual_stages = 1;
  bool layered = false;
  // Virtual-clock prices (any unit): one block's forward and backward on a micro-batch,
  // and one pipeline message. Bubble fractions are reported in this clock.
  double cost_forward = 1.0, cost_backward = 2.0, cost_p2p = 0.0;
};

enum class ActivationPolicy { keep, recompute, offload };
enum class ParamPlacement { device, host };
enum class OptimizerPlacement { device, host, dynamic };
enum class DosSplit { model, all_host, all_device, alternate };

// Per transformer block (the embedding follows block 0, the final norm the last block).
struct MemoryConfig {
  std::int64_t device_budget = 0;  // bytes; 0 = no budget
  std::int64_t host_budget = 0;
  std::vector<ActivationPolicy> activations;
  std::vector<ParamPlacement> params;
  std::vector<OptimizerPlacement> optimizer;
  // Deep Optimizer States: how subgroups are split between host and device updates, and
  // the performance model's inputs (0: measured at start-up).
  DosSplit dos_split = DosSplit::model;
  double dos_host_rate = 0.0;    // host AdamW, parameters per second
  double dos_device_rate = 0.0;  // device AdamW, parameters per second
  double dos_h2d = 0.0;          // host-to-device bytes per second
  double dos_d2h = 0.0;          // device-to-host bytes per second

  // Every block on the defaults (decks get this from parsing).
  void defaults(std::int64_t layers) {
    activations.assign(static_cast<std::size_t>(layers), ActivationPolicy::keep);
    params.assign(static_cast<std::size_t>(layers), ParamPlacement::device);
    optimizer.assign(static_cast<std::size_t>(layers), OptimizerPlacement::device);
  }

  // The setting of parameter-layout layer `layer` (0 embedding, 1..L blocks, L+1 final norm).
  template <class T>
  static T of_layer(const std::vector<T>& per_block, int layer) {
    const int blocks = static_cast<int>(per_block.size());
    return per_block[static_cast<std::size_t>(std::min(std::max(layer - 1, 0), blocks - 1))];
  }
};

struct CheckpointConfig {
  std::string dir;            // default: <output.dir>/checkpoints
  std::int64_t every = 0;     // steps between checkpoints; 0: only at the end
  std::int64_t keep = 3;      // newest checkpoints kept on disk
  std::string resume;         // "", "latest" or a checkpoint file
  bool save_final = true;
};

struct OutputConfig {
  std::string dir;  // default: runs/<deck file stem>
  std::int64_t log_every = 1;
  double peak_tflops = 0.0;  // per rank, for MFU; 0: measure a GEMM at start-up
  std::int64_t sample_tokens = 0;  // text data: bytes of model output printed at the end
  double sample_temperature = 0.8;
};

struct Deck {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  ParallelConfig parallel;
  MemoryConfig memory;
  CheckpointConfig checkpoint;
  OutputConfig output;
  std::string source;         // the deck file (or "<string>")
  std::string resolved_toml;  // every key with its resolved value, as TOML
};

// Parses and validates a deck file. `overrides` are "section.key=value" strings (--set).
// Throws InputError listing every problem found, each as file:line:col: message.
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides = {});
Deck parse_deck(const std::string& text, const std::string& source_name,
                const std::vector<std::string>& overrides = {});

// Parses "12GiB", "512MB", "1e9" or a plain integer into bytes; returns false when malformed.
bool parse_bytes(const std::string& text, std::int64_t& bytes);

// Edit distance, for "did you mean" suggestions.
std::size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace lamina
