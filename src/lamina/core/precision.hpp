#pragma once
// Numeric formats: of stored parameters and activations, and of dense products' operands.
namespace lamina {

// fp32: everything in float. bf16: mixed precision (bf16 storage, fp32 arithmetic, fp32
// master weights and gradients).
enum class Precision { fp32, bf16 };

// How a dense product reads its fp32 operands. bf16: rounded to bf16, products summed in
// fp32 (tensor cores; what PyTorch's bf16 autocast computes). Only devices whose BLAS lamina
// calls with that compute type run it (kernels/device_blas.hpp); elsewhere products stay fp32.
enum class ProductMath { fp32, bf16 };

inline const char* product_math_name(ProductMath m) { return m == ProductMath::bf16 ? "bf16" : "fp32"; }

}  // namespace lamina
