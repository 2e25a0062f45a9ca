#pragma once
// Dense products through KokkosBlas (OpenBLAS / cuBLAS / rocBLAS underneath); on the Kokkos
// OpenMP backend through the host BLAS, one tile per Kokkos thread (kernels/host_blas.hpp).
#include <KokkosBlas3_gemm.hpp>
#include <climits>
#include <type_traits>

#include "lamina/kernels/common.hpp"
#include "lamina/kernels/host_blas.hpp"

namespace lamina {

namespace detail {

template <class AV, class BV, class CV>
HostGemm host_gemm(const char* ta, const char* tb, float alpha, const AV& A, const BV& B, float beta, const CV& C) {
  HostGemm g;
  g.ta = *ta;
  g.tb = *tb;
  g.m = static_cast<std::int64_t>(C.extent(0));
  g.n = static_cast<std::int64_t>(C.extent(1));
  g.k = static_cast<std::int64_t>(g.ta == 'N' ? A.extent(1) : A.extent(0));
  g.alpha = alpha;
  g.a = A.data();
  g.lda = static_cast<std::int64_t>(A.stride_0());
  g.b = B.data();
  g.ldb = static_cast<std::int64_t>(B.stride_0());
  g.beta = beta;
  g.c = C.data();
  g.ldc = static_cast<std::int64_t>(C.stride_0());
  return g;
}

inline bool fits_blas_int(const HostGemm& g) {
  for (std::int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc}) {
    if (v > INT_MAX) return false;
  }
  return true;
}

struct GemmTiles {
  HostGemm g;
  int count;
  void operator()(const int i) const { host_sgemm(gemm_tile(g, i, count)); }
};

// Product i of a batch: the first product's operands moved by i whole matrices.
struct GemmBatch {
  HostGemm g;
  std::int64_t stride_a, stride_b, stride_c;
  void operator()(const int i) const {
    HostGemm p = g;
    p.a += i * stride_a;
    p.b += i * stride_b;
    p.c += i * stride_c;
    host_sgemm(p);
  }
};

#if defined(KOKKOS_ENABLE_OPENMP)
template <class Exec>
constexpr bool kTiledOnHost = kHostBlasLinked && std::is_same<Exec, Kokkos::OpenMP>::value;
#else
template <class Exec>
constexpr bool kTiledOnHost = false;
#endif

}  // namespace detail

// C = alpha * op(A) @ op(B) + beta * C. `ta`, `tb` are "N" or "T".
template <class Exec, class AV, class BV>
void gemm(const Exec& exec, const char* ta, const char* tb, float alpha, const AV& A, const BV& B, float beta,
          const Mat<Exec>& C) {
  if constexpr (detail::kTiledOnHost<Exec>) {
    static_assert(std::is_same<typename AV::array_layout, Kokkos::LayoutRight>::value &&
                      std::is_same<typename BV::array_layout, Kokkos::LayoutRight>::value,
                  "the host BLAS path reads operands as row-major matrices");
    const HostGemm g = detail::host_gemm(ta, tb, alpha, A, B, beta, C);
    if (detail::fits_blas_int(g)) {
      const int tiles = gemm_tile_count(g, exec.concurrency());
      if (tiles == 1) {
        host_sgemm(g);
      } else {
        Kokkos::parallel_for("lamina::gemm_tiles", Kokkos::RangePolicy<Exec>(exec, 0, tiles),
                             detail::GemmTiles{g, tiles});
      }
      return;
    }
  }
  // KokkosBlas::gemm takes no execution-space instance in Kokkos Kernels 3.4; it runs on
  // the default instance of the views' space, which is the compute stream.
  KokkosBlas::gemm(ta, tb, alpha, A, B, beta, C);
}

// The same product for every matrix of a batch: C[i] = alpha * op(A[i]) @ op(B[i]) + beta * C[i].
// Each slice is a contiguous row-major matrix, so every product reaches the vendor BLAS.
template <class Exec>
void batched_gemm(const Exec& exec, const char* ta, const char* tb, float alpha, const ConstMats<Exec>& A,
                  const ConstMats<Exec>& B, float beta, const Mats<Exec>& C) {
  const std::int64_t batch = static_cast<std::int64_t>(C.extent(0));
  if constexpr (detail::kTiledOnHost<Exec>) {
    // One whole product per thread when there are enough of them; else each one tiled.
    if (batch >= exec.concurrency() && batch > 1) {
      auto a = Kokkos::subview(A, 0, Kokkos::ALL, Kokkos::ALL);
      auto b = Kokkos::subview(B, 0, Kokkos::ALL, Kokkos::ALL);
      auto c = Kokkos::subview(C, 0, Kokkos::ALL, Kokkos::ALL);
      const HostGemm g = detail::host_gemm(ta, tb, alpha, a, b, beta, c);
      if (detail::fits_blas_int(g)) {
        Kokkos::parallel_for("lamina::gemm_batch", Kokkos::RangePolicy<Exec>(exec, 0, batch),
                             detail::GemmBatch{g, static_cast<std::int64_t>(A.stride_0()),
                                               static_cast<std::int64_t>(B.stride_0()),
                                               static_cast<std::int64_t>(C.stride_0())});
        return;
      }
    }
  }
  for (std::int64_t i = 0; i < batch; ++i) {
    auto a = Kokkos::subview(A, i, Kokkos::ALL, Kokkos::ALL);
    auto b = Kokkos::subview(B, i, Kokkos::ALL, Kokkos::ALL);
    Mat<Exec> c = Kokkos::subview(C, i, Kokkos::ALL, Kokkos::ALL);
    gemm(exec, ta, tb, alpha, a, b, beta, c);
  }
}

// dst(C) += sum over rows of M(N, C). `ones` holds at least N ones. A product with a
// ones row keeps the reduction in the BLAS: fast, parallel and deterministic.
template <class Exec>
void add_column_sums(const Exec& exec, const Vec<Exec>& dst, const ConstMat<Exec>& M, const ConstVec<Exec>& ones) {
  const std::int64_t n = static_cast<std::int64_t>(M.extent(0));
  const std::int64_t c = static_cast<std::int64_t>(M.extent(1));
  Kokkos::View<const float**, Kokkos::LayoutRight, typename Exec::memory_space, Kokkos::MemoryTraits<Kokkos::Unmanaged>>
      ones_row(ones.data(), 1, n);
  gemm(exec, "N", "N", 1.0f, ones_row, M, 1.0f, as_mat<Exec>(dst.data(), 1, c));
}

}  // namespace lamina
