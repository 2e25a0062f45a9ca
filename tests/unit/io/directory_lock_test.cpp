// The hold on a directory: refused while another process holds it (record lock, or the lease
// where there is none), free once that process is gone or another host's lease has lapsed.
#include "lamina/io/directory_lock.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;
using Mode = DirectoryLock::Mode;

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string refusal(const std::string& dir, Mode mode) {
  try {
    DirectoryLock lock(dir, "output.dir", mode);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(taken)";
}

class DirectoryLocks : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lamina_lock_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  // A child process holding the directory until killed; returns once it holds it.
  pid_t holder(Mode mode) {
    int ready[2];
    EXPECT_EQ(::pipe(ready), 0);
    const pid_t pid = ::fork();
    if (pid == 0) {
      ::close(ready[0]);
      try {
        DirectoryLock lock(dir_, "output.dir", mode);
        const char ok = 1;
        if (::write(ready[1], &ok, 1) != 1) ::_exit(1);
        for (;;) ::pause();
      } catch (...) {
        ::_exit(1);
      }
    }
    ::close(ready[1]);
    char ok = 0;
    EXPECT_EQ(::read(ready[0], &ok, 1), 1);
    ::close(ready[0]);
    return pid;
  }
  static void kill_and_wait(pid_t pid) {
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  void write_lock(const std::string& text, std::time_t age_s) const {
    const std::string path = dir_ + "/lamina.lock";
    std::ofstream(path) << text;
    const struct timespec t[2] = {{std::time(nullptr) - age_s, 0}, {std::time(nullptr) - age_s, 0}};
    ASSERT_EQ(::utimensat(AT_FDCWD, path.c_str(), t, 0), 0);
  }
  std::string dir_;
};

TEST_F(DirectoryLocks, AnotherProcesssRecordLockIsRefusedNamingItAndFreedWhenItIsKilled) {
  const pid_t pid = holder(Mode::record_lock);
  const std::string why = refusal(dir_, Mode::record_lock);
  EXPECT_NE(why.find("output.dir = " + dir_ + " is in use by "), std::string::npos) << why;
  EXPECT_NE(why.find(", pid " + std::to_string(pid) + " (started "), std::string::npos) << why;
  EXPECT_NE(why.find("choose another output.dir"), std::string::npos) << why;
  kill_and_wait(pid);
  EXPECT_EQ(refusal(dir_, Mode::record_lock), "(taken)");
}

TEST_F(DirectoryLocks, WithoutRecordLocksALiveProcessOnThisHostHoldsItAndADeadOneDoesNot) {
  const pid_t pid = holder(Mode::lease_only);
  EXPECT_NE(refusal(dir_, Mode::lease_only).find(", pid " + std::to_string(pid)), std::string::npos);
  kill_and_wait(pid);  // its file still names it
  EXPECT_NE(slurp(dir_ + "/lamina.lock").find("pid=" + std::to_string(pid)), std::string::npos);
  EXPECT_EQ(refusal(dir_, Mode::lease_only), "(taken)");
}

TEST_F(DirectoryLocks, AnotherHostsHoldCountsUntilItsLeaseLapses) {
  const std::string other = "host=elsewhere-n042 pid=4242 job=991(slurm) started=2026-01-01T00:00:00Z\n";
  for (const Mode mode : {Mode::record_lock, Mode::lease_only}) {
    write_lock(other, 5);
    const std::string why = refusal(dir_, mode);
    EXPECT_NE(why.find("in use by job 991(slurm) on host elsewhere-n042, pid 4242 (started 2026-01-01T00:00:00Z) "
                       "(its lease was refreshed "),
              std::string::npos)
        << why;
    write_lock(other, DirectoryLock::kLeaseSeconds + 5);
    EXPECT_EQ(refusal(dir_, mode), "(taken)");
  }
}

TEST_F(DirectoryLocks, TheFileNamesTheHolderWhileHeldAndIsEmptiedAfter) {
  {
    DirectoryLock lock(dir_, "output.dir");
    const std::string held = slurp(dir_ + "/lamina.lock");
    EXPECT_EQ(held.rfind("host=", 0), 0u) << held;
    EXPECT_NE(held.find(" pid=" + std::to_string(::getpid()) + " job="), std::string::npos) << held;
  }
  EXPECT_EQ(slurp(dir_ + "/lamina.lock"), "");
}

// A lamina.lock that is a link (to a checkpoint, say) is refused and its target left as it
// was: a lock followed through a link was written and emptied on exit. One that is not a
// regular file is refused too.
TEST_F(DirectoryLocks, ALockThatIsALinkOrNotAFileIsRefusedAndItsTargetUntouched) {
  const std::string target = dir_ + "/step_00000006.h5";
  std::ofstream(target) << "weights";
  fs::create_directories(dir_ + "/run");
  fs::create_symlink(target, dir_ + "/run/lamina.lock");
  EXPECT_NE(refusal(dir_ + "/run", Mode::record_lock).find("/run/lamina.lock is a symbolic link"), std::string::npos);
  EXPECT_EQ(slurp(target), "weights");
  fs::create_directories(dir_ + "/other/lamina.lock");
  EXPECT_NE(refusal(dir_ + "/other", Mode::record_lock).find("/other/lamina.lock is not a regular file"),
            std::string::npos);
}

}  // namespace
}  // namespace lamina::test
