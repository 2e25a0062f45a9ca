#pragma once
// How fast a model can be trained at all (Lamy-Poirier 2021): the batch is capped by the
// critical batch size, beyond which more samples per step stop saving steps (McCandlish et
// al. 2018; Kaplan et al. 2020); a pipeline needs enough micro-batches per step to hide its
// bubble, so a batch can keep only so many devices busy; and layered gradient
// accumulation with modular pipelines needs fewer micro-batches per stage, so the same
// batch feeds more devices. The sweep below plans (with the planner and its simulator)
// the fastest plan of each family on growing clusters at a batch no larger than the
// critical one, and the days each takes to train on a number of tokens.
//
// Scaling laws (Kaplan et al. 2020, eq. 1.5 and 1.4 / table 1), N non-embedding parameters
// (12 L d^2), D training tokens, loss in nats:
//   L(N, D)  = [ (N_c / N)^(a_N / a_D) + D_c / D ]^a_D,   N_c = 8.8e13, D_c = 5.4e13,
//                                                         a_N = 0.076, a_D = 0.095
//   B_crit(L) = B_* / L^(1 / a_B),                         B_* = 2e8 tokens, a_B = 0.21
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "lamina/plan/planner.hpp"

namespace lamina {

double expected_loss(double non_embedding_params, double tokens);
double critical_batch_tokens(double loss);

// The devices a batch of `sequences` keeps busy at tensor-parallel degree tp, one sequence
// per micro-batch: a standard pipeline wants about 4 micro-batches per stage (its bubble
// (p-1)/(M+p-1) then stays under 20%), so dp x pp <= sequences / 4; layered accumulation
// with modular pipelines needs one per stage (its bubble (p-1)/(m M + p-1) shrinks with
// the layers per stage m), so dp x pp <= sequences.
std::int64_t devices_fed(std::int64_t sequences, int tp, Family family);

// The layered family's plans include the standard ones (layered accumulation and modular
// pipelines are options it may take or not), so it is never slower; a row of it takes the
// standard plan where the search found that faster.
struct SweepRow {
  int ranks = 0;
  Family family = Family::standard;
  bool feasible = false;
  PlanCandidate best;
  double tokens_per_s = 0.0, mfu = 0.0, days = 0.0;
  std::int64_t batch_sequences = 0;
};

// Whether a row trains faster than the shortest found so far (its family's rows come in
// growing cluster sizes): by more than the last bits of the sums that price them, so that
// of equal times the fewest devices count (a modular ring's step stops falling once its
// first micro-batch's way round is the step).
bool trains_faster(const SweepRow& row, const SweepRow& shortest);

struct ShortestTime {
  double loss = 0.0;                   // the model's expected loss after training
  double critical_batch_tokens = 0.0;  // the cap on the batch
  std::int64_t batch_sequences = 0;    // the cap in sequences (or the deck's batch)
  std::vector<SweepRow> rows;          // per cluster size and family
  // The shortest time of each family and the cluster size it needs (index into rows; -1: none).
  int shortest_standard = -1, shortest_layered = -1;
};

// deck_batch: use the deck's data.batch_size at every size instead of the critical batch.
// Cluster sizes: powers of two up to max_ranks (and max_ranks itself).
// progress: called after each (size, family) is planned.
ShortestTime shortest_time(const Deck& deck, const MachineSpec& machine, double tokens, int max_ranks,
                           bool deck_batch, const PlannerOptions& base,
                           const std::function<void(const SweepRow&, double seconds)>& progress = {});

const char* family_name(Family f);

}  // namespace lamina
