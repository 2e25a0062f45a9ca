#pragma once
// Numeric format of stored parameters and activations.
namespace lamina {

// fp32: everything in float. bf16: mixed precision (bf16 storage, fp32 arithmetic, fp32
// master weights and gradients).
enum class Precision { fp32, bf16 };

}  // namespace lamina
