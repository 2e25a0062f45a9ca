#pragma once
// Sampling text from a model: what a byte-level demo has learnt, shown as words.
#include <cstdint>
#include <string>
#include <vector>

#include "lamina/core/memory_tracker.hpp"
#include "lamina/parallel/rank_state.hpp"

namespace lamina {

// Continues `prompt` by `count` tokens drawn from softmax(logits / temperature), with
// counter-based randomness from `seed` (the same call gives the same text). Needs the
// whole model on this rank (no tensor or pipeline split; collective over the data-parallel
// group at ZeRO-3); uses its own one-sequence activations, so the training buffers are
// left as they were.
std::vector<std::int32_t> generate_tokens(RankState& state, MemoryTracker& tracker,
                                          std::vector<std::int32_t> prompt, std::int64_t count, double temperature,
                                          std::uint64_t seed);

// The logits (min(len, seq_len) x vocab, row-major) of one sequence, under the same
// conditions as generate_tokens.
std::vector<float> sequence_logits(RankState& state, MemoryTracker& tracker, const std::vector<std::int32_t>& tokens);

// Bytes as readable text: printable ASCII and newlines kept, anything else as '?'.
std::string bytes_to_text(const std::vector<std::int32_t>& tokens);

}  // namespace lamina
