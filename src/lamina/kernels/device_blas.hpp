#pragma once
// cuBLAS called directly, where Kokkos Kernels has no way to ask for it: products whose
// operands are rounded to bf16 and summed in fp32 on tensor cores (cublasGemmEx with
// CUBLAS_COMPUTE_32F_FAST_16BF reads the fp32 operands and converts them itself, so no
// bf16 copy of an activation is ever stored), and batches of equally spaced products in one
// launch. Every call runs on the stream of the execution-space instance it is given.
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
#endif

}  // namespace lamina
