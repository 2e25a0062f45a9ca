#pragma once
// Typed configuration of a job, one struct per deck section that is not part of the plan
// (the model, the data, the run, the optimizer's hyperparameters, checkpoints, output).
// Layers below the command line take these (or the Plan, plan/plan.hpp), never the parsed
// deck; core/deck.hpp fills them from TOML.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "lamina/core/precision.hpp"

namespace lamina {

// How attention runs (kernels/attention.hpp): in_place on a host BLAS, probabilities saved;
// fused, flash-style, saving only each row's log-sum-exp; staged, batched vendor products
// over per-head copies.
enum class AttentionProducts { in_place, staged, fused };
const char* attention_products_name(AttentionProducts a);

// The transformer block's parts (BlockParts): GPT-2's (the defaults) or Llama's (RMSNorm,
// rotary positions, SwiGLU, no biases; its grouped-query attention is ModelConfig::kv_heads).
enum class NormKind { layernorm, rmsnorm };
enum class PositionKind { learned, rotary };
enum class MlpKind { gelu, swiglu };

// Llama 3's frequency scaling (rope_scaling {"rope_type": "llama3"}): wavelengths longer
// than original_context / low_freq_factor are stretched by factor, shorter than
// original_context / high_freq_factor kept, and those between interpolated
// (kernels/rotary.hpp). factor 0: none.
struct RotaryScaling {
  double factor = 0.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double original_context = 8192.0;
};

struct BlockParts {
  NormKind norm = NormKind::layernorm;
  double norm_eps = 1e-5;
  PositionKind position = PositionKind::learned;
  double rope_theta = 10000.0;
  RotaryScaling rope_scaling;
  MlpKind mlp = MlpKind::gelu;
  bool bias = true;  // the projections' biases
};

struct ModelConfig {
  std::int64_t layers = 0;
  std::int64_t d_model = 0;
  std::int64_t heads = 0;
  std::int64_t kv_heads = 0;    // key/value heads (grouped-query attention); 0: heads
  std::int64_t ffn_hidden = 0;  // the MLP's hidden width; 0: 4 d_model
  BlockParts parts;
  // The output layer is the token embedding (GPT-2, SmolLM, Llama 3.2 1B), or a matrix of
  // its own, lm_head (TinyLlama, Llama 3 8B).
  bool tie_embeddings = true;
  std::int64_t seq_len = 0;  // context length = size of the position table
  std::int64_t vocab_size = 0;
  double init_std = 0.02;
  std::optional<AttentionProducts> attention;  // unset: what the backend runs fastest
  // Rows of the head's logits computed at a time (0: a micro-batch's all): backward computes
  // each chunk's logits again, so that long sequences keep (loss_chunk, V) logits, not (N, V).
  std::int64_t loss_chunk = 0;
  // Initial weights: a lamina checkpoint, HuggingFace safetensors or an llm.c model file
  // ("": GPT-2's random initialisation). A resumed run reads its checkpoint instead.
  std::string init;

  std::int64_t key_value_heads() const { return kv_heads > 0 ? kv_heads : heads; }
  std::int64_t mlp_hidden() const { return ffn_hidden > 0 ? ffn_hidden : 4 * d_model; }
  // Whether tp tensor-parallel ranks can split it: whole query heads, whole key/value heads
  // (or one that tp / kv_heads ranks share), MLP columns and vocabulary rows.
  bool splits_over(std::int64_t tp) const {
    const std::int64_t kv = key_value_heads();
    return heads % tp == 0 && (kv % tp == 0 || tp % kv == 0) && mlp_hidden() % tp == 0 && vocab_size % tp == 0;
  }
};

// The MLP's hidden width when a deck leaves it out: GPT-2's 4 d_model; with SwiGLU, whose
// three matrices would hold half as many parameters again, Llama's 2/3 of that, rounded up
// to a multiple of 256.
inline std::int64_t default_ffn_hidden(const ModelConfig& m) {
  if (m.parts.mlp == MlpKind::gelu) return 4 * m.d_model;
  return (8 * m.d_model / 3 + 255) / 256 * 256;
}

enum class DataFormat { text, megatron, llmc, synthetic };
const char* data_format_name(DataFormat f);

struct DataConfig {
  DataFormat format = DataFormat::text;
  std::vector<std::string> paths;  // text/llmc: files; megatron: prefixes (P -> P.bin, P.idx)
  std::vector<std::string> eval_paths;  // held-out tokens, in the same format (none: no evaluation)
  std::int64_t batch_size = 0;        // global sequences per optimizer step
  std::int64_t micro_batch_size = 0;  // sequences per forward/backward pass on one rank
  bool shuffle = true;
};

struct TrainConfig {
  std::int64_t steps = 0;
  std::uint64_t seed = 1234;
  Precision precision = Precision::fp32;
  bool skip_nonfinite = false;  // skip steps with non-finite loss/gradients instead of stopping
  // With skip_nonfinite, this many skipped steps in a row end the run (it has diverged).
  std::int64_t max_skipped = 10;
  std::int64_t eval_every = 0;    // steps between evaluations on data.eval_path (0: at the end only)
  std::int64_t eval_batches = 0;  // batches of data.batch_size sequences per evaluation (0: the whole file)
};

// How the ranks talk ([parallel] keys that are not part of the plan).
enum class CommBackend {
  automatic,  // NCCL when the build has it and every rank has a GPU of its own, else MPI
  mpi,        // MPI, through host staging where it cannot read device memory
  nccl,
};

// Whether MPI reads device buffers as they are, or lamina stages them through host memory.
enum class MpiDeviceBuffers { automatic, direct, staged };

struct CommConfig {
  CommBackend backend = CommBackend::automatic;
  double timeout = 600.0;  // seconds a rank waits for the others before ending the job; 0 = forever
  MpiDeviceBuffers mpi_device_buffers = MpiDeviceBuffers::automatic;
  // Host builds: copies between memory tiers in the calling thread, or on worker threads
  // beside it as a device runs them (parallel.host_copies = "threads").
  bool threaded_copies = false;
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

struct CheckpointConfig {
  std::string dir;            // default: <output.dir>/checkpoints
  std::int64_t every = 0;     // steps between checkpoints; 0: only at the end
  std::int64_t keep = 3;      // newest checkpoints kept on disk
  std::string resume;         // "", "latest" or a checkpoint file
  bool save_final = true;
  // Periodic checkpoints written by a thread of their own while training goes on, where
  // MPI grants MPI_THREAD_MULTIPLE and host memory holds a copy of this rank's pieces.
  bool async = true;
  // Checkpoints in dir of steps after the one resumed from (a future the resumed run
  // abandons): "refuse" to start, "keep" them, or rename them "aside" (`.abandoned`).
  std::string newer = "refuse";
};

struct OutputConfig {
  std::string dir;  // default: runs/<deck file stem>
  std::int64_t log_every = 1;
  double peak_tflops = 0.0;  // per rank, for MFU; 0: measure a GEMM at start-up
  std::int64_t sample_tokens = 0;  // text data: bytes of model output printed at the end
  double sample_temperature = 0.8;
  std::int64_t trace_step = 0;  // > 0: every rank writes a trace of that step's instructions
};

}  // namespace lamina
