#include "lamina/core/system_memory.hpp"

#include <fcntl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <Kokkos_Core.hpp>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <new>
#include <sstream>

#include "lamina/core/format.hpp"
#if defined(KOKKOS_ENABLE_CUDA)
#include <cuda_runtime.h>
#endif

namespace lamina {

namespace {

// A "Key: N kB" line of /proc/meminfo (or another such file) in bytes, 0 if absent.
std::int64_t meminfo(const std::string& key, const char* file = "/proc/meminfo") {
  std::ifstream in(file);
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

namespace {

std::int64_t g_failed_mapped = 0, g_failed_resident = 0;

// "Key:   N kB" in a /proc status text, in bytes; 0 if absent.
std::int64_t status_bytes(const char* text, const char* key) {
  const char* at = std::strstr(text, key);
  return at == nullptr ? 0 : std::strtoll(at + std::strlen(key), nullptr, 10) * 1024;
}

// Reads /proc/self/status into a stack buffer (nothing to allocate when memory has run
// out), notes the sizes, and lets the allocation fail as it would have.
void note_failed_allocation() {
  char text[4096] = {};
  const int fd = open("/proc/self/status", O_RDONLY);
  if (fd >= 0) {
    const ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n > 0) {
      g_failed_mapped = status_bytes(text, "VmSize:");
      g_failed_resident = status_bytes(text, "VmRSS:");
    }
  }
  throw std::bad_alloc();
}

}  // namespace

void watch_host_allocations() { std::set_new_handler(note_failed_allocation); }

std::string host_allocation_failure() {
  const SystemMemory m = system_memory();
  std::string what = "out of host memory: an allocation outside lamina's tracked buffers failed";
  if (g_failed_mapped > 0) {
    what += strprintf(" with %s mapped and %s resident in this process",
                      human_bytes(static_cast<double>(g_failed_mapped)).c_str(),
                      human_bytes(static_cast<double>(g_failed_resident)).c_str());
  }
  rlimit as{};
  if (getrlimit(RLIMIT_AS, &as) == 0 && as.rlim_cur != RLIM_INFINITY) {
    what += strprintf(", under an address-space limit of %s (ulimit -v)", human_bytes(static_cast<double>(as.rlim_cur)).c_str());
  }
  return what + strprintf("; %s available of %s (%s)", human_bytes(static_cast<double>(m.host_available)).c_str(),
                          human_bytes(static_cast<double>(m.host_limit)).c_str(), m.host_limit_source.c_str());
}

}  // namespace lamina
