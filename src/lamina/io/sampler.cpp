#include "lamina/io/sampler.hpp"

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/random.hpp"

namespace lamina {

SequenceSampler::SequenceSampler(std::int64_t num_tokens, std::int64_t seq_len, std::uint64_t seed, bool shuffle)
    : seq_len_(seq_len), windows_((num_tokens - 1) / seq_len), seed_(seed), shuffle_(shuffle) {
  if (windows_ < 1) {
    throw InputError(strprintf("the data holds %lld tokens, fewer than model.seq_len + 1 = %lld",
                               static_cast<long long>(num_tokens), static_cast<long long>(seq_len + 1)));
  }
  while ((std::uint64_t(1) << (2 * half_bits_)) < static_cast<std::uint64_t>(windows_)) ++half_bits_;
}

std::uint64_t SequenceSampler::permute(std::uint64_t i, std::uint64_t key) const {
  // Balanced Feistel network on 2h bits, cycle-walking into [0, windows): a bijection of
  // [0, windows) for every key. The domain is < 4x the range, so walks are short.
  const std::uint64_t mask = (std::uint64_t(1) << half_bits_) - 1;
  do {
    std::uint64_t l = i >> half_bits_, r = i & mask;
    for (std::uint64_t round = 0; round < 4; ++round) {
      const std::uint64_t f = hash_combine(key, (round << 40) ^ r) & mask;
      const std::uint64_t nl = r;
      r = l ^ f;
      l = nl;
    }
    i = (l << half_bits_) | r;
  } while (i >= static_cast<std::uint64_t>(windows_));
  return i;
}

std::int64_t SequenceSampler::window_start(std::int64_t k) const {
  const std::int64_t epoch = k / windows_;
  const std::uint64_t i = static_cast<std::uint64_t>(k % windows_);
  const std::uint64_t w = shuffle_ ? permute(i, hash_combine(seed_ ^ 0x5eed5eed5eedULL, static_cast<std::uint64_t>(epoch))) : i;
  return static_cast<std::int64_t>(w) * seq_len_;
}

}  // namespace lamina
