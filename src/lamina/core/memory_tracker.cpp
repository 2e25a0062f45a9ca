#include "lamina/core/memory_tracker.hpp"

#include <algorithm>

namespace lamina {

const char* mem_category_name(MemCategory c) {
  switch (c) {
    case MemCategory::parameters: return "parameters";
    case MemCategory::gradients: return "gradients";
    case MemCategory::optimizer_state: return "optimizer_state";
    case MemCategory::activations: return "activations";
    case MemCategory::workspace: return "workspace";
    case MemCategory::communication: return "communication";
  }
  return "unknown";
}

void MemoryTracker::allocate(const std::string& space, MemCategory category, std::int64_t bytes) {
  Space& s = spaces_[space];
  const int c = static_cast<int>(category);
  s.current += bytes;
  s.category_current[c] += bytes;
  s.peak = std::max(s.peak, s.current);
  s.category_peak[c] = std::max(s.category_peak[c], s.category_current[c]);
}

void MemoryTracker::release(const std::string& space, MemCategory category, std::int64_t bytes) {
  Space& s = spaces_[space];
  s.current -= bytes;
  s.category_current[static_cast<int>(category)] -= bytes;
}

std::int64_t MemoryTracker::current(const std::string& space) const {
  const auto it = spaces_.find(space);
  return it == spaces_.end() ? 0 : it->second.current;
}

std::int64_t MemoryTracker::peak(const std::string& space) const {
  const auto it = spaces_.find(space);
  return it == spaces_.end() ? 0 : it->second.peak;
}

std::int64_t MemoryTracker::peak(const std::string& space, MemCategory category) const {
  const auto it = spaces_.find(space);
  return it == spaces_.end() ? 0 : it->second.category_peak[static_cast<int>(category)];
}

std::map<std::string, std::int64_t> MemoryTracker::peak_by_space() const {
  std::map<std::string, std::int64_t> out;
  for (const auto& kv : spaces_) out[kv.first] = kv.second.peak;
  return out;
}

std::map<std::string, std::int64_t> MemoryTracker::current_by_space() const {
  std::map<std::string, std::int64_t> out;
  for (const auto& kv : spaces_) out[kv.first] = kv.second.current;
  return out;
}

std::map<std::string, std::map<std::string, std::int64_t>> MemoryTracker::current_by_category() const {
  std::map<std::string, std::map<std::string, std::int64_t>> out;
  for (const auto& kv : spaces_) {
    for (int c = 0; c < kNumMemCategories; ++c) {
      if (kv.second.category_current[c] > 0) {
        out[kv.first][mem_category_name(static_cast<MemCategory>(c))] = kv.second.category_current[c];
      }
    }
  }
  return out;
}

std::map<std::string, std::map<std::string, std::int64_t>> MemoryTracker::peak_by_category() const {
  std::map<std::string, std::map<std::string, std::int64_t>> out;
  for (const auto& kv : spaces_) {
    for (int c = 0; c < kNumMemCategories; ++c) {
      if (kv.second.category_peak[c] > 0) out[kv.first][mem_category_name(static_cast<MemCategory>(c))] = kv.second.category_peak[c];
    }
  }
  return out;
}

}  // namespace lamina
