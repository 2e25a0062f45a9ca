// The process grid's choice of communicator backend (parallel.backend).
#include "lamina/parallel/process_grid.hpp"

#include <gtest/gtest.h>

#include <Kokkos_Core.hpp>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

TEST(ProcessGrid, MpiIsAlwaysAvailable) {
  const ProcessGrid grid(MPI_COMM_SELF, 1, 1, 1, 1, CommBackend::mpi);
  EXPECT_NE(grid.describe().find("communicators: MPI"), std::string::npos) << grid.describe();
  EXPECT_FALSE(grid.nccl());
}

TEST(ProcessGrid, WithoutAGpuAutomaticIsMpiAndNcclIsADeckError) {
  using Device = Kokkos::DefaultExecutionSpace::memory_space;
  if (!Kokkos::SpaceAccessibility<Kokkos::HostSpace, Device>::accessible) GTEST_SKIP() << "a GPU build";
  EXPECT_FALSE(ProcessGrid(MPI_COMM_SELF, 1, 1, 1, 1, CommBackend::automatic).nccl());
  try {
    const ProcessGrid grid(MPI_COMM_SELF, 1, 1, 1, 1, CommBackend::nccl);
    FAIL() << "NCCL was accepted without a GPU";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.backend = \"nccl\" needs a CUDA build of lamina with NCCL"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace lamina::test
