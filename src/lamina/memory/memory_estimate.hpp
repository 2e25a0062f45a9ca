#pragma once
// Bytes a run will allocate, per memory space and category, predicted from the deck
// with the same size formulas the allocations use (model/gpt_activations.hpp).
#include <cstdint>
#include <map>
#include <string>

#include "lamina/core/deck.hpp"

namespace lamina {

struct MemoryEstimate {
  // space -> category -> bytes, for one rank of the pipeline stage that needs the most
  std::map<std::string, std::map<std::string, std::int64_t>> bytes;
  int stage = 0;
  std::int64_t total(const std::string& space) const;
};

// The pipeline stage that needs the most (all stages hold the same at pp = 1).
MemoryEstimate estimate_memory(const Deck& deck);
// One rank of one pipeline stage.
MemoryEstimate estimate_memory(const Deck& deck, int stage);

// Throws InputError when a budget in deck.memory is exceeded, naming what does not fit.
void check_memory_budget(const Deck& deck, const MemoryEstimate& estimate);

std::string format_memory_estimate(const MemoryEstimate& estimate);

}  // namespace lamina
