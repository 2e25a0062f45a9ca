#pragma once
// Counter-based random numbers: a value depends only on (key, counter), never on how
// many values were drawn before. Initial weights are therefore identical for every
// process layout (each rank draws just its shard), and data order is a pure function of
// the seed and the sample index, which makes restarts exact.
#include <cmath>
#include <cstdint>
#include <string>

namespace lamina {

// SplitMix64 finalizer (Steele, Lea, Flood 2014): a strong 64-bit mixing function.
inline std::uint64_t mix64(std::uint64_t z) {
  z += 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

inline std::uint64_t hash_combine(std::uint64_t key, std::uint64_t counter) { return mix64(key ^ mix64(counter)); }

// FNV-1a, to derive a stream key from a name.
inline std::uint64_t hash_string(const std::string& s) {
  std::uint64_t h = 1469598103934665603ULL;
  for (const unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

// Uniform in (0, 1).
inline double uniform01(std::uint64_t key, std::uint64_t counter) {
  return (static_cast<double>(hash_combine(key, counter) >> 11) + 0.5) * (1.0 / 9007199254740992.0);
}

// Standard normal (Box-Muller on two counter-derived uniforms).
inline double normal01(std::uint64_t key, std::uint64_t counter) {
  const double u1 = uniform01(key, 2 * counter);
  const double u2 = uniform01(key, 2 * counter + 1);
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace lamina
