// The `lamina` command stopping a run: on a signal (it saves and resumes bit for bit), when
// it has diverged for good (instead of skipping steps forever), before a run too large
// for the machine starts, and before a model that is not finite is saved. Bad input and
// failed writes: lamina_failures_test.cpp.
#include <fcntl.h>
#include <Kokkos_Core.hpp>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>

#include "checkpoint_tensors.hpp"
#include "lamina/core/deck.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;

const char* kDeck = R"([model]
layers = 2
d_model = 32
heads = 2
seq_len = 16
vocab_size = 64
[data]
format = "synthetic"
batch_size = 4
[train]
steps = 1000000
seed = 9
[optimizer]
lr = 1e-2
warmup_steps = 2
schedule = "constant"
[checkpoint]
save_final = false
[output]
peak_tflops = 1.0
)";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// `lamina <args>` in the background, output to `log`; returns its pid.
pid_t start(const std::string& args, const std::string& log) {
  const std::string cmd = std::string("exec ") + LAMINA_BINARY + " " + args;
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    ::execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    ::_exit(127);
  }
  return pid;
}

int finish(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

class LaminaStop : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lamina_stop_cli_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/deck.toml") << kDeck;
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string train(const std::string& out, const std::string& sets) const {
    return "train " + dir_ + "/deck.toml --set output.dir=" + dir_ + "/" + out + " " + sets;
  }
  std::string dir_;
};

// Two jobs pointed at one output.dir: the second exits 2 at once naming the holder's pid and
// writes nothing there; the first goes on. Killed with SIGKILL (no clean-up at all), the
// first leaves a lock file that does not block the restart.
TEST_F(LaminaStop, ASecondJobOnTheSameOutputDirExits2AndAKilledJobsLockDoesNotBlock) {
  const pid_t first = start(train("shared", ""), dir_ + "/first.log");
  const std::string lock = dir_ + "/shared/lamina.lock", metrics = dir_ + "/shared/metrics.jsonl";
  for (int i = 0; i < 3000 && !(fs::exists(metrics) && fs::file_size(metrics) > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ASSERT_NE(slurp(lock).find("pid=" + std::to_string(first)), std::string::npos) << slurp(lock);
  const auto t0 = std::chrono::steady_clock::now();
  const pid_t second = start(train("shared", "--set train.seed=7"), dir_ + "/second.log");
  EXPECT_EQ(finish(second), 2) << slurp(dir_ + "/second.log");
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  const std::string said = slurp(dir_ + "/second.log");
  EXPECT_NE(said.find("output.dir = " + dir_ + "/shared is in use by a job on host "), std::string::npos) << said;
  EXPECT_NE(said.find(", pid " + std::to_string(first) + " (started "), std::string::npos) << said;
  EXPECT_EQ(slurp(dir_ + "/shared/deck.resolved.toml").find("seed = 7"), std::string::npos);
  ::kill(first, SIGKILL);
  finish(first);
  ASSERT_EQ(finish(start(train("shared", "--set train.steps=2"), dir_ + "/third.log")), 0) << slurp(dir_ + "/third.log");
  EXPECT_EQ(slurp(lock), "");  // released at the end
}

// A checkpoint.dir inside another job's output.dir meets that job's hold on it (its
// retention once deleted the other job's checkpoints), and so does convert writing there.
TEST_F(LaminaStop, ACheckpointDirInsideARunningJobsOutputDirIsRefused) {
  const pid_t first = start(train("owner", ""), dir_ + "/owner.log");
  const std::string metrics = dir_ + "/owner/metrics.jsonl", theirs = dir_ + "/owner/checkpoints";
  for (int i = 0; i < 3000 && !(fs::exists(metrics) && fs::file_size(metrics) > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  // A few steps: were it let in, it would end soon anyway.
  const pid_t second =
      start(train("intruder", "--set train.steps=20 --set checkpoint.dir=" + theirs), dir_ + "/intruder.log");
  EXPECT_EQ(finish(second), 2) << slurp(dir_ + "/intruder.log");
  const std::string said = slurp(dir_ + "/intruder.log");
  EXPECT_NE(said.find("checkpoint.dir = " + theirs + " is in use by a job on host "), std::string::npos) << said;
  EXPECT_NE(said.find(", pid " + std::to_string(first) + " (started "), std::string::npos) << said;
  ::kill(first, SIGKILL);
  finish(first);
}

// The race of the issue that asked for the lock: two jobs started 50 ms apart with different
// seeds. One runs to the end, the other exits 2; the directory holds the winner's deck and
// an unbroken metrics.jsonl of its steps alone.
TEST_F(LaminaStop, TwoJobsStarted50msApartOnOneOutputDirLeaveOneRunsFiles) {
  const std::string steps = "--set train.steps=20000 --set checkpoint.every=10000 --set output.log_every=1";
  const pid_t a = start(train("race", steps + " --set train.seed=1"), dir_ + "/a.log");
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  const pid_t b = start(train("race", steps + " --set train.seed=2"), dir_ + "/b.log");
  const int ca = finish(a), cb = finish(b);
  ASSERT_TRUE((ca == 0 && cb == 2) || (ca == 2 && cb == 0)) << ca << " " << cb << "\n"
                                                            << slurp(dir_ + "/a.log") << slurp(dir_ + "/b.log");
  const std::string loser = slurp(dir_ + (ca == 2 ? "/a.log" : "/b.log"));
  EXPECT_NE(loser.find("is in use by a job on host "), std::string::npos) << loser;
  const std::string winner_seed = ca == 0 ? "seed = 1" : "seed = 2";
  EXPECT_NE(slurp(dir_ + "/race/deck.resolved.toml").find(winner_seed), std::string::npos);
  std::ifstream metrics(dir_ + "/race/metrics.jsonl");
  std::string line;
  long expect = 1;
  while (std::getline(metrics, line)) {
    EXPECT_NE(line.find("\"step\": " + std::to_string(expect) + ","), std::string::npos) << line;
    ++expect;
  }
  EXPECT_EQ(expect, 20001);
}

// A data file truncated under the run: the run saves what it has trained and exits 3 naming
// the file and the checkpoint, which resumes once the file is restored.
TEST_F(LaminaStop, ADataFileThatShrinksUnderTheRunSavesTheWorkAndExits3) {
  const std::string data = dir_ + "/corpus.txt", text(1 << 20, 'a');
  std::ofstream(data) << text;
  const std::string sets = "--set data.format=text --set data.path=" + data + " --set model.vocab_size=256";
  const std::string log = dir_ + "/shrunk.log";
  const pid_t pid = start(train("shrunk", sets), log);
  const std::string metrics = dir_ + "/shrunk/metrics.jsonl";
  for (int i = 0; i < 3000 && !(fs::exists(metrics) && fs::file_size(metrics) > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  fs::resize_file(data, 100);
  ASSERT_EQ(finish(pid), 3) << slurp(log);
  const std::string out = slurp(log);
  EXPECT_NE(out.find("error: " + data + ": the file now holds 100 bytes, 1048576 when the run opened it"),
            std::string::npos)
      << out;
  const std::string latest = slurp(dir_ + "/shrunk/checkpoints/latest");
  ASSERT_FALSE(latest.empty()) << out;
  EXPECT_NE(out.find("; the run stopped after step " + std::to_string(std::atol(latest.c_str() + 5)) + ", saved in " +
                     dir_ + "/shrunk/checkpoints/" + latest.substr(0, latest.size() - 1)),
            std::string::npos)
      << out;
  std::ofstream(data) << text;
  const std::string resume = sets + " --set checkpoint.resume=latest --set train.steps=" +
                             std::to_string(std::atol(latest.c_str() + 5) + 1);
  EXPECT_EQ(finish(start(train("shrunk", resume), dir_ + "/resumed.log")), 0) << slurp(dir_ + "/resumed.log");
  EXPECT_EQ(slurp(dir_ + "/resumed.log").find("warning:"), std::string::npos) << slurp(dir_ + "/resumed.log");
  // Restored with other contents of another length: the run goes on, and says so.
  std::ofstream(data) << text << text;
  const std::string longer = sets + " --set checkpoint.resume=latest --set train.steps=" +
                             std::to_string(std::atol(latest.c_str() + 5) + 2);
  EXPECT_EQ(finish(start(train("shrunk", longer), dir_ + "/longer.log")), 0) << slurp(dir_ + "/longer.log");
  EXPECT_NE(slurp(dir_ + "/longer.log").find("the training data held 1048576 tokens when step "), std::string::npos)
      << slurp(dir_ + "/longer.log");
}

// `lamina eval` reads checkpoint.dir and holds only its own output.dir: it evaluates the
// checkpoints of a job that is still training there.
TEST_F(LaminaStop, EvalReadsTheCheckpointsOfAJobThatStillTrains) {
  const std::string data = dir_ + "/corpus.txt";
  std::ofstream(data) << std::string(1 << 16, 'b');
  const std::string sets = "--set data.format=text --set data.path=" + data + " --set data.eval_path=" + data +
                           " --set model.vocab_size=256 --set checkpoint.every=1 --set checkpoint.keep=1000";
  const pid_t job = start(train("running", sets), dir_ + "/running.log");
  const std::string latest = dir_ + "/running/checkpoints/latest";
  for (int i = 0; i < 3000 && !fs::exists(latest); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_TRUE(fs::exists(latest)) << slurp(dir_ + "/running.log");
  const std::string eval = "eval " + dir_ + "/deck.toml --set output.dir=" + dir_ + "/evaluated " + sets +
                           " --set checkpoint.dir=" + dir_ + "/running/checkpoints --set checkpoint.resume=latest";
  const int code = finish(start(eval, dir_ + "/eval.log"));
  ::kill(job, SIGKILL);
  finish(job);
  EXPECT_EQ(code, 0) << slurp(dir_ + "/eval.log");
  EXPECT_NE(slurp(dir_ + "/evaluated/metrics.jsonl").find("\"eval_loss\": "), std::string::npos) << slurp(dir_ + "/eval.log");
}

// Ctrl-C: the step finishes, a checkpoint is written, exit 130; two more steps from it
// equal, byte for byte, two more steps of a run that was never stopped.
TEST_F(LaminaStop, SigintSavesACheckpointThatResumesBitForBit) {
  const std::string log = dir_ + "/stopped.log";
  const pid_t pid = start(train("stopped", ""), log);
  const std::string metrics = dir_ + "/stopped/metrics.jsonl";
  for (int i = 0; i < 3000 && !(fs::exists(metrics) && fs::file_size(metrics) > 0); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGINT);
  ASSERT_EQ(finish(pid), 128 + SIGINT) << slurp(log);
  const std::string out = slurp(log);
  EXPECT_NE(out.find("stopped by SIGINT after step "), std::string::npos) << out;
  const std::string latest = slurp(dir_ + "/stopped/checkpoints/latest");
  ASSERT_FALSE(latest.empty()) << out;
  const long step = std::atol(latest.c_str() + latest.find('_') + 1);
  ASSERT_GT(step, 0) << latest;

  const std::string steps = "--set train.steps=" + std::to_string(step + 2) + " --set checkpoint.save_final=true";
  ASSERT_EQ(finish(start(train("stopped", steps + " --set checkpoint.resume=latest"), dir_ + "/resumed.log")), 0)
      << slurp(dir_ + "/resumed.log");
  ASSERT_EQ(finish(start(train("fresh", steps), dir_ + "/fresh.log")), 0) << slurp(dir_ + "/fresh.log");
  char name[64];
  std::snprintf(name, sizeof name, "/checkpoints/step_%08ld.h5", step + 2);
  const ModelConfig model = parse_deck(kDeck, "deck.toml").model;
  const auto fresh = checkpoint_tensors(dir_ + "/fresh" + name, model);
  std::size_t tensors = 0;
  const ParamLayout layout = ParamLayout::of(model);
  for (const auto& l : layout.layers()) tensors += 3 * l.tensors.size();
  EXPECT_EQ(fresh.size(), tensors);
  EXPECT_TRUE(checkpoint_tensors(dir_ + "/stopped" + name, model) == fresh)
      << "the resumed run's state differs from the uninterrupted run's";
}

TEST_F(LaminaStop, ARunThatKeepsSkippingStepsStopsWithExit3) {
  const std::string sets =
      "--set train.steps=50 --set optimizer.lr=1e30 --set optimizer.grad_clip=0 --set optimizer.warmup_steps=0 "
      "--set train.skip_nonfinite=true --set train.max_skipped=4 --set checkpoint.save_final=true";
  const std::string log = dir_ + "/diverged.log";
  const int code = finish(start(train("diverged", sets), log));
  const std::string out = slurp(log);
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("4 steps in a row skipped (train.max_skipped)"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ + "/diverged/checkpoints/latest")) << "a diverged run wrote a checkpoint";
}

// An update that overflows the weights (a learning rate beyond float's range) leaves a
// finite loss at that step; the checkpoint after it must not be written.
TEST_F(LaminaStop, AModelThatIsNotFiniteIsNeverCheckpointed) {
  const std::string sets = "--set train.steps=3 --set optimizer.lr=1e39 --set optimizer.warmup_steps=0 "
                           "--set checkpoint.every=1";
  const std::string log = dir_ + "/overflow.log";
  const int code = finish(start(train("overflow", sets), log));
  const std::string out = slurp(log);
  EXPECT_EQ(code, 3) << out;
  EXPECT_NE(out.find("step 1: the model holds values that are not finite (model/"), std::string::npos) << out;
  EXPECT_FALSE(fs::exists(dir_ + "/overflow/checkpoints/latest")) << out;
  EXPECT_FALSE(fs::exists(dir_ + "/overflow/checkpoints/step_00000001.h5.tmp")) << out;
}

// A run whose estimate (126 TiB) exceeds this machine is refused before it starts, and
// --check says so too.
TEST_F(LaminaStop, ARunLargerThanTheMachineIsRefusedByTheRunAndByCheck) {
  const std::string sets = "--set data.batch_size=100000 --set data.micro_batch_size=100000 --set model.seq_len=4096";
  // The memory that is short: the node's on a host build, the device's on a device build.
  using Memory = Kokkos::DefaultExecutionSpace::memory_space;
  const std::string shortfall = Kokkos::SpaceAccessibility<Kokkos::HostSpace, Memory>::accessible
                                    ? "of host memory on this node (1 rank(s) x "
                                    : std::string("of ") + Kokkos::DefaultExecutionSpace::name() + " memory (1 rank(s) x ";
  for (const char* mode : {"--check", ""}) {
    const std::string log = dir_ + "/huge.log";
    const int code = finish(start(train("huge", sets) + " " + mode, log));
    const std::string out = slurp(log);
    EXPECT_EQ(code, 2) << mode << "\n" << out;
    EXPECT_NE(out.find(shortfall), std::string::npos) << mode << "\n" << out;
  }
}

}  // namespace
}  // namespace lamina::test
