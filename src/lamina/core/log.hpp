#pragma once
// Human-readable output of a run. Only rank 0 prints info; warnings and errors print
// on every rank with the rank in front, so a failing rank can be identified.
// A line that cannot be written (stdout redirected to a file on a full disk) is a
// RunError: the run stops instead of going on without a record. error() never throws:
// it reports the failure that ends the run.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "lamina/core/error.hpp"

namespace lamina {

class Log {
 public:
  enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

  Log(int rank = 0, Level level = Level::info) : rank_(rank), level_(level) {}

  void info(const std::string& msg) const {
    if (rank_ == 0 && level_ >= Level::info) checked_emit(stdout, msg);
  }
  void debug(const std::string& msg) const {
    if (rank_ == 0 && level_ >= Level::debug) checked_emit(stdout, msg);
  }
  void warn(const std::string& msg) const {
    if (level_ >= Level::warn) checked_emit(stderr, prefix() + "warning: " + msg);
  }
  void error(const std::string& msg) const { emit(stderr, prefix() + "error: " + msg); }
  int rank() const { return rank_; }
  void set_level(Level l) { level_ = l; }

 private:
  std::string prefix() const { return rank_ == 0 ? std::string() : "[rank " + std::to_string(rank_) + "] "; }
  static bool emit(std::FILE* f, const std::string& msg) {
    errno = 0;
    return std::fputs(msg.c_str(), f) >= 0 && std::fputc('\n', f) != EOF && std::fflush(f) == 0;
  }
  static void checked_emit(std::FILE* f, const std::string& msg) {
    if (emit(f, msg)) return;
    const std::string reason = errno != 0 ? std::strerror(errno) : "write error";
    std::string name = f == stdout ? "standard output" : "standard error";
    char target[4096];  // the file the stream goes to, where /proc tells
    const std::string fd = "/proc/self/fd/" + std::to_string(fileno(f));
    const ssize_t n = ::readlink(fd.c_str(), target, sizeof target - 1);
    if (n > 0) name += " (" + std::string(target, static_cast<std::size_t>(n)) + ")";
    throw RunError("cannot write the log to " + name + ": " + reason);
  }
  int rank_;
  Level level_;
};

}  // namespace lamina
