#pragma once
// cuBLAS called directly, where Kokkos Kernels has no way to ask for it: products whose
// operands are rounded to bf16 and summed in fp32 on tensor cores (cublasGemmEx with
// CUBLAS_COMPUTE_32F_FAST_16BF reads the fp32 operands and converts them itself, so no
// bf16 copy of an activation is ever stored), and batches of equally spaced products in one
// launch; and, through cuBLASLt, products that add a bias (and apply GELU, keeping the
// pre-activation) as their epilogue. Every call runs on the stream of the execution-space
// instance it is given.
// Other devices (HIP, SYCL) keep Kokkos Kernels' fp32 products.
#include <cstdint>
#include <type_traits>

#include "lamina/core/precision.hpp"
#include "lamina/kernels/common.hpp"
#include "lamina/kernels/row_major_gemm.hpp"

namespace lamina {

// Whether products on `Exec` go through device_gemm (and so can use bf16 tensor cores).
#if defined(KOKKOS_ENABLE_CUDA)
template <class Exec>
constexpr bool kDeviceBlas = std::is_same<Exec, Kokkos::Cuda>::value;
#else
template <class Exec>
constexpr bool kDeviceBlas = false;
#endif

// `count` products g, g + stride, ...: each operand moves by its stride (elements) per product.
struct GemmBatch {
  std::int64_t count = 1;
  std::int64_t stride_a = 0, stride_b = 0, stride_c = 0;
};

#if defined(KOKKOS_ENABLE_CUDA)
// The products on `stream`, device pointers. Throws RunError naming cuBLAS's status.
void device_gemm(cudaStream_t stream, ProductMath math, const RowMajorGemm& g, const GemmBatch& batch);
// Products whose operands are stored in bf16 (g.a and g.b are not read: a and b are),
// summed in fp32 into the fp32 C: one, or a batch in one launch.
void device_gemm_bf16(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a, const std::uint16_t* b,
                      const GemmBatch& batch = GemmBatch{});
// The same written into the bf16 C (ldc apart; g.c is not read, g.beta must be 0): the fp32
// sums rounded to nearest as cuBLAS writes them.
void device_gemm_bf16_rounded(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a,
                              const std::uint16_t* b, std::uint16_t* c, const GemmBatch& batch = GemmBatch{});
// Whether cuBLASLt adds an fp32 bias to such a product as its epilogue on this device (and
// with GELU, as device_gemm_bf16_bias_gelu): asked of its heuristics once per process.
bool device_bias_epilogue();
bool device_gelu_epilogue();
// One product written into the bf16 C with the fp32 bias (one per column of C) added to the
// fp32 sums before they are rounded (cuBLASLt's BIAS epilogue; g.beta must be 0).
void device_gemm_bf16_bias(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a,
                           const std::uint16_t* b, const float* bias, std::uint16_t* c);
// pre = bf16(A op(B) + bias) and out = bf16(gelu(A op(B) + bias)) in one product (cuBLASLt's
// GELU_AUX_BIAS: its tanh form, on the fp32 sums); pre's and out's leading dimension g.ldc,
// a multiple of 8.
void device_gemm_bf16_bias_gelu(cudaStream_t stream, const RowMajorGemm& g, const std::uint16_t* a,
                                const std::uint16_t* b, const float* bias, std::uint16_t* pre, std::uint16_t* out);
#endif

}  // namespace lamina
