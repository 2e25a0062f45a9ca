#pragma once
// Dense products, all through KokkosBlas (OpenBLAS / cuBLAS / rocBLAS underneath).
#include <KokkosBlas3_gemm.hpp>

#include "lamina/kernels/common.hpp"

namespace lamina {

// C = alpha * op(A) @ op(B) + beta * C. `ta`, `tb` are "N" or "T".
template <class Exec, class AV, class BV>
void gemm(const Exec&, const char* ta, const char* tb, float alpha, const AV& A, const BV& B, float beta,
          const Mat<Exec>& C) {
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
