#pragma once
// A job's hold on a directory it writes (output.dir, checkpoint.dir) for as long as it runs:
// a second job pointed at the same directory exits 2 at once, naming the directory and the
// job, host and process that hold it, instead of interleaving checkpoints and metrics.
//
// The hold is a POSIX record lock (fcntl F_SETLK) on `DIR/lamina.lock`, which holds the
// holder's identity. The kernel drops it when the process ends however it ends, so a killed
// job never blocks a restart. Record locks are coherent across nodes on GPFS, NFSv3 (lockd)
// and v4, Lustre mounted with `flock`, and BeeGFS with global file locks; Lustre's
// `localflock` and BeeGFS's default keep them per node. So the holder also refreshes the
// file's time every 10 s, and a lock that is free here but names a job on another host
// seen within the last 60 s is refused too. Where the file system has no record locks at
// all (Lustre's `noflock`: ENOSYS), that lease is the whole mechanism: on the same host a
// named process that no longer exists holds nothing; on another host the lease lapses 60 s
// after its job stopped refreshing it.
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>

namespace lamina {

class DirectoryLock {
 public:
  // Lease timing (seconds): how often the holder refreshes the file, and how long after the
  // last refresh another host's hold counts as alive.
  static constexpr int kRefreshSeconds = 10;
  static constexpr int kLeaseSeconds = 60;

  enum class Mode { record_lock, lease_only };

  DirectoryLock() = default;
  // Takes the hold on `dir` (which exists), or throws InputError naming `key` (the deck key
  // that names the directory), the directory and its holder. lease_only skips the record
  // lock, as on a file system without one.
  DirectoryLock(const std::string& dir, const std::string& key, Mode mode = Mode::record_lock);
  ~DirectoryLock();
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;

  // "host=H pid=P job=J(scheduler) started=T" (job "-" outside a batch system): what the
  // lock file says of the process that holds it, T the time of the call.
  static std::string identity();

 private:
  void refresh_until_stopped();

  std::string path_;
  int fd_ = -1;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  std::thread refresher_;
};

}  // namespace lamina
