#include "lamina/core/system_memory.hpp"

#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <fstream>
#include <sstream>
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace lamina {

namespace {

// A "Key: N kB" line of /proc/meminfo in bytes, 0 if absent.
std::int64_t meminfo(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, key.size() + 1, key + ":") != 0) continue;
    std::istringstream v(line.substr(key.size() + 1));
    std::int64_t kb = 0;
    v >> kb;
    return kb * 1024;
  }
  return 0;
}

// A cgroup limit file's value in bytes; 0 for "max", absent or unreadable.
std::int64_t cgroup_limit(const std::string& path) {
  std::ifstream in(path);
  std::string v;
  if (!(in >> v) || v == "max") return 0;
  try {
    return static_cast<std::int64_t>(std::stoull(v));
  } catch (const std::exception&) {
    return 0;
  }
}

}  // namespace

SystemMemory system_memory() {
  SystemMemory m;
  m.host_limit = static_cast<std::int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<std::int64_t>(sysconf(_SC_PAGE_SIZE));
  m.host_limit_source = "physical memory";
  // cgroup v2 at the process's own cgroup is the usual case under Slurm and containers;
  // v1 reports "no limit" as a huge number, which min() ignores.
  for (const char* path : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
    const std::int64_t limit = cgroup_limit(path);
    if (limit > 0 && limit < m.host_limit) {
      m.host_limit = limit;
      m.host_limit_source = std::string("the cgroup limit in ") + path;
    }
  }
  m.host_available = meminfo("MemAvailable");
#if defined(KOKKOS_ENABLE_CUDA)
  if (std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>::value) {
    std::size_t free = 0, total = 0;
    if (cudaMemGetInfo(&free, &total) == cudaSuccess) {
      m.separate_device = true;
      m.device_free = static_cast<std::int64_t>(free);
      m.device_total = static_cast<std::int64_t>(total);
    }
  }
#endif
  return m;
}

}  // namespace lamina
