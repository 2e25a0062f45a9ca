#pragma once
// Bytes allocated per memory space and per category, current and peak.
// Every long-lived buffer of a run goes through a Buffer (buffer.hpp), which reports
// here; metrics.jsonl and the end-of-run breakdown read it. Spaces are reported by
// their Kokkos names; where the device tier and the host tier are one Kokkos space (a
// host-only build), the host tier is reported as "<name> (host tier)", so that what
// offloading moves off the device is visible on any machine.
#include <cstdint>
#include <map>
#include <string>

namespace lamina {

enum class MemCategory { parameters, gradients, optimizer_state, activations, workspace, communication };
constexpr int kNumMemCategories = 6;

const char* mem_category_name(MemCategory c);

class MemoryTracker {
 public:
  void allocate(const std::string& space, MemCategory category, std::int64_t bytes);
  void release(const std::string& space, MemCategory category, std::int64_t bytes);

  std::int64_t current(const std::string& space) const;
  std::int64_t peak(const std::string& space) const;
  std::int64_t peak(const std::string& space, MemCategory category) const;
  // Memory spaces seen so far, each with its peak bytes.
  std::map<std::string, std::int64_t> peak_by_space() const;
  std::map<std::string, std::int64_t> current_by_space() const;
  // space -> category name -> peak bytes of that category (each category's own peak).
  std::map<std::string, std::map<std::string, std::int64_t>> peak_by_category() const;
  std::map<std::string, std::map<std::string, std::int64_t>> current_by_category() const;

 private:
  struct Space {
    std::int64_t current = 0;
    std::int64_t peak = 0;
    std::int64_t category_current[kNumMemCategories] = {};
    std::int64_t category_peak[kNumMemCategories] = {};
  };
  std::map<std::string, Space> spaces_;
};

}  // namespace lamina
