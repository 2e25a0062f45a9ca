#pragma once
// Dense products through KokkosBlas (OpenBLAS / cuBLAS / rocBLAS underneath); on the Kokkos
// OpenMP backend through the host BLAS, one tile per Kokkos thread (kernels/host_blas.hpp); on
// CUDA, bf16 products and batches through cuBLAS directly (kernels/device_blas.hpp).
#include <KokkosBlas3_gemm.hpp>
#include <climits>
#include <type_traits>

#include "lamina/kernels/common.hpp"
#include "lamina/kernels/device_blas.hpp"
#include "lamina/kernels/host_blas.hpp"

namespace lamina {

namespace detail {

template <class AV, class BV, class CV>
RowMajorGemm row_major_gemm(const char* ta, const char* tb, float alpha, const AV& A, const BV& B, float beta, const CV& C) {
  RowMajorGemm g;
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

inline bool fits_blas_int(const RowMajorGemm& g) {
  for (std::int64_t v : {g.m, g.n, g.k, g.lda, g.ldb, g.ldc}) {
    if (v > INT_MAX) return false;
  }
  return true;
}

struct GemmTiles {
  RowMajorGemm g;
  int count;
  void operator()(const int i) const { host_sgemm(gemm_tile(g, i, count)); }
};

// Product i of a batch: the first product's operands moved by i strides.
struct HostGemmBatch {
  RowMajorGemm g;
  GemmBatch batch;
  void operator()(const int i) const {
    RowMajorGemm p = g;
    p.a += i * batch.stride_a;
    p.b += i * batch.stride_b;
    p.c += i * batch.stride_c;
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

// C = alpha * op(A) @ op(B) + beta * C. `ta`, `tb` are "N" or "T". `math`: how the operands
// are read where the device's BLAS offers a choice (ProductMath), else fp32.
template <class Exec, class AV, class BV>
void gemm(const Exec& exec, const char* ta, const char* tb, float alpha, const AV& A, const BV& B, float beta,
          const Mat<Exec>& C, [[maybe_unused]] ProductMath math = ProductMath::fp32) {
  static_assert(std::is_same<typename AV::array_layout, Kokkos::LayoutRight>::value &&
                    std::is_same<typename BV::array_layout, Kokkos::LayoutRight>::value,
                "the BLAS called directly reads operands as row-major matrices");
#if defined(KOKKOS_ENABLE_CUDA)
  if constexpr (kDeviceBlas<Exec>) {
    // fp32 products stay with Kokkos Kernels; it has no bf16 compute type for fp32 operands.
    if (math == ProductMath::bf16) {
      device_gemm(exec.cuda_stream(), math, detail::row_major_gemm(ta, tb, alpha, A, B, beta, C), GemmBatch{});
      return;
    }
  }
#endif
  if constexpr (detail::kTiledOnHost<Exec>) {
    const RowMajorGemm g = detail::row_major_gemm(ta, tb, alpha, A, B, beta, C);
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
// `math` as for gemm.
template <class Exec>
void batched_gemm(const Exec& exec, const char* ta, const char* tb, float alpha, const ConstMats<Exec>& A,
                  const ConstMats<Exec>& B, float beta, const Mats<Exec>& C,
                  [[maybe_unused]] ProductMath math = ProductMath::fp32) {
  const std::int64_t count = static_cast<std::int64_t>(C.extent(0));
  if (count == 0) return;
  const RowMajorGemm first =
      detail::row_major_gemm(ta, tb, alpha, Kokkos::subview(A, 0, Kokkos::ALL, Kokkos::ALL),
                             Kokkos::subview(B, 0, Kokkos::ALL, Kokkos::ALL), beta,
                             Kokkos::subview(C, 0, Kokkos::ALL, Kokkos::ALL));
  const GemmBatch batch{count, static_cast<std::int64_t>(A.stride_0()), static_cast<std::int64_t>(B.stride_0()),
                        static_cast<std::int64_t>(C.stride_0())};
  if constexpr (kDeviceBlas<Exec>) {
#if defined(KOKKOS_ENABLE_CUDA)
    device_gemm(exec.cuda_stream(), math, first, batch);  // one launch, not one per matrix
#endif
  } else {
    if constexpr (detail::kTiledOnHost<Exec>) {
      // One whole product per thread when there are enough of them; else each one tiled.
      if (count >= exec.concurrency() && count > 1 && detail::fits_blas_int(first)) {
        Kokkos::parallel_for("lamina::gemm_batch", Kokkos::RangePolicy<Exec>(exec, 0, count),
                             detail::HostGemmBatch{first, batch});
        return;
      }
    }
    for (std::int64_t i = 0; i < count; ++i) {
      auto a = Kokkos::subview(A, i, Kokkos::ALL, Kokkos::ALL);
      auto b = Kokkos::subview(B, i, Kokkos::ALL, Kokkos::ALL);
      Mat<Exec> c = Kokkos::subview(C, i, Kokkos::ALL, Kokkos::ALL);
      gemm(exec, ta, tb, alpha, a, b, beta, c);
    }
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
