#pragma once
// The counts a run keeps, and the largest values lamina accepts for them from a deck or a
// checkpoint: small enough that no arithmetic on them overflows (steps plus one; samples
// times the tokens of a sample; the learning-rate schedule), far beyond any real run
// (2^40 steps at a step per millisecond take 35 years).
#include <cstdint>

namespace lamina {

constexpr std::int64_t kMaxSteps = std::int64_t{1} << 40;
// Tokens a run may read in all: samples consumed x (seq_len + 1).
constexpr std::int64_t kMaxTokens = std::int64_t{1} << 62;

}  // namespace lamina
