#pragma once
// Checkpoints: one HDF5 file per saved step, `<dir>/step_<8 digits>.h5`, holding every
// tensor in its global shape (each rank writes its pieces, so any process layout can read
// any piece back: resharding is a read pattern) plus the run's metadata. A file is
// written as `<name>.tmp` and renamed when complete; `<dir>/latest` names the newest
// complete file and is itself replaced atomically. Only the newest `keep` files are kept.
// A write that fails removes its `.tmp` files; a run removes those an earlier one left.
// Every tensor carries checksums (h5::write_slab); reading verifies them, that values are
// finite and attributes in range (docs/checkpoint-format.md).
// Writing and reading are collective over the communicator: every rank goes through every
// tensor in the same order, with or without a piece of its own.
#include <mpi.h>

#include <cstdint>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/io/hdf5_file.hpp"

namespace lamina {

// One tensor as this rank sees it: its pieces of the global tensor (none: the rank only
// takes part) and a row-major host array of `local_shape` that they fill in order.
struct TensorSlab {
  std::string name;  // dataset path, e.g. "model/h.0.attn.c_attn.weight"
  std::vector<std::int64_t> global_shape;
  std::vector<h5::Hyperslab> pieces;
  std::vector<std::int64_t> local_shape;
  float* data = nullptr;
};

struct CheckpointMeta {
  std::int64_t step = 0;              // optimizer steps completed
  std::int64_t samples_consumed = 0;  // data position: global samples drawn so far
  std::int64_t optimizer_step = 0;    // AdamW's t (bias correction)
  std::uint64_t seed = 0;             // all randomness derives from it (counter-based)
  std::string deck;                   // resolved deck, TOML
  std::string layout;                 // process layout that wrote it, for the log
  std::string model;                  // "layers=.. d_model=.. heads=.. seq_len=.. vocab_size=.."
  std::int64_t data_tokens = 0;       // tokens in the training data then (0: not recorded, or none)
};

class CheckpointWriter {
 public:
  // Starts `<dir>/step_<step>.h5.tmp`, creating the directory.
  CheckpointWriter(const std::string& dir, std::int64_t step, MPI_Comm comm);
  // One file outside any checkpoint directory (`lamina convert`): `path`.tmp, renamed to
  // `path` by commit(), which then touches nothing else.
  CheckpointWriter(const std::string& path, MPI_Comm comm);
  // Not committed (a write failed): closes the file and removes the temporary files.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;
  // Before the first tensor, on every rank: makes sure the file system takes `data_bytes`
  // of tensors and HDF5's own structures (space reserved where the file system can, the
  // file-size limit checked), or throws on every rank at once naming the file system and
  // the bytes. A collective HDF5 call that fails on one rank only would leave the others
  // waiting in it until parallel.timeout.
  void reserve(std::int64_t data_bytes);
  // Writes one tensor's pieces; a failure on any rank throws on every rank.
  void write(const TensorSlab& slab);
  // Writes the metadata, closes, renames, points `latest` at it, drops old files; returns the path.
  std::string commit(const CheckpointMeta& meta, std::int64_t keep);
  std::int64_t bytes_written() const { return bytes_; }  // by this rank
  // The first tensor this rank wrote that holds a NaN or an infinity, "" if none: a
  // diverged model must not replace the last good checkpoint.
  const std::string& first_nonfinite() const { return nonfinite_; }

 private:
  std::string dir_, final_path_, tmp_path_;  // dir_ empty: a single file
  MPI_Comm comm_;
  h5::Id file_;
  std::int64_t bytes_ = 0;
  std::string nonfinite_;
  bool committed_ = false;
};

class CheckpointReader {
 public:
  // Throws InputError for a missing, truncated or foreign file, and for attributes out of
  // range (a negative step, more optimizer steps than steps).
  CheckpointReader(const std::string& path, MPI_Comm comm);
  const CheckpointMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }
  // A missing tensor, a global shape that differs, a checksum that does not match or a
  // value that is not finite is an InputError naming the tensor.
  void read(const TensorSlab& slab);
  // The global shape of a dataset ("model/wte"); InputError if the file lacks it.
  std::vector<std::int64_t> shape(const std::string& name) const;
  // Tensors read so far that carried no checksum (files written before they did).
  std::int64_t unchecked() const { return unchecked_; }

 private:
  std::string path_;
  h5::Id file_;
  CheckpointMeta meta_;
  std::int64_t unchecked_ = 0;
};

// The `model` attribute: "layers=L d_model=C heads=H seq_len=T vocab_size=V", followed,
// for a block other than GPT-2's, by its block_signature (so GPT-2 checkpoints read as
// they always have).
std::string model_signature(const ModelConfig& m);
// The block's parts as deck keys: "kv_heads=8 ffn_hidden=8192 norm=rmsnorm norm_eps=1e-05
// position=rotary rope_theta=500000 mlp=swiglu" (Llama 3.2 1B's), and
// "tie_embeddings=false" for an untied output layer.
std::string block_signature(const ModelConfig& m);
// Whether the block is GPT-2's (the parts' defaults, kv_heads = heads, ffn_hidden = 4
// d_model, tied embeddings).
bool gpt2_block(const ModelConfig& m);
// Whether the block is Llama's: RMSNorm, rotary positions, SwiGLU, no biases (HuggingFace's
// LlamaForCausalLM), whatever its sizes, key/value heads and rotary base.
bool llama_block(const ModelConfig& m);
// Its converse; false for text that is not one, or a size below 1.
bool parse_model_signature(const std::string& text, ModelConfig& out);

// Resolves checkpoint.resume: "latest" (the file `<dir>/latest` names) or a path.
// Throws InputError when nothing usable is there, and for an unfinished write (`.tmp`).
std::string resolve_checkpoint(const std::string& resume, const std::string& dir);

// Points `<dir>/latest` at checkpoint file `name` in dir, atomically (a temporary file renamed).
void point_latest(const std::string& dir, const std::string& name);

// The file name the writer gives step `step`'s checkpoint: `step_<at least 8 digits>.h5`.
std::string checkpoint_name(std::int64_t step);
// The step of a name the writer made (checkpoint_name(step) + `suffix`), -1 for any other
// name: a user's `step_00000003_best.h5` or `step_notes.h5` is not lamina's.
std::int64_t checkpoint_step(const std::string& name, const std::string& suffix = "");

// Checkpoint files in a directory (names the writer makes), oldest first.
std::vector<std::string> list_checkpoints(const std::string& dir);

// Removes the temporary files of unfinished checkpoint writes in `dir` (checkpoint names
// with `.tmp`, `latest.tmp`) and nothing else; returns their paths.
std::vector<std::string> remove_partial_checkpoints(const std::string& dir);

}  // namespace lamina
