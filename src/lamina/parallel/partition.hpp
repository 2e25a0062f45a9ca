#pragma once
// How the model's layers are cut into pipeline chunks and placed on stages. Chunks hold
// consecutive transformer blocks. Round-robin placement puts chunk c on pipeline rank
// c mod pp: pp chunks (GPipe, 1F1B), v * pp chunks (interleaved 1F1B, v chunks per rank)
// and one block per chunk (modular: layer l on rank l mod pp, Lamy-Poirier). Contiguous
// placement gives each rank a run of consecutive chunks (layer-by-layer GPipe).
// The embedding belongs to the first chunk, the final norm and LM head to the last.
#include <cstdint>
#include <string>
#include <vector>

namespace lamina {

struct Chunk {
  int index = 0;
  int stage = 0;                   // pipeline rank
  std::int64_t first_block = 0;    // blocks [first_block, last_block)
  std::int64_t last_block = 0;
  bool embedding = false, head = false;
  std::int64_t blocks() const { return last_block - first_block; }
};

class Partition {
 public:
  // `chunks` must divide `layers` and be a multiple of `stages`; throws InputError.
  static Partition make(std::int64_t layers, int stages, int chunks, bool round_robin = true);

  int stages() const { return stages_; }
  int num_chunks() const { return static_cast<int>(chunks_.size()); }
  const Chunk& chunk(int c) const { return chunks_[static_cast<std::size_t>(c)]; }
  const std::vector<Chunk>& chunks() const { return chunks_; }
  // The chunks of one stage, in model order.
  std::vector<int> chunks_of(int stage) const;
  std::string describe() const;

 private:
  int stages_ = 1;
  std::vector<Chunk> chunks_;
};

}  // namespace lamina
