#pragma once
// oneDNN, the host's engine for bf16 products (an optional dependency: CMake's
// LAMINA_ENABLE_ONEDNN, spack's +onednn). Where it is linked and the CPU multiplies bf16 in
// hardware (AVX512_BF16, AMX), bf16 runs' products on the host read bf16 operands and sum
// in fp32 (what cuBLAS does on devices and PyTorch's bf16 autocast on CPUs); elsewhere they
// stay fp32 products of the host BLAS. Each product shape gets one matmul primitive, made
// the first time and kept; a primitive runs on the calling thread's OpenMP pool (Kokkos'
// OpenMP threads, called from outside their parallel regions: no second pool).
#include <cstdint>
#include <string>

#include "lamina/kernels/row_major_gemm.hpp"

namespace lamina {

constexpr bool kHostDnnlLinked =
#if defined(LAMINA_HAVE_ONEDNN)
    true;
#else
    false;
#endif

// Whether this process's host products can run in bf16: oneDNN is linked and finds bf16
// instructions on this CPU.
bool host_bf16_products();

// What the host's products run on, for the start-up line: "oneDNN 2.6.3 bf16 products
// (avx512_core_bf16, 2 OpenMP threads)", "oneDNN 2.6.3: no bf16 instructions on this CPU
// (avx2), bf16 runs keep fp32 products", or "no oneDNN: bf16 runs keep fp32 products".
std::string host_product_engine();

// The OpenMP threads oneDNN's products run on, for a Serial build (configure_host_blas: this
// rank's share of the cores, as the BLAS's); under Kokkos OpenMP they are Kokkos' threads.
void set_host_product_threads(int threads);

// C = alpha op(A) op(B) + beta C with A and B stored in bf16 (row-major, with g's shapes,
// transposes and row strides; g.a and g.b are not read), summed in fp32 into the fp32 C,
// for each (sequence, head) of `batch` in one call. Throws RunError naming oneDNN's reason
// where it fails, or where it is not linked.
void host_gemm_bf16(const RowMajorGemm& g, const std::uint16_t* a, const std::uint16_t* b,
                    const HeadBatch& batch = HeadBatch{});

// C = op(A) op(B) + bias, A and B stored in bf16 as above, the fp32 sums and their bias (n
// floats, one per column of C; or null for none) rounded to nearest into the bf16 C (ldc
// apart; g.c is not read, g.beta must be 0): the product's epilogue, in one pass. For each
// (sequence, head) of `batch` (then without a bias).
void host_gemm_bf16_rounded(const RowMajorGemm& g, const std::uint16_t* a, const std::uint16_t* b, std::uint16_t* c,
                            const float* bias, const HeadBatch& batch = HeadBatch{});

}  // namespace lamina
