// A minimal Kokkos Tools plugin: wall time per kernel label and per profiling region
// (KokkosBlas pushes a region around each vendor-BLAS call), printed at exit, sorted.
//   g++ -O2 -shared -fPIC kernel_timer.cpp -o libkernel_timer.so
//   KOKKOS_TOOLS_LIBS=$PWD/libkernel_timer.so lamina bench step inputs/bench-torch.toml
// Launches are timed from begin to end callback, so with asynchronous backends run with
// CUDA_LAUNCH_BLOCKING=1 (or fences) for meaningful numbers. Serial/OpenMP are synchronous.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;
struct Entry {
  double seconds = 0;
  std::uint64_t calls = 0;
};
std::map<std::string, Entry> kernels, regions;
std::map<std::uint64_t, std::pair<std::string, Clock::time_point>> open_kernels;
std::vector<std::pair<std::string, Clock::time_point>> region_stack;
std::uint64_t next_id = 0;

void begin(const char* name, std::uint64_t* id) {
  *id = next_id++;
  open_kernels[*id] = {name, Clock::now()};
}
void end(std::uint64_t id) {
  auto it = open_kernels.find(id);
  if (it == open_kernels.end()) return;
  Entry& e = kernels[it->second.first];
  e.seconds += std::chrono::duration<double>(Clock::now() - it->second.second).count();
  ++e.calls;
  open_kernels.erase(it);
}

void print(const char* title, const std::map<std::string, Entry>& m) {
  std::vector<std::pair<std::string, Entry>> v(m.begin(), m.end());
  std::sort(v.begin(), v.end(), [](auto& a, auto& b) { return a.second.seconds > b.second.seconds; });
  std::fprintf(stderr, "\n%-70s %12s %10s\n", title, "seconds", "calls");
  for (const auto& [name, e] : v) std::fprintf(stderr, "%-70.70s %12.4f %10llu\n", name.c_str(), e.seconds, (unsigned long long)e.calls);
}

}  // namespace

extern "C" {
void kokkosp_init_library(int, std::uint64_t, std::uint32_t, void*) {}
void kokkosp_finalize_library() {
  print("kernel", kernels);
  print("region", regions);
}
void kokkosp_begin_parallel_for(const char* name, std::uint32_t, std::uint64_t* id) { begin(name, id); }
void kokkosp_end_parallel_for(std::uint64_t id) { end(id); }
void kokkosp_begin_parallel_reduce(const char* name, std::uint32_t, std::uint64_t* id) { begin(name, id); }
void kokkosp_end_parallel_reduce(std::uint64_t id) { end(id); }
void kokkosp_begin_parallel_scan(const char* name, std::uint32_t, std::uint64_t* id) { begin(name, id); }
void kokkosp_end_parallel_scan(std::uint64_t id) { end(id); }
void kokkosp_push_profile_region(const char* name) { region_stack.emplace_back(name, Clock::now()); }
void kokkosp_pop_profile_region() {
  if (region_stack.empty()) return;
  Entry& e = regions[region_stack.back().first];
  e.seconds += std::chrono::duration<double>(Clock::now() - region_stack.back().second).count();
  ++e.calls;
  region_stack.pop_back();
}
}
