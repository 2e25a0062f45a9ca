#pragma once
// Where attention's heads sit in the QKV projection's (B*T, width) rows: NH query heads,
// then NKV key heads and NKV value heads, each hd columns: [q | k | v]. Grouped-query
// attention (Llama 2 70B, Llama 3) shares each key/value head among NH / NKV query heads,
// multi-query attention has one; GPT-2 has NKV = NH. The rows' width tells NKV, so the
// kernels take the same arguments for every kind.
#include <cstdint>
#include <stdexcept>
#include <string>

#include <Kokkos_Core.hpp>

namespace lamina {

struct QkvLayout {
  std::int64_t NH = 0, NKV = 0, hd = 0;

  // Of rows `width` wide with NH query heads of hd columns.
  static QkvLayout of(std::int64_t width, std::int64_t NH, std::int64_t hd) {
    const std::int64_t kv = hd > 0 ? (width - NH * hd) / (2 * hd) : 0;
    if (NH <= 0 || hd <= 0 || kv <= 0 || (NH + 2 * kv) * hd != width || NH % kv != 0) {
      throw std::logic_error("lamina::attention: rows of " + std::to_string(width) + " columns do not hold " +
                             std::to_string(NH) + " query heads of " + std::to_string(hd) +
                             " and a divisor of them as key and value heads");
    }
    return {NH, kv, hd};
  }
  // Query heads per key/value head.
  KOKKOS_INLINE_FUNCTION std::int64_t group() const { return NH / NKV; }
  // First column of part 0 (q), 1 (k) or 2 (v).
  KOKKOS_INLINE_FUNCTION std::int64_t column(int part) const {
    return part == 0 ? 0 : part == 1 ? NH * hd : (NH + NKV) * hd;
  }
  // First column of query head h's key (part 1) or value (part 2) head.
  KOKKOS_INLINE_FUNCTION std::int64_t kv_column(int part, std::int64_t h) const {
    return column(part) + h / group() * hd;
  }
  KOKKOS_INLINE_FUNCTION std::int64_t width() const { return (NH + 2 * NKV) * hd; }
};

}  // namespace lamina
