#pragma once
// `lamina train`: runs a deck to completion (or to a failure with a clear exit code),
// writing the log, metrics.jsonl, the resolved deck and checkpoints.
#include <mpi.h>

#include <cstdint>

#include "lamina/core/deck.hpp"
#include "lamina/core/log.hpp"

namespace lamina {

struct TrainSummary {
  std::int64_t first_step = 0;  // steps already done when this run started (resume)
  std::int64_t last_step = 0;   // steps done at the end
  double final_loss = 0.0;
  double mean_step_ms = 0.0;
};

TrainSummary run_training(const Deck& deck, const Log& log, MPI_Comm comm);

// `lamina eval`: the deck's model with the weights of checkpoint.resume (or model.init) on
// data.eval_path, in the deck's layout; logs the loss and perplexity, appends them to
// metrics.jsonl and returns the loss.
double run_evaluation(const Deck& deck, const Log& log, MPI_Comm comm);

// `lamina train --check`: validates what can be validated without training (data files,
// checkpoint to resume, memory budget) and prints the resolved deck and memory estimate.
void check_deck(const Deck& deck, const Log& log, int world = 0);

}  // namespace lamina
