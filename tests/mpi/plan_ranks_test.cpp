// `lamina plan DECK --ranks N` run as one process, as a new user first tries it: the plan is
// made for N ranks sharing this machine, measured with all of them running at once (the
// command starts the others itself), not for N ranks each owning the whole machine.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <string>

#include "mpi_launcher.hpp"

namespace lamina::test {
namespace {

struct Command {
  int code = -1;
  std::string out;
};

Command run(const std::string& cmd) {
  Command r;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) r.out += buf;
  const int status = p == nullptr ? -1 : ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

TEST(PlanRanks, OneProcessMeasuresTheRanksItPlansForTogether) {
  const Command r = run(std::string(LAMINA_BINARY) + " plan " + LAMINA_SOURCE_DIR +
                    "/inputs/scaling-small.toml --ranks 2 --top 1 --set parallel.dp=2 --set parallel.tp=1 "
                    "--set parallel.pp=1");
  ASSERT_EQ(r.code, 0) << r.out;
#if !LAMINA_OPEN_MPI
  // Debian's MPICH (ch4:ucx) cannot start ranks from a process mpiexec did not start: the
  // fallback the warning explains (the plan is still made, as if one rank had the machine).
  if (r.out.find("MPI could not start them (MPI_Comm_spawn failed)") != std::string::npos) {
    EXPECT_NE(r.out.find("\"feasible\": true"), std::string::npos) << r.out;
    return;
  }
#endif
  EXPECT_NE(r.out.find("measuring this machine with the 2 ranks the plan is for running at once"), std::string::npos)
      << r.out;
  // The machine description is of a node of 2 ranks (measured: "all-reduce ... per rank of 2").
  EXPECT_NE(r.out.find(", 2 rank(s))\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per rank of 2"), std::string::npos) << r.out;
}

// A tensor-parallel layout is priced from its own block, timed on the ranks in groups of tp
// with the group's collectives (here with sequence parallelism's gathers and
// reduce-scatters), not from the one-rank block.
TEST(PlanRanks, ATensorParallelDegreeIsTimedWithItsCollectives) {
  const Command r = run(std::string(LAMINA_MPIRUN) + " -np 2 " + LAMINA_BINARY + " plan " + LAMINA_SOURCE_DIR +
                        "/inputs/scaling-small.toml --ranks 2 --top 1 --set parallel.dp=1 --set parallel.tp=2 "
                        "--set parallel.pp=1 --set parallel.sequence_parallel=true");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("measured at tp 2 with sequence parallelism, micro-batch 4: one block forward + backward"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("dp 1 x tp 2 (sequence parallel) x pp 1"), std::string::npos) << r.out;
}

}  // namespace
}  // namespace lamina::test
