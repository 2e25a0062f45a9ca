#pragma once
// Dense products through KokkosBlas (OpenBLAS / cuBLAS / rocBLAS underneath); on the Kokkos
// OpenMP backend through the host BLAS, one tile per Kokkos thread (kernels/host_blas.hpp); on
// CUDA, bf16 products and batches through cuBLAS directly (kernels/device_blas.hpp).
// Products whose right operand is a weight stored in bf16 (MatRef) read it where the BLAS
// can (cuBLAS, with the left operand rounded to bf16 in a scratch a block of rows at a
// time) and elsewhere widen it into the scratch a block of columns at a time: a scratch of
// bounded size, never a saved fp32 copy of the weights.
#include <KokkosBlas3_gemm.hpp>
#include <algorithm>
#include <climits>
#include <stdexcept>
#include <type_traits>

#include "lamina/kernels/bf16.hpp"
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

// Whether products on Exec reach a BLAS that takes row strides as they are (so that a block
// of columns of C can be computed on its own): the host BLAS called directly, or cuBLAS.
template <class Exec>
constexpr bool kStridedProducts =
    kDeviceBlas<Exec> ||
    (kHostBlasLinked && Kokkos::SpaceAccessibility<Kokkos::HostSpace, typename Exec::memory_space>::accessible);

// One product in the calling thread (Serial), or tiled over the Kokkos threads (OpenMP).
template <class Exec>
void host_gemm(const Exec& exec, const RowMajorGemm& g) {
  if constexpr (kTiledOnHost<Exec>) {
    const int tiles = gemm_tile_count(g, exec.concurrency());
    if (tiles > 1) {
      Kokkos::parallel_for("lamina::gemm_tiles", Kokkos::RangePolicy<Exec>(exec, 0, tiles), GemmTiles{g, tiles});
      return;
    }
  }
  host_sgemm(g);
}

// dst (rows x cols, contiguous) = float(src[r0 + i, c0 + j])
template <class Exec>
struct WidenBlock {
  Vec<Exec> dst;
  ConstMat16<Exec> src;
  std::int64_t r0, c0, cols;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    dst(i * cols + j) = from_bf16(src(r0 + i, c0 + j));
  }
};

template <class Exec>
void widen_block(const Exec& exec, const Vec<Exec>& dst, const ConstMat16<Exec>& src, std::int64_t r0,
                 std::int64_t c0, std::int64_t rows, std::int64_t cols) {
  Kokkos::parallel_for(
      "lamina::widen_weights",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(exec, {0, 0}, {rows, cols}),
      WidenBlock<Exec>{dst, src, r0, c0, cols});
}

// dst (rows x cols, contiguous bf16) = bf16(src[r0 + i, j])
template <class Exec, class AV>
struct NarrowRows {
  Bf16Vec<Exec> dst;
  AV src;
  std::int64_t r0, cols;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t j) const {
    dst(i * cols + j) = to_bf16(src(r0 + i, j));
  }
};

}  // namespace detail

// Elements of an fp32 scratch for products on Exec whose right operands are bf16 matrices
// of at most `largest` elements and `largest_k` rows of op(B). Blocks of columns (or, on
// CUDA, of the left operand's rows) are converted 2^22 elements at a time; a BLAS reached
// only through Kokkos Kernels takes the whole matrix.
constexpr std::int64_t kProductChunk = std::int64_t{1} << 22;
template <class Exec>
constexpr std::int64_t product_scratch(std::int64_t largest, std::int64_t largest_k) {
  if (!detail::kStridedProducts<Exec>) return largest;
  const std::int64_t chunk = largest_k > kProductChunk ? largest_k : kProductChunk;
  return kDeviceBlas<Exec> || chunk < largest ? chunk : largest;
}

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
      detail::host_gemm(exec, g);
      return;
    }
  }
  // KokkosBlas::gemm takes no execution-space instance in Kokkos Kernels 3.4; it runs on
  // the default instance of the views' space, which is the compute stream.
  KokkosBlas::gemm(ta, tb, alpha, A, B, beta, C);
}

// C = alpha * A @ op(B) + beta * C, B a weight in fp32 or bf16 (MatRef). `scratch` holds
// product_scratch() elements (unused where B is fp32).
template <class Exec, class AV>
void gemm(const Exec& exec, const char* ta, const char* tb, float alpha, const AV& A, const MatRefArg<Exec>& B, float beta,
          const Mat<Exec>& C, ProductMath math, const Vec<Exec>& scratch) {
  if (!B.bf16()) {
    gemm(exec, ta, tb, alpha, A, B.f32, beta, C, math);
    return;
  }
  if (*ta != 'N') throw std::logic_error("lamina::gemm: a bf16 right operand needs an untransposed left one");
  const bool trans = *tb == 'T';
  const std::int64_t M = static_cast<std::int64_t>(C.extent(0));
  const std::int64_t K = trans ? B.cols() : B.rows(), n = trans ? B.rows() : B.cols();
  const std::int64_t room = static_cast<std::int64_t>(scratch.extent(0));
  if constexpr (!detail::kStridedProducts<Exec>) {
    detail::widen_block(exec, scratch, B.b16, 0, 0, B.rows(), B.cols());
    gemm(exec, ta, tb, alpha, A, as_mat<Exec>(scratch.data(), B.rows(), B.cols()), beta, C, math);
  } else if constexpr (kDeviceBlas<Exec>) {
#if defined(KOKKOS_ENABLE_CUDA)
    // cuBLAS reads B as it is; A's rows are rounded to bf16 a block at a time (what its
    // CUBLAS_COMPUTE_32F_FAST_16BF does to fp32 operands).
    const std::int64_t rows = std::max<std::int64_t>(1, 2 * room / std::max<std::int64_t>(K, 1));
    const Bf16Vec<Exec> a16(reinterpret_cast<std::uint16_t*>(scratch.data()), static_cast<std::size_t>(2 * room));
    for (std::int64_t r0 = 0; r0 < M; r0 += rows) {
      const std::int64_t r = std::min(rows, M - r0);
      Kokkos::parallel_for(
          "lamina::narrow_operand",
          Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(exec, {0, 0}, {r, K}),
          detail::NarrowRows<Exec, AV>{a16, A, r0, K});
      RowMajorGemm g;
      g.ta = 'N';
      g.tb = *tb;
      g.m = r;
      g.n = n;
      g.k = K;
      g.alpha = alpha;
      g.lda = K;
      g.ldb = static_cast<std::int64_t>(B.b16.stride_0());
      g.beta = beta;
      g.c = C.data() + r0 * static_cast<std::int64_t>(C.stride_0());
      g.ldc = static_cast<std::int64_t>(C.stride_0());
      device_gemm_bf16(exec.cuda_stream(), g, a16.data(), B.b16.data());
    }
#endif
  } else {
    // A block of op(B)'s columns at a time: rows of B when transposed (contiguous), else
    // a block of its columns gathered into the scratch.
    const std::int64_t width = std::max<std::int64_t>(1, room / std::max<std::int64_t>(K, 1));
    for (std::int64_t j0 = 0; j0 < n; j0 += width) {
      const std::int64_t w = std::min(width, n - j0);
      if (trans) {
        detail::widen_block(exec, scratch, B.b16, j0, 0, w, K);
      } else {
        detail::widen_block(exec, scratch, B.b16, 0, j0, K, w);
      }
      RowMajorGemm g;
      g.ta = 'N';
      g.tb = *tb;
      g.m = M;
      g.n = w;
      g.k = K;
      g.alpha = alpha;
      g.a = A.data();
      g.lda = static_cast<std::int64_t>(A.stride_0());
      g.b = scratch.data();
      g.ldb = trans ? K : w;
      g.beta = beta;
      g.c = C.data() + j0;
      g.ldc = static_cast<std::int64_t>(C.stride_0());
      detail::host_gemm(exec, g);
    }
  }
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
