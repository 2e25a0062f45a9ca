#pragma once
// Checkpoints: one HDF5 file per saved step, `<dir>/step_<8 digits>.h5`, holding every
// tensor in its global shape (each rank writes its hyperslab, so any layout can read any
// slab back: resharding is a read pattern) plus the run's metadata. A file is written
// as `<name>.tmp` and renamed when complete; `<dir>/latest` names the newest complete
// file and is itself replaced atomically. Only the newest `keep` files are kept.
#include <mpi.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace lamina {

// One rank's part of one tensor, in host memory, row-major.
struct TensorSlab {
  std::string name;                        // dataset path, e.g. "model/h.0.attn.c_attn.weight"
  std::vector<std::int64_t> global_shape;
  std::vector<std::int64_t> offset, count; // this rank's hyperslab; count all zero: none
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
};

// Writes a checkpoint collectively over `comm`; returns the final path.
std::string write_checkpoint(const std::string& dir, const CheckpointMeta& meta, const std::vector<TensorSlab>& slabs,
                             std::int64_t keep, MPI_Comm comm);

// Resolves checkpoint.resume: "latest" (the file `<dir>/latest` names) or a path.
// Throws InputError when nothing usable is there.
std::string resolve_checkpoint(const std::string& resume, const std::string& dir);

CheckpointMeta read_checkpoint_meta(const std::string& path, MPI_Comm comm);
// Reads each slab; a missing tensor or a global shape that differs is an InputError.
void read_checkpoint_tensors(const std::string& path, const std::vector<TensorSlab>& slabs, MPI_Comm comm);

// Checkpoint files in a directory, oldest first.
std::vector<std::string> list_checkpoints(const std::string& dir);

}  // namespace lamina
