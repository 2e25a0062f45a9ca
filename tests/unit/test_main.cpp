// GoogleTest main for lamina's unit tests: brings up MPI and Kokkos once for all tests
// and returns the suite's status.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    status = RUN_ALL_TESTS();
  }
  MPI_Finalize();
  return status;
}
