#include "lamina/kernels/host_blas.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <strings.h>
#include <thread>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/host_parallel.hpp"
#include "lamina/kernels/host_dnnl.hpp"

#if defined(LAMINA_HAVE_OPENBLAS)
extern "C" {
void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k, const float* alpha,
            const float* a, const int* lda, const float* b, const int* ldb, const float* beta, float* c,
            const int* ldc);
void openblas_set_num_threads(int threads);
int openblas_get_num_threads();
int openblas_get_parallel();
char* openblas_get_config();
}
#endif

namespace lamina {

namespace {

constexpr std::int64_t kTileMultiple = 16;
// Below this many multiply-adds per tile the fork costs more than the tile saves.
constexpr std::int64_t kMinTileWork = std::int64_t{1} << 18;

int blas_int(std::int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) {
    throw RunError(strprintf("host GEMM: %s = %lld does not fit the BLAS's 32-bit integers", what,
                             static_cast<long long>(v)));
  }
  return static_cast<int>(v);
}

}  // namespace

RowMajorGemm gemm_tile(const RowMajorGemm& g, int index, int count) {
  RowMajorGemm t = g;
  // Rows wherever each tile gets whole blocks of them: with OpenBLAS as fast as columns or up
  // to 9 % faster for every product of the model measured, even where C is wider than tall.
  const bool by_rows = g.m >= count * kTileMultiple || g.m >= g.n;
  const std::int64_t side = by_rows ? g.m : g.n;
  std::int64_t chunk = (side + count - 1) / std::max(count, 1);
  chunk = (chunk + kTileMultiple - 1) / kTileMultiple * kTileMultiple;
  const std::int64_t begin = std::min(side, chunk * index);
  const std::int64_t size = std::min(side, begin + chunk) - begin;
  if (by_rows) {  // rows of C: rows of op(A)
    t.m = size;
    t.a = g.a + (g.ta == 'N' ? begin * g.lda : begin);
    t.c = g.c + begin * g.ldc;
  } else {  // columns of C: columns of op(B)
    t.n = size;
    t.b = g.b + (g.tb == 'N' ? begin : begin * g.ldb);
    t.c = g.c + begin;
  }
  return t;
}

int gemm_tile_count(const RowMajorGemm& g, int threads) {
  const std::int64_t side = std::max(g.m, g.n);
  const std::int64_t work = g.m * g.n * std::max<std::int64_t>(g.k, 1);
  const std::int64_t by_side = (side + kTileMultiple - 1) / kTileMultiple;
  const std::int64_t by_work = std::max<std::int64_t>(1, work / kMinTileWork);
  return static_cast<int>(std::max<std::int64_t>(1, std::min({std::int64_t{threads}, by_side, by_work})));
}

void host_sgemm(const RowMajorGemm& g) {
  if (g.m == 0 || g.n == 0) return;
#if defined(LAMINA_HAVE_OPENBLAS)
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same memory with the
  // operands swapped and the transpose flags unchanged.
  const int m = blas_int(g.n, "n"), n = blas_int(g.m, "m"), k = blas_int(g.k, "k");
  const int ldb = blas_int(std::max<std::int64_t>(g.ldb, 1), "ldb");
  const int lda = blas_int(std::max<std::int64_t>(g.lda, 1), "lda");
  const int ldc = blas_int(std::max<std::int64_t>(g.ldc, 1), "ldc");
  sgemm_(&g.tb, &g.ta, &m, &n, &k, &g.alpha, g.b, &ldb, g.a, &lda, &g.beta, g.c, &ldc);
#else
  throw RunError("host GEMM: lamina was built without a BLAS it can call directly (OpenBLAS)");
#endif
}

HostBlasBesideDnnl::HostBlasBesideDnnl() {
#if defined(LAMINA_HAVE_OPENBLAS)
  if (Kokkos::DefaultHostExecutionSpace().concurrency() > 1) return;
  threads_ = openblas_get_num_threads();
  openblas_set_num_threads(1);
#endif
}

std::string openmp_wait_warning() {
  const char* policy = std::getenv("OMP_WAIT_POLICY");
  if (policy == nullptr || strcasecmp(policy, "passive") != 0) return {};
  const bool kokkos = std::string(Kokkos::DefaultHostExecutionSpace::name()) == "OpenMP";
  if (!kokkos && !host_bf16_products()) return {};
  return strprintf("OMP_WAIT_POLICY=%s puts OpenMP's threads to sleep between parallel regions, and a step has "
                   "hundreds (%s): waking them made bench-torch's bf16 step 1.2-1.3 times as long; unset it",
                   policy, kokkos ? "every kernel, each bf16 product" : "each bf16 product on oneDNN");
}

HostBlasBesideDnnl::~HostBlasBesideDnnl() {
#if defined(LAMINA_HAVE_OPENBLAS)
  if (threads_ > 0) openblas_set_num_threads(threads_);
#endif
}

std::string configure_host_blas(std::string& warning, int ranks_on_node) {
  using Host = Kokkos::DefaultHostExecutionSpace;
  const int kokkos_threads = Host().concurrency();
  const int cores = usable_cores();
  std::string blas = "BLAS through Kokkos Kernels";
  int blas_threads = 0;
  // Ranks not pinned to cores of their own (all of the machine's usable) share them.
  const int all = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cores < all ? cores : cores / std::max(1, ranks_on_node));
  const bool serial = std::string(Host::name()) == "Serial";
  if (serial && std::getenv("OMP_NUM_THREADS") == nullptr) set_host_product_threads(share);
#if defined(LAMINA_HAVE_OPENBLAS)
  const bool kokkos_tiles = std::string(Host::name()) == "OpenMP" && kokkos_threads > 1;
  if (kokkos_tiles) {
    openblas_set_num_threads(1);
  } else if (std::getenv("OPENBLAS_NUM_THREADS") == nullptr && std::getenv("OMP_NUM_THREADS") == nullptr) {
    openblas_set_num_threads(share);
  }
  blas_threads = openblas_get_num_threads();
  const int parallel = openblas_get_parallel();
  blas = strprintf("BLAS %s, %s, %d thread(s) per call", openblas_get_config(),
                   parallel == 0   ? "sequential"
                   : parallel == 2 ? "OpenMP"
                                   : "pthreads",
                   blas_threads);
  if (!kokkos_tiles && host_bf16_products()) blas += " (1 in bf16 runs, beside oneDNN)";  // HostBlasBesideDnnl
#endif
  warning.clear();
  if (cores * ranks_on_node < all) {
    warning = strprintf("the %d rank(s) on this node may use %d of its %d cores (each rank is bound to %d): the rest "
                        "stay idle; start more ranks, or let them use more cores (mpirun --bind-to none)",
                        ranks_on_node, cores * ranks_on_node, all, cores);
  } else if (kokkos_threads > cores) {
    warning = strprintf("Kokkos %s runs %d threads on %d usable core(s): they take turns at every kernel; set "
                        "OMP_NUM_THREADS=%d (or fewer ranks per node)",
                        Host::name(), kokkos_threads, cores, cores);
  } else if (kokkos_threads == 1 && blas_threads > cores) {
    warning = strprintf("the BLAS runs %d threads on %d usable core(s); set OPENBLAS_NUM_THREADS=%d", blas_threads,
                        cores, cores);
  }
  return strprintf("host threads: %s; Kokkos %s, %d thread(s); %d usable core(s); %s", blas.c_str(), Host::name(),
                   kokkos_threads, cores, host_product_engine().c_str());
}

}  // namespace lamina
