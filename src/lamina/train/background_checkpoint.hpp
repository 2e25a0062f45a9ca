#pragma once
// Checkpoints written while training goes on (checkpoint.async): at the step boundary the
// training thread copies the pieces its rank writes into host memory (ModelStateSnapshot),
// and a thread of this object's writes them, committing the file exactly as a synchronous
// write does (`.tmp`, rename, `latest`, retention, checksums). One write at a time: the next
// checkpoint first finishes the previous one. The writers of all ranks talk over a
// communicator of their own, so that their collectives never meet training's; HDF5, which
// is not thread-safe, is used by one thread at a time (the trainer touches it only in
// checkpoints, after finish()).
#include <mpi.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <memory>
#include <string>
#include <thread>

#include "lamina/io/checkpoint.hpp"
#include "lamina/io/model_checkpoint.hpp"

namespace lamina {

class BackgroundCheckpoint {
 public:
  // Collective over `comm` (duplicates it). Needs MPI_THREAD_MULTIPLE (thread_multiple()).
  // Allocates the host copy of the layers of `state` that this rank writes.
  BackgroundCheckpoint(MPI_Comm comm, const ParamLayout& layout, const ModelStateAccess& state);
  // Finishes a write in flight (a job that stops on an error keeps the checkpoint it was
  // writing); an error of that write is dropped: the job already ends on another.
  ~BackgroundCheckpoint();
  BackgroundCheckpoint(const BackgroundCheckpoint&) = delete;
  BackgroundCheckpoint& operator=(const BackgroundCheckpoint&) = delete;

  // Whether this process's MPI lets a second thread communicate.
  static bool thread_multiple();

  // Copies the layers of the state that this rank writes into host memory (collective over
  // the data-parallel group, as a synchronous write's gathers are); no write may be in
  // flight. Returns the first tensor it copied with a NaN or an infinity, "" if none.
  const std::string& take_snapshot(const ParamLayout& layout, ModelStateAccess& state);
  // Starts writing that copy as step `meta.step`'s checkpoint into `dir`.
  void start(const CheckpointMeta& meta, const std::string& dir, std::int64_t keep);
  std::int64_t snapshot_bytes() const { return snapshot_.bytes(); }
  bool busy() const { return thread_.joinable(); }
  // The write in flight has ended (finish() then returns at once), or ended with an error.
  // Any thread may ask at any time; the ranks agree on a write's outcome, but each learns
  // of it at its own time.
  bool done() const { return done_; }
  bool failed() const { return failed_; }

  struct Written {
    std::string path;      // "" when no write was in flight
    double seconds = 0.0;  // from start() to the commit
    std::int64_t bytes = 0;  // all ranks'
  };
  // Waits for the write in flight and rethrows its error.
  Written finish();

 private:
  void write(const CheckpointMeta& meta, const std::string& dir, std::int64_t keep);
  MPI_Comm comm_ = MPI_COMM_NULL;
  ModelStateSnapshot snapshot_;  // its buffers serve every checkpoint of the run
  std::thread thread_;
  std::atomic<bool> done_{false}, failed_{false};
  std::exception_ptr error_;
  Written written_;
};

}  // namespace lamina
