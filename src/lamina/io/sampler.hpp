#pragma once
// Which tokens make sample k. The stream is cut into windows of T+1 tokens with stride T
// (inputs and next-token targets, GPT-style); every epoch visits each window once in a
// seeded pseudo-random order. The order is a bijection computed on the fly (a Feistel
// network), so no index has to be built or stored, and the data position of a run is
// just the number of samples consumed, which checkpoints record.
#include <cstdint>

namespace lamina {

class SequenceSampler {
 public:
  // Throws InputError when the stream is shorter than one window.
  SequenceSampler(std::int64_t num_tokens, std::int64_t seq_len, std::uint64_t seed, bool shuffle);

  std::int64_t num_windows() const { return windows_; }
  // First token of global sample k (k counts across epochs).
  std::int64_t window_start(std::int64_t k) const;
  std::int64_t epoch_of(std::int64_t k) const { return k / windows_; }

 private:
  std::uint64_t permute(std::uint64_t i, std::uint64_t key) const;

  std::int64_t seq_len_;
  std::int64_t windows_;
  std::uint64_t seed_;
  bool shuffle_;
  int half_bits_ = 1;
};

}  // namespace lamina
