#include "lamina/train/background_checkpoint.hpp"

#include <chrono>
#include <stdexcept>
#include <utility>

#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/stop_signal.hpp"

namespace lamina {

BackgroundCheckpoint::BackgroundCheckpoint(MPI_Comm comm, const ParamLayout& layout, const ModelStateAccess& state) {
  snapshot_.reserve(layout, state);
  const BlockingSection section("the other ranks to set up background checkpoints");
  MPI_Comm_dup(comm, &comm_);
}

BackgroundCheckpoint::~BackgroundCheckpoint() {
  if (thread_.joinable()) thread_.join();
  MPI_Comm_free(&comm_);
}

bool BackgroundCheckpoint::thread_multiple() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level == MPI_THREAD_MULTIPLE;
}

const std::string& BackgroundCheckpoint::take_snapshot(const ParamLayout& layout, ModelStateAccess& state) {
  if (thread_.joinable()) throw std::logic_error("a background checkpoint's copy taken while it is written");
  snapshot_.take(layout, state);
  return snapshot_.first_nonfinite();
}

void BackgroundCheckpoint::start(const CheckpointMeta& meta, const std::string& dir, std::int64_t keep) {
  if (thread_.joinable()) throw std::logic_error("a background checkpoint started before the previous one finished");
  done_ = false;
  failed_ = false;
  error_ = nullptr;
  written_ = {};
  thread_ = std::thread([this, meta, dir, keep] {
    block_stop_signals_in_this_thread();
    try {
      write(meta, dir, keep);
    } catch (...) {
      error_ = std::current_exception();
      failed_ = true;
    }
    done_ = true;
  });
}

void BackgroundCheckpoint::write(const CheckpointMeta& meta, const std::string& dir, std::int64_t keep) {
  const auto t0 = std::chrono::steady_clock::now();
  const BlockingSection section(strprintf("the other ranks to write the checkpoint of step %lld in the background",
                                          static_cast<long long>(meta.step)));
  CheckpointWriter writer(dir, meta.step, comm_);
  snapshot_.write(writer);
  double bytes = static_cast<double>(writer.bytes_written());
  MPI_Allreduce(MPI_IN_PLACE, &bytes, 1, MPI_DOUBLE, MPI_SUM, comm_);
  written_.path = writer.commit(meta, keep);
  written_.bytes = static_cast<std::int64_t>(bytes);
  written_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

BackgroundCheckpoint::Written BackgroundCheckpoint::finish() {
  if (!thread_.joinable()) return {};
  thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  return std::exchange(written_, {});
}

}  // namespace lamina
