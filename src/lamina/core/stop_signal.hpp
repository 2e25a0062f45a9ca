#pragma once
// Batch schedulers preempt with a signal (Slurm: SIGTERM before the kill, or the one named
// by --signal, often SIGUSR1; Ctrl-C is SIGINT). The first such signal only asks the run to
// stop: training finishes its step, the ranks agree, a checkpoint is written and the job
// exits with 128 + the signal. A second signal exits at once.
#include "lamina/core/error.hpp"

namespace lamina {

// Installs the handlers for SIGINT, SIGTERM and SIGUSR1 (SIGUSR1 is the one mpirun forwards
// to its ranks).
void install_stop_handlers();

// Leaves those signals to the process's other threads (a background checkpoint writer's
// system calls are not interrupted, and the training thread sees the request).
void block_stop_signals_in_this_thread();

// The signal that asked this process to stop, 0 if none.
int stop_requested();

// "SIGTERM", "SIGINT", "SIGUSR1", else "a signal".
const char* signal_name(int signal);

// The run stopped on a signal after saving its work: exit 128 + signal on every rank (the
// ranks agreed on it, so the job is not aborted).
class Interrupted : public Error {
 public:
  Interrupted(int signal, const std::string& what) : Error(static_cast<ExitCode>(128 + signal), what), signal_(signal) {}
  int signal() const { return signal_; }

 private:
  int signal_;
};

}  // namespace lamina
