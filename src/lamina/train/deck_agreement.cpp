#include "lamina/train/deck_agreement.hpp"

#include <cstdint>
#include <filesystem>
#include <sstream>
#include <vector>

#include "lamina/comm/mpi_communicator.hpp"
#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/io/token_dataset.hpp"

namespace lamina {

namespace fs = std::filesystem;

namespace {

std::uint64_t fnv1a(const std::string& s) {
  std::uint64_t h = 1469598103934665603ull;
  for (const unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

void add_files(std::string& out, const char* key, const std::vector<std::string>& patterns) {
  if (patterns.empty()) return;
  std::vector<std::string> paths;
  try {
    paths = expand_paths(patterns);
  } catch (const Error& e) {
    out += strprintf("%s: %s\n", key, e.what());  // reported where it is read; here it only has to agree
    return;
  }
  for (const auto& p : paths) {
    // Megatron prefixes name two files.
    for (const std::string& f : {p, p + ".bin", p + ".idx"}) {
      std::error_code ec;
      const auto size = fs::file_size(f, ec);
      if (!ec) out += strprintf("%s file %s: %llu bytes\n", key, f.c_str(), static_cast<unsigned long long>(size));
    }
  }
}

}  // namespace

std::string deck_fingerprint(const Deck& deck) {
  std::string out = deck.resolved_toml;
  if (!out.empty() && out.back() != '\n') out += '\n';
  if (deck.data.format != DataFormat::synthetic) add_files(out, "data.path", deck.data.paths);
  add_files(out, "data.eval_path", deck.data.eval_paths);
  return out;
}

std::string first_difference(const std::string& ours, const std::string& theirs, int their_rank) {
  std::istringstream a(ours), b(theirs);
  std::string x, y, section;
  while (true) {
    const bool more_a = static_cast<bool>(std::getline(a, x)), more_b = static_cast<bool>(std::getline(b, y));
    if (!more_a && !more_b) return "";
    if (!more_a) x = "(nothing)";
    if (!more_b) y = "(nothing)";
    if (x != y) {
      return strprintf("%s`%s` on rank 0, `%s` on rank %d", section.empty() ? "" : (section + " ").c_str(), x.c_str(),
                       y.c_str(), their_rank);
    }
    if (x.size() > 1 && x.front() == '[') section = x;
  }
}

void check_ranks_agree(const Deck& deck, MPI_Comm comm) {
  int rank = 0, world = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &world);
  if (world == 1) return;
  const std::string mine = deck_fingerprint(deck);
  const unsigned long long hash = fnv1a(mine);
  std::vector<unsigned long long> all(static_cast<std::size_t>(world));
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Iallgather(&hash, 1, MPI_UNSIGNED_LONG_LONG, all.data(), 1, MPI_UNSIGNED_LONG_LONG, comm, &r);
  wait_bounded(r, "MPI_Iallgather of the ranks' deck hashes");
  int first = -1;
  for (int i = 1; i < world && first < 0; ++i) {
    if (all[static_cast<std::size_t>(i)] != all[0]) first = i;
  }
  if (first < 0) return;
  const std::string advice = "every rank of a job must start with the same deck, --set arguments and data files";
  if (rank == first) {
    int n = static_cast<int>(mine.size());
    MPI_Isend(&n, 1, MPI_INT, 0, 0, comm, &r);
    wait_bounded(r, "MPI_Isend of this rank's deck to rank 0");
    MPI_Isend(mine.data(), n, MPI_CHAR, 0, 1, comm, &r);
    wait_bounded(r, "MPI_Isend of this rank's deck to rank 0");
  }
  if (rank != 0) {
    // Rank 0 names the difference and takes the job down. An abort from here could end
    // rank 0 before it prints: wait for it (a barrier rank 0 never enters), and report
    // alone only if it does not come.
    MPI_Ibarrier(comm, &r);
    try {
      wait_bounded(r, "rank 0 to report how the ranks' decks differ");
    } catch (const TimeoutError&) {
    }
    throw InputError(strprintf("rank %d's deck or data differ from rank 0's (rank 0 names the first difference): %s",
                               first, advice.c_str()));
  }
  int n = 0;
  MPI_Irecv(&n, 1, MPI_INT, first, 0, comm, &r);
  wait_bounded(r, "MPI_Irecv of a differing rank's deck");
  std::string theirs(static_cast<std::size_t>(n), '\0');
  MPI_Irecv(&theirs[0], n, MPI_CHAR, first, 1, comm, &r);
  wait_bounded(r, "MPI_Irecv of a differing rank's deck");
  throw InputError(strprintf("%s: ranks run different decks or data: %s; %s", deck.source.c_str(),
                             first_difference(mine, theirs, first).c_str(), advice.c_str()));
}

}  // namespace lamina
