#include "lamina/io/directory_lock.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <sstream>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

namespace {

struct Holder {
  std::map<std::string, std::string> fields;  // host, pid, job, started
  bool named() const { return fields.count("host") != 0 && fields.count("pid") != 0; }
  std::string get(const std::string& k) const {
    const auto it = fields.find(k);
    return it == fields.end() ? "?" : it->second;
  }
  long pid() const { return std::atol(get("pid").c_str()); }
  std::string describe() const {
    const std::string job = get("job") == "-" ? "a job" : "job " + get("job");
    return job + " on host " + get("host") + ", pid " + get("pid") + " (started " + get("started") + ")";
  }
};

// The file holds one line of space-separated key=value fields (values without spaces).
Holder parse(const std::string& text) {
  Holder h;
  std::istringstream in(text.substr(0, text.find('\n')));
  std::string field;
  while (in >> field) {
    const auto eq = field.find('=');
    if (eq != std::string::npos) h.fields[field.substr(0, eq)] = field.substr(eq + 1);
  }
  return h;
}

std::string read_all(int fd) {
  std::string text;
  char buf[1024];
  for (off_t at = 0; text.size() < 4096;) {
    const ssize_t n = ::pread(fd, buf, sizeof buf, at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    at += n;
  }
  return text;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "unknown";
  return buf;
}

// The batch system's job id where one started this process.
std::string job_id() {
  for (const auto& [var, scheduler] : {std::pair<const char*, const char*>{"SLURM_JOB_ID", "slurm"},
                                       {"PBS_JOBID", "pbs"},
                                       {"LSB_JOBID", "lsf"},
                                       {"FLUX_JOB_ID", "flux"},
                                       {"JOB_ID", "sge"}}) {
    const char* v = std::getenv(var);
    if (v != nullptr && *v != '\0' && std::strpbrk(v, " \t\n") == nullptr) return std::string(v) + "(" + scheduler + ")";
  }
  return "-";
}

bool process_exists(long pid) { return pid > 0 && (::kill(static_cast<pid_t>(pid), 0) == 0 || errno == EPERM); }

bool write_all(int fd, const std::string& text) {
  if (::ftruncate(fd, 0) != 0) return false;
  std::size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = ::pwrite(fd, text.data() + done, text.size() - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<std::size_t>(n);
  }
  return true;
}

}  // namespace

std::string DirectoryLock::identity() {
  char started[32] = {};
  const std::time_t now = std::time(nullptr);
  std::tm utc{};
  ::gmtime_r(&now, &utc);
  std::strftime(started, sizeof started, "%Y-%m-%dT%H:%M:%SZ", &utc);
  return strprintf("host=%s pid=%ld job=%s started=%s", host_name().c_str(), static_cast<long>(::getpid()),
                   job_id().c_str(), started);
}

DirectoryLock::DirectoryLock(const std::string& dir, const std::string& key, Mode mode) : path_(dir + "/lamina.lock") {
  // Never through a link: truncating a lock that points at a checkpoint would empty it.
  fd_ = ::open(path_.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
  if (fd_ < 0 && errno == ELOOP) {
    throw InputError(key + " = " + dir + ": " + path_ +
                     " is a symbolic link, not a lock lamina made; remove it (what it points to is left alone)");
  }
  const std::string not_a_file =
      key + " = " + dir + ": " + path_ + " is not a regular file, not a lock lamina made; remove it";
  if (fd_ < 0 && errno == EISDIR) throw InputError(not_a_file);
  if (fd_ < 0) throw InputError(key + " = " + dir + ": cannot create " + path_ + ": " + std::strerror(errno));
  struct stat kind {};
  if (::fstat(fd_, &kind) != 0 || !S_ISREG(kind.st_mode)) {
    ::close(fd_);
    fd_ = -1;
    throw InputError(not_a_file);
  }
  const auto refuse = [&](const std::string& holder, const std::string& note) {
    ::close(fd_);
    fd_ = -1;
    throw InputError(key + " = " + dir + " is in use by " + holder + note +
                     ": a job owns the directories it writes while it runs; wait for that job to end, or choose "
                     "another " + key);
  };
  bool locked = false;
  if (mode == Mode::record_lock) {
    struct flock fl {};
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    if (::fcntl(fd_, F_SETLK, &fl) == 0) {
      locked = true;
    } else if (errno == EACCES || errno == EAGAIN) {
      // A holder that has just taken the lock writes its name a moment later.
      Holder h = parse(read_all(fd_));
      for (int i = 0; i < 20 && !h.named(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        h = parse(read_all(fd_));
      }
      refuse(h.named() ? h.describe() : "another process", "");
    } else if (errno != ENOSYS && errno != ENOLCK && errno != EOPNOTSUPP && errno != EINVAL) {
      const int err = errno;
      ::close(fd_);
      fd_ = -1;
      throw InputError(key + " = " + dir + ": cannot lock " + path_ + ": " + std::strerror(err));
    }
  }
  // What the record lock cannot tell: a holder on another host (locks kept per node), or,
  // without record locks, a live process on this one.
  const Holder h = parse(read_all(fd_));
  if (h.named() && !(h.get("host") == host_name() && h.pid() == ::getpid())) {
    struct stat st {};
    ::fstat(fd_, &st);
    const double age = std::difftime(std::time(nullptr), st.st_mtime);
    if (h.get("host") != host_name()) {
      if (age < kLeaseSeconds) {
        refuse(h.describe(), strprintf(" (its lease was refreshed %.0f s ago and lapses %d s after the last refresh)",
                                       age, kLeaseSeconds));
      }
    } else if (!locked && process_exists(h.pid())) {
      refuse(h.describe(), "");
    }
  }
  const std::string mine = identity() + "\n";
  if (!write_all(fd_, mine)) {
    const int err = errno;
    ::close(fd_);
    fd_ = -1;
    throw InputError(key + " = " + dir + ": cannot write " + path_ + ": " + std::strerror(err));
  }
  if (!locked) {
    // Two jobs that found the lease free at once both wrote: the last one keeps it.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    const std::string now = read_all(fd_);
    if (now != mine) {
      const Holder other = parse(now);
      refuse(other.named() ? other.describe() : "another process", "");
    }
  }
  refresher_ = std::thread([this] { refresh_until_stopped(); });
}

void DirectoryLock::refresh_until_stopped() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, std::chrono::seconds(kRefreshSeconds), [this] { return stop_; })) {
    ::futimens(fd_, nullptr);  // the lease's heartbeat: a failure only shortens what others wait
  }
}

DirectoryLock::~DirectoryLock() {
  if (fd_ < 0) return;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  if (refresher_.joinable()) refresher_.join();
  // Emptied, never removed: a job waiting on this file's lock must not end up holding the
  // lock of a file that a third job recreates beside it.
  const int emptied = ::ftruncate(fd_, 0);
  (void)emptied;  // if not, the record lock still goes with the close and the lease lapses
  ::close(fd_);
}

}  // namespace lamina
