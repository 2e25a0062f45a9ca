#pragma once
// Typed errors. Library code throws; `main` catches, prints, and exits with the code.
// Exit codes (README): 0 success, 1 internal error, 2 bad input, 3 the run failed,
// 128 + signal: stopped by a signal after saving a checkpoint (core/stop_signal.hpp).
#include <stdexcept>
#include <string>

namespace lamina {

enum class ExitCode : int { success = 0, internal = 1, bad_input = 2, run_failed = 3 };

class Error : public std::runtime_error {
 public:
  Error(ExitCode code, const std::string& what) : std::runtime_error(what), code_(code) {}
  ExitCode code() const { return code_; }

 private:
  ExitCode code_;
};

// A deck, data file, reference file or checkpoint that cannot be used as given.
class InputError : public Error {
 public:
  explicit InputError(const std::string& what) : Error(ExitCode::bad_input, what) {}
};

// The run itself failed: non-finite loss, out of memory, a tolerance exceeded.
class RunError : public Error {
 public:
  explicit RunError(const std::string& what) : Error(ExitCode::run_failed, what) {}
};

// A failure every rank of the job met at the same point, having agreed on it (a checkpoint
// write that failed): each rank exits with it in order. An abort could end the job before
// the launcher passed on the ranks' messages.
class JobWideError : public RunError {
 public:
  explicit JobWideError(const std::string& what) : RunError(what) {}
};

}  // namespace lamina
