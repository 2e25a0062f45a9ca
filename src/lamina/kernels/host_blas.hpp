#pragma once
// The host BLAS called directly, for the Kokkos OpenMP backend: there lamina cuts each product
// into one tile per Kokkos thread and runs the BLAS single-threaded inside those threads, so
// that one thread pool owns the cores. Two pools (OpenMP's, spinning between kernels, and
// OpenBLAS's own) measured half the speed on two cores.
#include <cstdint>
#include <string>

#include "lamina/kernels/row_major_gemm.hpp"

namespace lamina {

// Whether the Fortran BLAS is linked (an OpenBLAS found at configure time).
constexpr bool kHostBlasLinked =
#if defined(LAMINA_HAVE_OPENBLAS)
    true;
#else
    false;
#endif

// Block `index` of `count` of the product, cut in multiples of 16 rows, or columns where C has
// fewer rows than that and more columns (the BLAS's register blocks stay whole); empty past
// the end.
RowMajorGemm gemm_tile(const RowMajorGemm& g, int index, int count);

// How many tiles are worth it for `threads` threads: one per thread, fewer for small products.
int gemm_tile_count(const RowMajorGemm& g, int threads);

// One call of the BLAS, in the calling thread. Throws when no BLAS is linked.
void host_sgemm(const RowMajorGemm& g);

// Sets the BLAS's own threads for the Kokkos host space this process runs and says what the
// host's thread pools and product engines are, e.g. "BLAS OpenBLAS 0.3.21 ..., pthreads, 1
// thread(s) per call; Kokkos OpenMP, 2 thread(s); 2 usable core(s); oneDNN 2.6.3 bf16
// products (avx512_core_bf16)": one per call under OpenMP (the BLAS runs inside Kokkos'
// threads); under Serial the cores this process may use, shared with the other ranks of the
// node where they may use the same ones (`ranks_on_node`), unless OPENBLAS_NUM_THREADS or
// OMP_NUM_THREADS says otherwise. `warning` is set where the threads are more than the cores
// this process may use.
std::string configure_host_blas(std::string& warning, int ranks_on_node = 1);

// What OMP_WAIT_POLICY=passive costs where this process runs OpenMP threads (every kernel of
// a Kokkos OpenMP build, oneDNN's bf16 products): a warning saying so, else empty. Sleeping
// threads wake for each of a step's hundreds of parallel regions: bench-torch's bf16 step
// took 1.2 times as long on a Serial build (242 against 197-205 ms), 1.3 on OpenMP (225 against 172).
std::string openmp_wait_warning();

// While it lives, the host BLAS runs one thread per call under Serial: a run whose bf16
// products go to oneDNN's OpenMP pool leaves it the cores (two pools spinning between
// their turns halve both). Under OpenMP the BLAS runs one thread per call already.
class HostBlasBesideDnnl {
 public:
  HostBlasBesideDnnl();
  ~HostBlasBesideDnnl();
  HostBlasBesideDnnl(const HostBlasBesideDnnl&) = delete;
  HostBlasBesideDnnl& operator=(const HostBlasBesideDnnl&) = delete;

 private:
  int threads_ = 0;  // to restore; 0: unchanged
};

}  // namespace lamina
