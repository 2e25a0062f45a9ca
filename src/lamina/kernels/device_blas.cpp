#include "lamina/kernels/device_blas.hpp"

#include <cublas_v2.h>

#include <algorithm>
#include <climits>
#include <stdexcept>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

namespace {

void check(cublasStatus_t rc, const char* what) {
  if (rc != CUBLAS_STATUS_SUCCESS) throw RunError(strprintf("cuBLAS: %s failed: %s", what, cublasGetStatusString(rc)));
}

// One handle per process, made on first use and destroyed when Kokkos finalizes (before the
// CUDA context goes). Products are issued from one host thread, so the handle is not shared.
cublasHandle_t& handle_slot() {
  static cublasHandle_t h = nullptr;
  return h;
}

cublasHandle_t handle() {
  cublasHandle_t& h = handle_slot();
  if (h == nullptr) {
    check(cublasCreate(&h), "cublasCreate");
    Kokkos::push_finalize_hook([] {
      cublasDestroy(handle_slot());
      handle_slot() = nullptr;
    });
  }
  return h;
}

int blas_int(std::int64_t v, const char* what) {
  if (v < 0 || v > INT_MAX) throw RunError(strprintf("cuBLAS: %s = %lld does not fit its int", what, static_cast<long long>(v)));
  return static_cast<int>(v);
}

cublasOperation_t op(char t) { return t == 'T' ? CUBLAS_OP_T : CUBLAS_OP_N; }

}  // namespace

void device_gemm(cudaStream_t stream, ProductMath math, const RowMajorGemm& g, const GemmBatch& batch) {
  if (g.m == 0 || g.n == 0 || batch.count == 0) return;
  cublasHandle_t h = handle();
  check(cublasSetStream(h, stream), "cublasSetStream");
  const cublasComputeType_t compute = math == ProductMath::bf16 ? CUBLAS_COMPUTE_32F_FAST_16BF : CUBLAS_COMPUTE_32F;
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: the same memory with the
  // operands swapped and the transpose flags unchanged.
  const int m = blas_int(g.n, "n"), n = blas_int(g.m, "m"), k = blas_int(g.k, "k");
  const int ldb = blas_int(std::max<std::int64_t>(g.ldb, 1), "ldb");
  const int lda = blas_int(std::max<std::int64_t>(g.lda, 1), "lda");
  const int ldc = blas_int(std::max<std::int64_t>(g.ldc, 1), "ldc");
  if (batch.count == 1) {
    check(cublasGemmEx(h, op(g.tb), op(g.ta), m, n, k, &g.alpha, g.b, CUDA_R_32F, ldb, g.a, CUDA_R_32F, lda, &g.beta,
                       g.c, CUDA_R_32F, ldc, compute, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx");
    return;
  }
  check(cublasGemmStridedBatchedEx(h, op(g.tb), op(g.ta), m, n, k, &g.alpha, g.b, CUDA_R_32F, ldb, batch.stride_b,
                                   g.a, CUDA_R_32F, lda, batch.stride_a, &g.beta, g.c, CUDA_R_32F, ldc,
                                   batch.stride_c, blas_int(batch.count, "batch"), compute, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx");
}

namespace {

// Products on bf16 operands summed in fp32, written as `c_type` (fp32, or bf16 rounded to
// nearest by cuBLAS's epilogue).
void gemm_bf16_operands(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a, const std::uint16_t* b,
                        void* c, cudaDataType_t c_type, const GemmBatch& batch) {
  if (g.m == 0 || g.n == 0 || batch.count == 0) return;
  cublasHandle_t h = handle();
  check(cublasSetStream(h, stream), "cublasSetStream");
  const int m = blas_int(g.n, "n"), n = blas_int(g.m, "m"), k = blas_int(g.k, "k");
  const int ldb = blas_int(std::max<std::int64_t>(g.ldb, 1), "ldb");
  const int lda = blas_int(std::max<std::int64_t>(g.lda, 1), "lda");
  const int ldc = blas_int(std::max<std::int64_t>(g.ldc, 1), "ldc");
  if (batch.count == 1) {
    check(cublasGemmEx(h, op(g.tb), op(g.ta), m, n, k, &g.alpha, b, CUDA_R_16BF, ldb, a, CUDA_R_16BF, lda, &g.beta,
                       c, c_type, ldc, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmEx (bf16)");
    return;
  }
  check(cublasGemmStridedBatchedEx(h, op(g.tb), op(g.ta), m, n, k, &g.alpha, b, CUDA_R_16BF, ldb, batch.stride_b, a,
                                   CUDA_R_16BF, lda, batch.stride_a, &g.beta, c, c_type, ldc, batch.stride_c,
                                   blas_int(batch.count, "batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
        "cublasGemmStridedBatchedEx (bf16)");
}

}  // namespace

void device_gemm_bf16(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a, const std::uint16_t* b,
                      const GemmBatch& batch) {
  gemm_bf16_operands(stream, g, a, b, g.c, CUDA_R_32F, batch);
}

void device_gemm_bf16_rounded(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a,
                              const std::uint16_t* b, std::uint16_t* c, const GemmBatch& batch) {
  if (g.beta != 0.0f) throw std::logic_error("lamina::device_gemm_bf16_rounded: beta must be 0");
  gemm_bf16_operands(stream, g, a, b, c, CUDA_R_16BF, batch);
}

}  // namespace lamina
