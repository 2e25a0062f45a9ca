#pragma once
// Every rank of a job must train the same deck on the same data. Ranks started with
// different decks (a stale copy on one node, a --set that differs between srun lines)
// would diverge silently and then hang in their first checkpoint. At start-up every rank
// hashes its resolved deck and the sizes of its data files; where one differs from rank
// 0's, it sends its text to rank 0, which names the first line that differs, and every
// rank exits 2.
#include <mpi.h>

#include <string>

#include "lamina/core/deck.hpp"

namespace lamina {

// What a rank's run depends on, as lines: the resolved deck, then each data and eval file
// with its size.
std::string deck_fingerprint(const Deck& deck);

// The first line where `theirs` differs from `ours`, with the deck section it lies in:
// "[optimizer] `lr = 0.001` on rank 0, `lr = 0.002` on rank 3"; "" if none.
std::string first_difference(const std::string& ours, const std::string& theirs, int their_rank);

// Throws InputError on every rank unless every rank's fingerprint equals rank 0's.
void check_ranks_agree(const Deck& deck, MPI_Comm comm);

}  // namespace lamina
