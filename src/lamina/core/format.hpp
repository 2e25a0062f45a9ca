#pragma once
// printf-style formatting into std::string (the project avoids an extra dependency for it).
#include <cstdarg>
#include <cstdint>
#include <string>
#include <vector>

namespace lamina {

#if defined(__GNUC__)
__attribute__((format(printf, 1, 2)))
#endif
std::string strprintf(const char* fmt, ...);

// "1.50 GiB", "512 B": for humans; machine-readable output keeps raw bytes.
std::string human_bytes(double bytes);

// "1.2k", "3.4M", "7.0G": parameter and token counts for humans.
std::string human_count(double n);

// "(64, 32)": a tensor's shape in messages.
std::string shape_string(const std::vector<std::int64_t>& shape);

}  // namespace lamina
