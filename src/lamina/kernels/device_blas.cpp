#include "lamina/kernels/device_blas.hpp"

#include <cublasLt.h>
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

// One handle per process for each library (cuBLAS, cuBLASLt), made on first use and destroyed
// when Kokkos finalizes (before the CUDA context goes). Products are issued from one host
// thread, so a handle is not shared.
template <class H, cublasStatus_t (*Create)(H*), cublasStatus_t (*Destroy)(H)>
struct ProcessHandle {
  static H& slot() {
    static H h = nullptr;
    return h;
  }
  static H get(const char* what) {
    H& h = slot();
    if (h == nullptr) {
      check(Create(&h), what);
      Kokkos::push_finalize_hook([] {
        Destroy(slot());
        slot() = nullptr;
      });
    }
    return h;
  }
};

cublasHandle_t handle() { return ProcessHandle<cublasHandle_t, cublasCreate, cublasDestroy>::get("cublasCreate"); }

cublasLtHandle_t lt_handle() {
  return ProcessHandle<cublasLtHandle_t, cublasLtCreate, cublasLtDestroy>::get("cublasLtCreate");
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

namespace {

enum class Epilogue { bias, bias_gelu };

template <class T>
void set(cublasLtMatmulDesc_t d, cublasLtMatmulDescAttributes_t what, const T& value) {
  check(cublasLtMatmulDescSetAttribute(d, what, &value, sizeof(value)), "cublasLtMatmulDescSetAttribute");
}

// One cuBLASLt product's descriptors, destroyed with it. Row-major C = A op(B) is column-major
// C^T = op(B)^T A^T (as device_gemm): cuBLASLt's A is our B, its D (and C, not read: beta 0)
// our C, and a bias per column of our C one per row of its D, as the epilogue adds it. No
// workspace: the products share no buffer across streams, and the memory plan holds none.
class LtProduct {
 public:
  LtProduct(const RowMajorGemm& g, Epilogue epilogue, const float* bias, std::uint16_t* pre) {
    try {
      describe(g, epilogue, bias, pre);
    } catch (...) {
      release();  // what was made before the failure
      throw;
    }
  }
  LtProduct(const LtProduct&) = delete;
  LtProduct& operator=(const LtProduct&) = delete;
  ~LtProduct() { release(); }

  // The heuristics' first algorithm, or none (false) where it has none for this product.
  bool choose() {
    int found = 0;
    const cublasStatus_t rc =
        cublasLtMatmulAlgoGetHeuristic(lt_handle(), op_, a_, b_, c_, c_, preference_, 1, &choice_, &found);
    if (rc == CUBLAS_STATUS_NOT_SUPPORTED) return false;
    check(rc, "cublasLtMatmulAlgoGetHeuristic");
    return found > 0;
  }

  void run(cudaStream_t stream, float alpha, const std::uint16_t* a, const std::uint16_t* b, std::uint16_t* c) {
    const float beta = 0.0f;
    check(cublasLtMatmul(lt_handle(), op_, &alpha, b, a_, a, b_, &beta, c, c_, c, c_, &choice_.algo, nullptr, 0,
                         stream),
          "cublasLtMatmul");
  }

 private:
  void describe(const RowMajorGemm& g, Epilogue epilogue, const float* bias, std::uint16_t* pre) {
    check(cublasLtMatmulDescCreate(&op_, CUBLAS_COMPUTE_32F, CUDA_R_32F), "cublasLtMatmulDescCreate");
    const cublasOperation_t ta = op(g.tb), tb = op(g.ta);
    set(op_, CUBLASLT_MATMUL_DESC_TRANSA, ta);
    set(op_, CUBLASLT_MATMUL_DESC_TRANSB, tb);
    set(op_, CUBLASLT_MATMUL_DESC_EPILOGUE,
        epilogue == Epilogue::bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_GELU_AUX_BIAS);
    set(op_, CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias);
    set(op_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(CUDA_R_32F));
    if (epilogue == Epilogue::bias_gelu) {
      set(op_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, static_cast<void*>(pre));
      set(op_, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, g.ldc);
    }
    const std::uint64_t m = static_cast<std::uint64_t>(g.n), n = static_cast<std::uint64_t>(g.m),
                        k = static_cast<std::uint64_t>(g.k);
    const bool an = ta == CUBLAS_OP_N, bn = tb == CUBLAS_OP_N;
    check(cublasLtMatrixLayoutCreate(&a_, CUDA_R_16BF, an ? m : k, an ? k : m, std::max<std::int64_t>(g.ldb, 1)),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&b_, CUDA_R_16BF, bn ? k : n, bn ? n : k, std::max<std::int64_t>(g.lda, 1)),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatrixLayoutCreate(&c_, CUDA_R_16BF, m, n, std::max<std::int64_t>(g.ldc, 1)),
          "cublasLtMatrixLayoutCreate");
    check(cublasLtMatmulPreferenceCreate(&preference_), "cublasLtMatmulPreferenceCreate");
  }

  void release() {
    if (preference_ != nullptr) cublasLtMatmulPreferenceDestroy(preference_);
    if (c_ != nullptr) cublasLtMatrixLayoutDestroy(c_);
    if (b_ != nullptr) cublasLtMatrixLayoutDestroy(b_);
    if (a_ != nullptr) cublasLtMatrixLayoutDestroy(a_);
    if (op_ != nullptr) cublasLtMatmulDescDestroy(op_);
  }

  cublasLtMatmulDesc_t op_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr, b_ = nullptr, c_ = nullptr;
  cublasLtMatmulPreference_t preference_ = nullptr;
  cublasLtMatmulHeuristicResult_t choice_{};
};

void lt_product(cudaStream_t stream, const RowMajorGemm& g, Epilogue epilogue, const std::uint16_t* a,
                const std::uint16_t* b, const float* bias, std::uint16_t* c, std::uint16_t* pre) {
  if (g.beta != 0.0f) throw std::logic_error("lamina: a product with a bias epilogue overwrites C (beta 0)");
  if (g.m == 0 || g.n == 0) return;
  LtProduct p(g, epilogue, bias, pre);
  if (!p.choose()) {
    throw RunError(strprintf("cuBLASLt: no algorithm for a bf16 product of %lld x %lld x %lld with a%s epilogue",
                             static_cast<long long>(g.m), static_cast<long long>(g.n), static_cast<long long>(g.k),
                             epilogue == Epilogue::bias ? " bias" : " bias and GELU"));
  }
  p.run(stream, g.alpha, a, b, c);
}

// Whether the heuristics have an algorithm for the epilogue on a product of a transformer's
// shape (operands and outputs of 256 columns; the pointers, not read, aligned).
bool epilogue_supported(Epilogue epilogue) {
  RowMajorGemm g;
  g.m = g.n = g.k = 256;
  g.lda = g.ldb = g.ldc = 256;
  LtProduct p(g, epilogue, nullptr, nullptr);
  return p.choose();
}

}  // namespace

bool device_bias_epilogue() {
  static const bool supported = epilogue_supported(Epilogue::bias);
  return supported;
}

bool device_gelu_epilogue() {
  static const bool supported = epilogue_supported(Epilogue::bias_gelu);
  return supported;
}

void device_gemm_bf16_bias(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a,
                           const std::uint16_t* b, const float* bias, std::uint16_t* c) {
  lt_product(stream, g, Epilogue::bias, a, b, bias, c, nullptr);
}

void device_gemm_bf16_bias_gelu(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a,
                                const std::uint16_t* b, const float* bias, std::uint16_t* pre, std::uint16_t* out) {
  if (g.ldc % 8 != 0) throw std::logic_error("lamina: cuBLASLt keeps GELU's input at a leading dimension that is a multiple of 8");
  lt_product(stream, g, Epilogue::bias_gelu, a, b, bias, out, pre);
}

}  // namespace lamina
