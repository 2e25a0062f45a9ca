// GoogleTest main for lamina's unit tests: brings up MPI and Kokkos once for all tests
// and returns the suite's status.
#include <gtest/gtest.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>

int main(int argc, char** argv) {
  int threads = 0;  // as lamina asks: background checkpoints write from a thread of their own
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &threads);
  ::testing::InitGoogleTest(&argc, argv);
  int status = 0;
  {
    Kokkos::ScopeGuard kokkos(argc, argv);
    status = RUN_ALL_TESTS();
  }
  MPI_Finalize();
  return status;
}
