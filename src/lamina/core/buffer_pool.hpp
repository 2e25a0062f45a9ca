#pragma once
// Reusable tracked buffers for what lives only part of a step: parameters gathered by
// ZeRO-3, full-size gradients before a ZeRO-2/3 reduce-scatter, staging copies. A buffer
// is allocated the first time no free one of its size exists and is reused afterwards,
// so the memory tracker's peak is the most that was ever held at once.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lamina/core/buffer.hpp"

namespace lamina {

template <class Mem, class T = float>
class BufferPool {
 public:
  BufferPool(MemoryTracker& tracker, MemCategory category, std::string label, MemTier tier = default_tier<Mem>())
      : tracker_(tracker), category_(category), label_(std::move(label)), tier_(tier) {}

  // A buffer of exactly n elements, contents undefined.
  T* acquire(std::int64_t n) {
    auto& free = free_[n];
    if (!free.empty()) {
      T* p = free.back();
      free.pop_back();
      return p;
    }
    owned_.emplace_back(tracker_, category_, label_, n, tier_);
    return owned_.back().data();
  }
  void release(T* p, std::int64_t n) {
    if (p != nullptr) free_[n].push_back(p);
  }
  // Bytes allocated but not held now: free for whatever this pool hands out next.
  std::int64_t idle_bytes() const {
    std::int64_t n = 0;
    for (const auto& [size, list] : free_) n += size * static_cast<std::int64_t>(list.size() * sizeof(T));
    return n;
  }

 private:
  MemoryTracker& tracker_;
  MemCategory category_;
  std::string label_;
  MemTier tier_;
  std::vector<Buffer<T, Mem>> owned_;
  std::map<std::int64_t, std::vector<T*>> free_;
};

}  // namespace lamina
