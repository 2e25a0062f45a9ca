#pragma once
// Human-readable output of a run. Only rank 0 prints info; warnings and errors print
// on every rank with the rank in front, so a failing rank can be identified.
#include <cstdio>
#include <string>

namespace lamina {

class Log {
 public:
  enum class Level { error = 0, warn = 1, info = 2, debug = 3 };

  Log(int rank = 0, Level level = Level::info) : rank_(rank), level_(level) {}

  void info(const std::string& msg) const {
    if (rank_ == 0 && level_ >= Level::info) emit(stdout, msg);
  }
  void debug(const std::string& msg) const {
    if (rank_ == 0 && level_ >= Level::debug) emit(stdout, msg);
  }
  void warn(const std::string& msg) const {
    if (level_ >= Level::warn) emit(stderr, prefix() + "warning: " + msg);
  }
  void error(const std::string& msg) const { emit(stderr, prefix() + "error: " + msg); }
  int rank() const { return rank_; }
  void set_level(Level l) { level_ = l; }

 private:
  std::string prefix() const { return rank_ == 0 ? std::string() : "[rank " + std::to_string(rank_) + "] "; }
  static void emit(std::FILE* f, const std::string& msg) {
    std::fputs(msg.c_str(), f);
    std::fputc('\n', f);
    std::fflush(f);
  }
  int rank_;
  Level level_;
};

}  // namespace lamina
