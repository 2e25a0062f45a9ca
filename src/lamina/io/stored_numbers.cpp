#include "lamina/io/stored_numbers.hpp"

#include <cstring>

#include "lamina/kernels/bf16.hpp"

namespace lamina {

static_assert(sizeof(float) == 4 && sizeof(double) == 8, "IEEE float and double");

int stored_size(StoredFloat t) {
  switch (t) {
    case StoredFloat::f32: return 4;
    case StoredFloat::f16:
    case StoredFloat::bf16: return 2;
    case StoredFloat::f64: return 8;
  }
  return 0;
}

const char* safetensors_name(StoredFloat t) {
  switch (t) {
    case StoredFloat::f32: return "F32";
    case StoredFloat::f16: return "F16";
    case StoredFloat::bf16: return "BF16";
    case StoredFloat::f64: return "F64";
  }
  return "?";
}

bool parse_stored_float(const std::string& name, StoredFloat& out) {
  if (name == "fp32") out = StoredFloat::f32;
  else if (name == "fp16") out = StoredFloat::f16;
  else if (name == "bf16") out = StoredFloat::bf16;
  else return false;
  return true;
}

std::uint16_t float_to_half(float x) {
  std::uint32_t u;
  std::memcpy(&u, &x, 4);
  const std::uint16_t sign = static_cast<std::uint16_t>((u >> 16) & 0x8000u);
  const std::uint32_t a = u & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00u : 0x7c00u);  // NaN stays NaN, inf stays inf
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds past 65504: infinity
  if (a < 0x38800000u) {
    // A subnormal half (or zero): the value in units of 2^-24, rounded to nearest even.
    if (a < 0x33000000u) return sign;  // below half the smallest subnormal
    const std::uint32_t mant = (a & 0x007fffffu) | 0x00800000u;
    const int shift = 126 - static_cast<int>(a >> 23);  // 14..24 (value = mant * 2^(e-150))
    const std::uint32_t q = mant >> shift, rest = mant & ((1u << shift) - 1u), half = 1u << (shift - 1);
    const std::uint32_t r = q + ((rest > half || (rest == half && (q & 1u))) ? 1u : 0u);
    return sign | static_cast<std::uint16_t>(r);
  }
  // Normal: rebias the exponent, round the 13 dropped mantissa bits to nearest even (a
  // carry into the exponent is the right result).
  const std::uint32_t r = a - 0x38000000u;
  const std::uint32_t rounded = (r + 0x0fffu + ((r >> 13) & 1u)) >> 13;
  return sign | static_cast<std::uint16_t>(rounded);
}

float half_to_float(std::uint16_t h) {
  const std::uint32_t sign = static_cast<std::uint32_t>(h & 0x8000u) << 16;
  const std::uint32_t e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  std::uint32_t u;
  if (e == 0x1f) {
    u = sign | 0x7f800000u | (m << 13);
  } else if (e != 0) {
    u = sign | ((e + 112u) << 23) | (m << 13);
  } else if (m == 0) {
    u = sign;
  } else {  // subnormal: m * 2^-24, exact in float
    const float v = static_cast<float>(m) * (1.0f / 16777216.0f);
    std::memcpy(&u, &v, 4);
    u |= sign;
  }
  float x;
  std::memcpy(&x, &u, 4);
  return x;
}

void decode_floats(StoredFloat t, const std::uint8_t* bytes, std::int64_t n, float* out) {
  switch (t) {
    case StoredFloat::f32: std::memcpy(out, bytes, static_cast<std::size_t>(n) * 4); return;
    case StoredFloat::f64:
      for (std::int64_t i = 0; i < n; ++i) {
        double d;
        std::memcpy(&d, bytes + 8 * i, 8);
        out[i] = static_cast<float>(d);
      }
      return;
    case StoredFloat::f16:
    case StoredFloat::bf16:
      for (std::int64_t i = 0; i < n; ++i) {
        std::uint16_t h;
        std::memcpy(&h, bytes + 2 * i, 2);
        out[i] = t == StoredFloat::f16 ? half_to_float(h) : from_bf16(h);
      }
      return;
  }
}

void encode_floats(StoredFloat t, const float* in, std::int64_t n, std::uint8_t* bytes) {
  switch (t) {
    case StoredFloat::f32: std::memcpy(bytes, in, static_cast<std::size_t>(n) * 4); return;
    case StoredFloat::f64:
      for (std::int64_t i = 0; i < n; ++i) {
        const double d = in[i];
        std::memcpy(bytes + 8 * i, &d, 8);
      }
      return;
    case StoredFloat::f16:
    case StoredFloat::bf16:
      for (std::int64_t i = 0; i < n; ++i) {
        const std::uint16_t h = t == StoredFloat::f16 ? float_to_half(in[i]) : to_bf16(in[i]);
        std::memcpy(bytes + 2 * i, &h, 2);
      }
      return;
  }
}

}  // namespace lamina
