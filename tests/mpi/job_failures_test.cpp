// What clusters do to a job, each on a job of its own started with mpirun: a killed rank
// and a stopped (hung) rank end the job instead of freezing it, and a preemption signal
// saves a checkpoint from which the run continues bit for bit. Signals go only to this
// test's own processes (its mpirun and that mpirun's children), never to other jobs.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "mpi_launcher.hpp"
#include "checkpoint_tensors.hpp"
#include "lamina/core/deck.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

const char* kDeck = R"([model]
layers = 4
d_model = 32
heads = 4
seq_len = 16
vocab_size = 64
[data]
format = "synthetic"
batch_size = 8
micro_batch_size = 2
[train]
steps = 1000000
seed = 5
[optimizer]
lr = 1e-2
warmup_steps = 2
schedule = "constant"
subgroup_size = 700
[checkpoint]
save_final = false
[output]
peak_tflops = 1.0
log_every = 1
)";

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A file under /proc of a process that may exit while it is read: reading fails with ESRCH
// then (which std::ifstream turns into an exception), and the process counts as gone.
std::string read_proc(const std::string& path) {
  std::string out;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) out.append(buf, static_cast<std::size_t>(n));
  ::close(fd);
  return out;
}

// One `mpirun lamina ...` in the background, its output in a file. It knows its mpirun's
// pid, and so its own ranks: the children of that mpirun. Each rank's standard error goes
// to a file of its own, not through the launcher: MPICH's hydra may drop what a rank wrote
// just before its MPI_Abort, and these tests look for lamina's message, not hydra's.
class Job {
 public:
  // shell: what the shell runs before it becomes mpirun (limits, say); args may start more
  // ranks of lamina (mpirun's `: -np 1 lamina ...`)
  Job(int np, const std::string& args, std::string log, const std::string& shell = "") : log_(std::move(log)) {
    for (const std::string& f : stderr_files()) fs::remove(f);
    std::string cmd = shell + "exec " LAMINA_MPIRUN " -np " + std::to_string(np) + " " + LAMINA_BINARY + " " + args;
    const std::string binary = std::string(LAMINA_BINARY) + " ";
    const std::string rank = "sh -c 'exec \"$0\" \"$@\" 2>\"" + log_ + ".stderr.$$\"' " + binary;
    for (auto at = cmd.find(binary); at != std::string::npos; at = cmd.find(binary, at + rank.size())) {
      cmd.replace(at, binary.size(), rank);
    }
    pid_ = ::fork();
    if (pid_ == 0) {
      const int fd = ::open(log_.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      ::dup2(fd, 1);
      ::dup2(fd, 2);
      ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~Job() {
    if (code_ == kRunning) {
      ::kill(pid_, SIGKILL);
      for (const auto& [rank, pid] : ranks()) ::kill(pid, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
  }
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  // The job's ranks by world rank: the processes below this mpirun that know their rank
  // (Open MPI starts them itself; MPICH's hydra through a proxy of its own).
  std::map<int, pid_t> ranks() const {
    std::map<pid_t, pid_t> parent;
    for (const auto& e : fs::directory_iterator("/proc")) {
      const std::string name = e.path().filename().string();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      const std::string stat = read_proc(e.path().string() + "/stat");
      const auto close = stat.rfind(')');
      if (close == std::string::npos) continue;
      std::istringstream rest(stat.substr(close + 2));
      char state = 0;
      pid_t up = 0;
      rest >> state >> up;
      parent[static_cast<pid_t>(std::stol(name))] = up;
    }
    auto below = [&](pid_t p) {
      for (int depth = 0; depth < 4 && parent.count(p); ++depth) {
        p = parent[p];
        if (p == pid_) return true;
      }
      return false;
    };
    std::map<int, pid_t> out;
    for (const auto& [pid, up] : parent) {
      (void)up;
      if (!below(pid)) continue;
      const std::string env = read_proc("/proc/" + std::to_string(pid) + "/environ");
      for (const std::string var : {"OMPI_COMM_WORLD_RANK=", "PMI_RANK="}) {
        std::size_t at = env.find(var);
        // A whole variable: at the start of the environment or after a NUL.
        while (at != std::string::npos && at > 0 && env[at - 1] != '\0') at = env.find(var, at + 1);
        if (at != std::string::npos) {
          out[std::atoi(env.c_str() + at + var.size())] = pid;
          break;
        }
      }
    }
    return out;
  }

  // Waits until the job has `np` ranks and `file` exists (a sign that training runs).
  bool wait_for_start(std::size_t np, const std::string& file, double seconds) {
    const auto t0 = Clock::now();
    while (since(t0) < seconds && finished() == kRunning) {
      if (ranks().size() == np && fs::exists(file) && fs::file_size(file) > 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

  // The exit code of mpirun, waiting at most `seconds` (kRunning if still running).
  int wait(double seconds) {
    const auto t0 = Clock::now();
    while (finished() == kRunning && since(t0) < seconds) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    return code_;
  }

  // What the launcher printed, then each rank's standard error.
  std::string output() const {
    std::string out = slurp(log_);
    for (const std::string& f : stderr_files()) out += slurp(f);
    return out;
  }

  static constexpr int kRunning = -1000;

 private:
  int finished() {
    if (code_ != kRunning) return code_;
    int status = 0;
    if (::waitpid(pid_, &status, WNOHANG) == pid_) code_ = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return code_;
  }

  std::vector<std::string> stderr_files() const {
    std::vector<std::string> out;
    const fs::path log(log_);
    const std::string prefix = log.filename().string() + ".stderr.";
    for (const auto& e : fs::directory_iterator(log.parent_path())) {
      if (e.path().filename().string().rfind(prefix, 0) == 0) out.push_back(e.path().string());
    }
    std::sort(out.begin(), out.end());
    return out;
  }

  std::string log_;
  pid_t pid_ = -1;
  int code_ = kRunning;
};

class JobFailures : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    dir_ = (fs::temp_directory_path() / ("lamina_failures_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/deck.toml") << kDeck;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

 protected:
  static std::string args(const std::string& name, const std::vector<std::string>& sets) {
    std::string a = "train " + dir_ + "/deck.toml --set output.dir=" + dir_ + "/" + name;
    for (const auto& s : sets) a += " --set " + s;
    return a;
  }
  static std::string metrics(const std::string& name) { return dir_ + "/" + name + "/metrics.jsonl"; }

  static std::string dir_;
};

std::string JobFailures::dir_;

// Ranks started with different decks (here a --set that differs between the two halves of
// one launch) are refused at start-up, naming the first line that differs, instead of
// diverging silently and hanging in their first checkpoint.
TEST_F(JobFailures, RanksWithDifferentDecksAreRefusedNamingTheFirstDifference) {
  const std::string a = args("decks", {"parallel.dp=2", "train.steps=2"});
  Job job(1, a + " --set optimizer.lr=1e-3 : -np 1 " + std::string(LAMINA_BINARY) + " " + a +
                 " --set optimizer.lr=2e-3",
          dir_ + "/decks.log");
  EXPECT_EQ(job.wait(60), 2) << job.output();
  EXPECT_NE(job.output().find("ranks run different decks or data: [optimizer] `lr = 0.001` on rank 0, "
                              "`lr = 0.002` on rank 1"),
            std::string::npos)
      << job.output();
  EXPECT_FALSE(fs::exists(metrics("decks")));
}

// Bad input found by the ranks as they set up: exit 2 with the message, and no rank takes
// the others' MPI_Abort (a SIGTERM) for a request to stop and save.
TEST_F(JobFailures, BadInputUnderMpiIsNotTakenForAStopRequest) {
  std::ofstream(dir_ + "/short.txt") << "abc";
  Job job(2, args("short", {"parallel.dp=2", "data.format=text", "data.path=" + dir_ + "/short.txt", "model.vocab_size=256"}),
          dir_ + "/short.log");
  EXPECT_EQ(job.wait(60), 2) << job.output();
  const std::string out = job.output();
  EXPECT_NE(out.find("the data holds 3 tokens, fewer than model.seq_len + 1 = 17"), std::string::npos) << out;
  EXPECT_EQ(out.find("stop requested"), std::string::npos) << out;
}

// A checkpoint the file system cannot take (a file-size limit stands in for a full disk:
// ulimit -f, SIGXFSZ ignored) ends every rank at once with exit 3, naming the file system
// and the bytes, instead of leaving them in HDF5's collective calls until parallel.timeout;
// no .tmp is left and `latest` still names the last checkpoint that was written.
TEST_F(JobFailures, ACheckpointThatDoesNotFitEndsEveryRankAtOnce) {
  std::vector<std::string> sets = {"parallel.dp=2", "model.layers=2", "model.d_model=512", "checkpoint.save_final=true",
                                   "optimizer.warmup_steps=0", "parallel.timeout=120"};
  auto one = sets;
  one.push_back("train.steps=1");
  Job first(2, args("full", one), dir_ + "/full1.log");
  ASSERT_EQ(first.wait(120), 0) << first.output();
  for (const char* s : {"train.steps=2", "checkpoint.resume=latest"}) sets.push_back(s);
  const auto t0 = Clock::now();
  Job job(2, args("full", sets), dir_ + "/full2.log", "trap '' XFSZ; ulimit -f 32768; ");
  EXPECT_EQ(job.wait(120), 3) << job.output();
  EXPECT_LT(since(t0), 60.0);
  const std::string out = job.output();
  const std::string ckpt = dir_ + "/full/checkpoints";
  EXPECT_NE(out.find("error: cannot write " + ckpt + "/step_00000002.h5.tmp (the checkpoint needs about 78.90 MiB): "),
            std::string::npos)
      << out;
  // sh counts ulimit -f in 512-byte blocks
  EXPECT_NE(out.find(" free of "), std::string::npos) << out;
  EXPECT_NE(out.find(", under a file-size limit of 16.00 MiB (ulimit -f)"), std::string::npos) << out;
  EXPECT_EQ(out.find("waited more than parallel.timeout"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(ckpt + "/step_00000002.h5.tmp"));
  EXPECT_EQ(slurp(ckpt + "/latest"), "step_00000001.h5\n");
  EXPECT_TRUE(fs::exists(ckpt + "/step_00000001.h5"));
}

// The same written in the background (a periodic checkpoint while training goes on): the
// ranks' writers agree on the failure, and every rank stops after the same step with it.
TEST_F(JobFailures, ABackgroundCheckpointThatDoesNotFitStopsEveryRank) {
  std::vector<std::string> sets = {"parallel.dp=2", "model.layers=2", "model.d_model=512", "optimizer.warmup_steps=0",
                                   "parallel.timeout=120"};
  auto one = sets;
  for (const char* s : {"train.steps=1", "checkpoint.save_final=true"}) one.push_back(s);
  Job first(2, args("full_async", one), dir_ + "/full_async1.log");
  ASSERT_EQ(first.wait(120), 0) << first.output();
  for (const char* s : {"train.steps=6", "checkpoint.every=1", "checkpoint.resume=latest"}) sets.push_back(s);
  Job job(2, args("full_async", sets), dir_ + "/full_async2.log", "trap '' XFSZ; ulimit -f 32768; ");
  EXPECT_EQ(job.wait(120), 3) << job.output();
  const std::string out = job.output();
  const std::string ckpt = dir_ + "/full_async/checkpoints";
  EXPECT_NE(out.find("checkpoint: step 2 copied to host memory"), std::string::npos) << out;
  EXPECT_NE(out.find("error: cannot write " + ckpt + "/step_00000002.h5.tmp (the checkpoint needs about 78.90 MiB): "),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("; the background checkpoint of step 2 is not written (the last one in " + ckpt +
                     " is kept), and the run stops"),
            std::string::npos)
      << out;
  EXPECT_EQ(out.find("step 6/6"), std::string::npos) << out;
  EXPECT_EQ(out.find("waited more than parallel.timeout"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(ckpt + "/step_00000002.h5.tmp"));
  EXPECT_EQ(slurp(ckpt + "/latest"), "step_00000001.h5\n");
}

TEST_F(JobFailures, AKilledRankEndsTheJobWithinSeconds) {
  Job job(2, args("killed", {"parallel.dp=2"}), dir_ + "/killed.log");
  ASSERT_TRUE(job.wait_for_start(2, metrics("killed"), 60)) << job.output();
  const auto t0 = Clock::now();
  ::kill(job.ranks().at(1), SIGKILL);
  const int code = job.wait(30);
  EXPECT_NE(code, Job::kRunning) << "the job still runs 30 s after a rank was killed:\n" << job.output();
  EXPECT_NE(code, 0) << job.output();
  EXPECT_LT(since(t0), 30.0);
}

// A stopped rank (SIGSTOP: what a hung node or a debugger looks like to the others) ends
// the job after parallel.timeout, with exit 3 and a message naming the wait.
class StoppedRank : public JobFailures, public ::testing::WithParamInterface<std::vector<std::string>> {};

TEST_P(StoppedRank, EndsTheJobAfterTheTimeout) {
  std::vector<std::string> sets = GetParam();
  sets.push_back("parallel.timeout=4");
  // A directory of its own: a metrics file of another run must not look like this one's start.
  std::string name = "stopped";
  for (std::string s : GetParam()) name += "_" + s.replace(s.find('='), 1, "").substr(s.find('.') + 1);
  Job job(4, args(name, sets), dir_ + "/" + name + ".log");
  ASSERT_TRUE(job.wait_for_start(4, metrics(name), 60)) << job.output();
  const auto t0 = Clock::now();
  const pid_t victim = job.ranks().at(3);
  ::kill(victim, SIGSTOP);
  const int code = job.wait(60);
  ::kill(victim, SIGKILL);  // in case mpirun left it stopped
  const std::string out = job.output();
  EXPECT_EQ(code, 3) << out;
  EXPECT_GE(since(t0), 4.0);
  EXPECT_LT(since(t0), 40.0) << out;
  EXPECT_NE(out.find("waited more than parallel.timeout = 4 s for MPI_"), std::string::npos) << out;
}

INSTANTIATE_TEST_SUITE_P(Layouts, StoppedRank,
                         ::testing::Values(std::vector<std::string>{"parallel.dp=2", "parallel.tp=2"},
                                           std::vector<std::string>{"parallel.dp=2", "parallel.pp=2"}),
                         [](const auto& info) { return info.index == 0 ? "dp2_tp2" : "dp2_pp2"; });

// SIGUSR1 to every rank, as Slurm's --signal delivers it: the ranks finish the step, save,
// and exit 128 + 10. Resuming from that checkpoint gives, bit for bit, the state of a run
// that was never interrupted. (Not through mpirun: MPICH's hydra forwards the signal but
// then reports 0 for a rank whose exit it collects after the forwarding, so its exit code
// would be the launcher's race, not lamina's.)
TEST_F(JobFailures, APreemptionSignalSavesACheckpointThatResumesBitForBit) {
  const std::vector<std::string> layout = {"parallel.pp=2"};
  auto sets = layout;
  // A checkpoint every step, written in the background: the signal comes while one is
  // written, which the ranks finish before they save the last.
  sets.push_back("checkpoint.every=1");
  Job job(2, args("preempted", sets), dir_ + "/preempted.log");
  ASSERT_TRUE(job.wait_for_start(2, metrics("preempted"), 60)) << job.output();
  // Step 1's checkpoint is complete, so the ranks have passed step 1's end.
  for (int i = 0; i < 3000 && !fs::exists(dir_ + "/preempted/checkpoints/latest"); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  for (const auto& [rank, pid] : job.ranks()) ::kill(pid, SIGUSR1);
  const int code = job.wait(60);
  const std::string out = job.output();
  ASSERT_EQ(code, 128 + SIGUSR1) << out;
  EXPECT_NE(out.find("stopped by SIGUSR1 after step "), std::string::npos) << out;
  const std::string latest = slurp(dir_ + "/preempted/checkpoints/latest");
  ASSERT_FALSE(latest.empty()) << out;
  const long stopped = std::atol(latest.c_str() + latest.find('_') + 1);
  ASSERT_GT(stopped, 1) << latest;
  char previous[64];
  std::snprintf(previous, sizeof previous, "step_%08ld.h5 written in the background", stopped - 1);
  EXPECT_NE(out.find(previous), std::string::npos) << out;
  EXPECT_LT(out.find(previous), out.find("stopped by SIGUSR1 after step ")) << out;
  for (const auto& e : fs::directory_iterator(dir_ + "/preempted/checkpoints")) {
    EXPECT_NE(e.path().extension(), ".tmp") << e.path();
  }

  // Two more steps from the checkpoint, and the same number from scratch.
  const std::string total = "train.steps=" + std::to_string(stopped + 2);
  auto resumed = layout;
  for (const char* s : {"checkpoint.save_final=true", "checkpoint.resume=latest"}) resumed.push_back(s);
  resumed.push_back(total);
  resumed.push_back("checkpoint.dir=" + dir_ + "/preempted/checkpoints");
  Job resume(2, args("resumed", resumed), dir_ + "/resumed.log");
  ASSERT_EQ(resume.wait(120), 0) << resume.output();
  auto scratch = layout;
  scratch.push_back("checkpoint.save_final=true");
  scratch.push_back(total);
  Job uninterrupted(2, args("uninterrupted", scratch), dir_ + "/uninterrupted.log");
  ASSERT_EQ(uninterrupted.wait(300), 0) << uninterrupted.output();
  char name[64];
  std::snprintf(name, sizeof name, "/step_%08ld.h5", stopped + 2);
  const ModelConfig model = parse_deck(kDeck, "deck.toml").model;
  const auto fresh = checkpoint_tensors(dir_ + "/uninterrupted/checkpoints" + name, model);
  EXPECT_FALSE(fresh.empty());
  EXPECT_TRUE(checkpoint_tensors(dir_ + "/preempted/checkpoints" + name, model) == fresh)
      << "the resumed run's state differs from the uninterrupted run's";
}

}  // namespace
}  // namespace lamina::test
