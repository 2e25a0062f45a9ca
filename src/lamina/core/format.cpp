#include "lamina/core/format.hpp"

#include <cstdio>
#include <vector>

namespace lamina {

std::string strprintf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list copy;
  va_copy(copy, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, copy);
  va_end(copy);
  std::string out(n > 0 ? static_cast<std::size_t>(n) : 0, '\0');
  if (n > 0) std::vsnprintf(out.data(), out.size() + 1, fmt, args);
  va_end(args);
  return out;
}

std::string human_bytes(double bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024.0 && u < 5) {
    bytes /= 1024.0;
    ++u;
  }
  return u == 0 ? strprintf("%.0f B", bytes) : strprintf("%.2f %s", bytes, units[u]);
}

std::string human_count(double n) {
  static const char* units[] = {"", "k", "M", "G", "T", "P"};
  int u = 0;
  while (n >= 1000.0 && u < 5) {
    n /= 1000.0;
    ++u;
  }
  return u == 0 ? strprintf("%.0f", n) : strprintf("%.2f%s", n, units[u]);
}

std::string shape_string(const std::vector<std::int64_t>& shape) {
  std::string out = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + ")";
}

}  // namespace lamina
