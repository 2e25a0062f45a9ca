#pragma once
// `lamina plan`: the planner from the command line (a readable table of the best plan and
// the runners-up, then one JSON object), and the start-up of `lamina train` for decks that
// set planner keys to "auto".
#include <mpi.h>

#include <string>
#include <vector>

#include "lamina/core/deck.hpp"
#include "lamina/core/log.hpp"
#include "lamina/plan/planner.hpp"

namespace lamina {

struct PlanCommand {
  std::string deck;
  std::vector<std::string> sets;
  int ranks = 0;        // 0: dp x tp x pp when the deck fixes them, else the ranks this runs on
  std::string machine;  // a description file; empty: measure this machine
  Solver solver = Solver::dp;
  int top = 3;
  int threads = 0;  // threads of the search (0: the cores this process may use)
  std::string write_deck;
  double tokens = 0.0;  // > 0: days to train on that many tokens
  // The shortest time to train on `tokens`: the best plan of each family on clusters up to
  // max_ranks at no more than the critical batch (or the deck's, with deck_batch).
  bool shortest_time = false;
  int max_ranks = 16384;
  bool deck_batch = false;
  std::string write_sweep;  // CSV of every cluster size and family
};

// Collective over `comm` (measuring this machine); rank 0 prints. Returns the exit code:
// 0, or 2 when no plan fits.
int run_plan_command(const PlanCommand& cmd, const Log& log, MPI_Comm comm);

// For a deck with "auto" keys: plans them on rank 0 for the ranks of `comm` on this
// machine, logs the plan, and returns the --set overrides that fix them (the same on every
// rank). Throws InputError when nothing fits.
std::vector<std::string> plan_auto_keys(const Deck& deck, const Log& log, MPI_Comm comm);

}  // namespace lamina
