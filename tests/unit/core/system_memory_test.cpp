// A host allocation outside the tracked buffers that fails is reported with what this
// process held when it failed, not the bare std::bad_alloc.
#include "lamina/core/system_memory.hpp"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <new>
#include <string>

namespace lamina::test {
namespace {

TEST(SystemMemory, TheHostLimitIsPositiveAndNamed) {
  const SystemMemory m = system_memory();
  EXPECT_GT(m.host_limit, 0);
  EXPECT_GT(m.host_available, 0);
  EXPECT_FALSE(m.host_limit_source.empty());
}

// AddressSanitizer ends the process on an impossible allocation instead of failing it.
#if !defined(__SANITIZE_ADDRESS__)
TEST(SystemMemory, AFailedAllocationIsReportedWithTheProcessSizeAtTheFailure) {
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {  // a child, so that the test runner keeps its own new-handler
    ::close(fds[0]);
    watch_host_allocations();
    std::string what = "no std::bad_alloc";
    try {
      volatile void* p = ::operator new(std::size_t{1} << 62);
      (void)p;
    } catch (const std::bad_alloc&) {
      what = host_allocation_failure();
    }
    const ssize_t ignored = ::write(fds[1], what.data(), what.size());
    (void)ignored;
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string what;
  char buf[512];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) > 0;) what.append(buf, static_cast<std::size_t>(n));
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_EQ(what.rfind("out of host memory: an allocation outside lamina's tracked buffers failed with ", 0), 0u) << what;
  EXPECT_NE(what.find(" mapped and "), std::string::npos) << what;
  EXPECT_NE(what.find(" resident in this process"), std::string::npos) << what;
  EXPECT_NE(what.find(" available of "), std::string::npos) << what;
}
#endif

}  // namespace
}  // namespace lamina::test
