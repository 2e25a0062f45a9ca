#pragma once
// Numbers as weight files store them: little-endian IEEE float32, float16, bfloat16 and
// float64, read into and written from float. Narrowing rounds to nearest, ties to even (as
// PyTorch's .to(torch.float16 / torch.bfloat16) does); widening is exact.
#include <cstdint>
#include <string>

namespace lamina {

enum class StoredFloat { f32, f16, bf16, f64 };

int stored_size(StoredFloat t);
// "F32", "F16", "BF16", "F64": safetensors' names.
const char* safetensors_name(StoredFloat t);
// fp32, fp16, bf16 (the spellings of `lamina convert --dtype`); false for anything else.
bool parse_stored_float(const std::string& name, StoredFloat& out);

std::uint16_t float_to_half(float x);
float half_to_float(std::uint16_t h);

// n values at `bytes` (any alignment) into `out`, and back.
void decode_floats(StoredFloat t, const std::uint8_t* bytes, std::int64_t n, float* out);
void encode_floats(StoredFloat t, const float* in, std::int64_t n, std::uint8_t* bytes);

}  // namespace lamina
