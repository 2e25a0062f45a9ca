#include "lamina/core/text_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

namespace {

const char* kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

std::string read_text_file(const std::string& path, const std::string& what, std::int64_t max_bytes) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer; it is refused below.
  const Fd fd(::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC));
  if (fd.get() < 0) throw InputError(path + ": cannot open the " + what + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) throw InputError(path + ": cannot stat the " + what + ": " + std::strerror(errno));
  if (!S_ISREG(st.st_mode)) {
    throw InputError(path + ": is " + kind_of(st.st_mode) + ", not a " + what + " file");
  }
  const auto too_large = [&](std::int64_t bytes) {
    return InputError(strprintf("%s: %lld bytes or more; a %s is at most %lld bytes: is this the right file?",
                                path.c_str(), static_cast<long long>(bytes), what.c_str(),
                                static_cast<long long>(max_bytes)));
  };
  if (st.st_size > max_bytes) throw too_large(static_cast<std::int64_t>(st.st_size));
  // The size can change while it is read (a file still being written): the cap holds anyway.
  std::string text;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw InputError(path + ": cannot read the " + what + ": " + std::strerror(errno));
    }
    if (n == 0) break;
    text.append(buf, static_cast<std::size_t>(n));
    if (static_cast<std::int64_t>(text.size()) > max_bytes) throw too_large(static_cast<std::int64_t>(text.size()));
  }
  return text;
}

}  // namespace lamina
