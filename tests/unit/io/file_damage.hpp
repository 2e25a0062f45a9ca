#pragma once
// Damaging a file the way a failing disk or transfer does: one byte changed inside the
// stored bytes of given values (found by their byte image, so it lands in the data, not
// in HDF5's bookkeeping).
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace lamina::test {

// Flips the bits of one byte in the middle of the first place the file holds
// `values[0..n)` as raw bytes; returns false when they are not there.
inline bool flip_byte_in(const std::string& path, const float* values, std::size_t n) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string image(reinterpret_cast<const char*>(values), n * sizeof(float));
  const auto at = bytes.find(image);
  if (at == std::string::npos) return false;
  bytes[at + image.size() / 2] ^= static_cast<char>(0xff);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
  return true;
}

}  // namespace lamina::test
