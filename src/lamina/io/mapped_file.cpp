#include "lamina/io/mapped_file.hpp"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csetjmp>
#include <csignal>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <utility>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  // O_NONBLOCK: a FIFO must not block the open; it is refused below.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    // Mapped files are data, weights and their shards: say what it is instead.
    throw InputError(path + (S_ISDIR(st.st_mode) ? ": is a directory, not a file" : ": not a regular file"));
  }
  size_ = static_cast<std::int64_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, static_cast<std::size_t>(size_), PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw InputError(path + ": cannot map: " + std::strerror(err));
    }
    data_ = static_cast<const std::uint8_t*>(p);
  }
  fd_ = fd;
}

MappedFile::MappedFile(MappedFile&& o) noexcept { *this = std::move(o); }

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  std::swap(path_, o.path_);
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  std::swap(fd_, o.fd_);
  return *this;
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<std::uint8_t*>(data_), static_cast<std::size_t>(size_));
  if (fd_ >= 0) ::close(fd_);
}

namespace {

// The read in progress on this thread, if any: where a SIGBUS returns to.
thread_local sigjmp_buf* t_guard = nullptr;
struct sigaction g_previous {};

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (t_guard != nullptr) siglongjmp(*t_guard, 1);
  // Not a guarded read: what would have happened without this handler.
  ::sigaction(sig, &g_previous, nullptr);
  if ((g_previous.sa_flags & SA_SIGINFO) != 0 && g_previous.sa_sigaction != nullptr) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_IGN && g_previous.sa_handler != SIG_DFL) {
    g_previous.sa_handler(sig);
  } else {
    ::raise(sig);
  }
}

void install_sigbus_guard() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous);
  });
}

}  // namespace

std::string MappedFile::shrank(std::int64_t now, std::int64_t end) const {
  return path_ + strprintf(": the file now holds %lld bytes, %lld when the run opened it (rewritten or truncated while "
                           "the run reads it?): the run cannot read the tokens below byte %lld; restore the file and "
                           "resume from the last checkpoint",
                           static_cast<long long>(now), static_cast<long long>(size_), static_cast<long long>(end));
}

std::string MappedFile::shrinkage() const {
  struct stat st {};
  if (fd_ < 0 || ::fstat(fd_, &st) != 0 || static_cast<std::int64_t>(st.st_size) >= size_) return "";
  return shrank(st.st_size, size_);
}

void MappedFile::read_checked(std::int64_t end, void (*read)(void*), void* context) const {
  struct stat st {};
  if (::fstat(fd_, &st) == 0 && static_cast<std::int64_t>(st.st_size) < end) throw RunError(shrank(st.st_size, end));
  install_sigbus_guard();
  sigjmp_buf jump;
  sigjmp_buf* const outer = t_guard;
  if (sigsetjmp(jump, 1) != 0) {
    t_guard = outer;
    throw RunError(shrank(::fstat(fd_, &st) == 0 ? static_cast<std::int64_t>(st.st_size) : -1, end));
  }
  t_guard = &jump;
  read(context);
  t_guard = outer;
}

}  // namespace lamina
