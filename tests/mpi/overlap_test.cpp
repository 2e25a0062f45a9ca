// What the instruction lists let overlap does overlap: from the trace the executor writes
// of a step (output.trace_step), a data-parallel gradient reduction is still in flight on
// the collective stream while the backward of the layers before runs, and a ZeRO-3
// gather of the next layer (on the parameter-fetch stream) while the current one computes,
// and context parallelism's ring passes keys and values while the attention computes. Each
// job is started with mpirun, as a user starts one.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <string>
#include <vector>

#include "mpi_launcher.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;

// Layers of a few MB, so that a collective of one of them takes MPI more than one call.
const char* kDeck = R"([model]
layers = 4
d_model = 256
heads = 4
seq_len = 128
vocab_size = 4096
[data]
format = "synthetic"
batch_size = 8
micro_batch_size = 2
[train]
steps = 2
[optimizer]
subgroup_size = 262144
[output]
peak_tflops = 1.0
trace_step = 2
[checkpoint]
save_final = false
)";

struct Span {
  std::string name, track;
  double begin = 0.0, end = 0.0;
};

// The spans of a trace (one event per line, as step_trace.cpp writes them).
std::vector<Span> read_trace(const std::string& path) {
  std::vector<Span> out;
  std::ifstream in(path);
  const std::regex event(R"re(\{"name": "([^"]*)", "cat": "[^"]*", "ph": "X", "pid": \d+, "tid": "([^"]*)", "ts": ([0-9.]+), "dur": ([0-9.]+))re");
  std::smatch m;
  for (std::string line; std::getline(in, line);) {
    if (!std::regex_search(line, m, event)) continue;
    const double ts = std::stod(m[3]), dur = std::stod(m[4]);
    out.push_back({m[1], m[2], ts, ts + dur});
  }
  return out;
}

class Overlap : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lamina_overlap_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/deck.toml") << kDeck;
  }
  void TearDown() override { fs::remove_all(dir_); }

  // Trains the deck on two ranks with the overrides; rank 0's trace of step 2.
  std::vector<Span> trace(const std::string& name, const std::string& sets) {
    const std::string out = dir_ + "/" + name;
    const std::string cmd = LAMINA_MPIRUN " -np 2 " + std::string(LAMINA_BINARY) +
                            " train " + dir_ + "/deck.toml --set output.dir=" + out + " " + sets + " 2>&1";
    std::string log;
    FILE* p = ::popen(cmd.c_str(), "r");
    char buf[4096];
    while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) log += buf;
    const int status = p == nullptr ? -1 : ::pclose(p);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << log;
    return read_trace(out + "/trace_step2_rank0.json");
  }

  // The instructions named `prefix`... on `track` that were still in flight over the whole
  // of a host span whose name starts with `compute`.
  static std::vector<std::string> in_flight_over(const std::vector<Span>& t, const std::string& prefix,
                                                 const std::string& track, const std::string& compute) {
    std::vector<std::string> out;
    for (const Span& a : t) {
      if (a.track != track || a.name.rfind(prefix, 0) != 0) continue;
      for (const Span& c : t) {
        if (c.track == "host" && c.name.rfind(compute, 0) == 0 && a.begin <= c.begin && a.end >= c.end) {
          out.push_back(a.name + " over " + c.name);
        }
      }
    }
    return out;
  }

  std::string dir_;
};

TEST_F(Overlap, DataParallelReductionsRunWhileTheBackwardGoesOn) {
  const auto t = trace("dp2", "--set parallel.dp=2");
  ASSERT_FALSE(t.empty());
  const auto pairs = in_flight_over(t, "reduce(h.", "collective", "B(h.");
  EXPECT_FALSE(pairs.empty()) << "no block's reduction was in flight while an earlier block's backward ran";
}

TEST_F(Overlap, ZeroThreeGathersTheNextLayerWhileTheCurrentOneComputes) {
  const auto t = trace("zero3", "--set parallel.dp=2 --set parallel.zero=3");
  ASSERT_FALSE(t.empty());
  const auto forward = in_flight_over(t, "prefetch(h.", "fetch", "F(h.");
  const auto backward = in_flight_over(t, "prefetch(h.", "fetch", "B(h.");
  EXPECT_FALSE(forward.empty()) << "no layer's all-gather was in flight while the layer before ran forward";
  EXPECT_FALSE(backward.empty()) << "no layer's all-gather was in flight while the layer after ran backward";
}

// Passes of keys and values around the ring are in flight while the rank computes its
// attention with the block it holds (each block's forward passes once on cp 2, its backward
// once more; the gradients' passes follow the compute).
TEST_F(Overlap, TheRingPassesKeysAndValuesWhileTheAttentionComputes) {
  const auto t = trace("cp2", "--set parallel.cp=2");
  std::vector<Span> passes, attention, gradients;
  for (const Span& s : t) {
    if (s.track == "cp ring") (s.name.rfind("keys and values", 0) == 0 ? passes : gradients).push_back(s);
    if (s.track == "cp attention") attention.push_back(s);
  }
  // 4 micro-batches of 4 blocks, forward and backward.
  ASSERT_EQ(passes.size(), 32u);
  ASSERT_EQ(attention.size(), passes.size());
  EXPECT_EQ(gradients.size(), 32u);  // on cp 2: two per block's backward
  // The attention runs while the passes are in flight: the windows from a pass's start to its
  // wait hold a good part of the blocks' time (measured: 35 %, each 37-100 % of the longest),
  // where a pass waited for before the attention would leave them empty.
  double windows = 0.0, blocks = 0.0, longest = 0.0;
  for (const Span& a : attention) longest = std::max(longest, a.end - a.begin);
  for (const Span& a : attention) {
    windows += a.end - a.begin;
    EXPECT_GT(a.end - a.begin, 0.1 * longest) << a.begin;
  }
  for (const Span& s : t) {
    if (s.track == "host" && (s.name.rfind("F(h.", 0) == 0 || s.name.rfind("B(h.", 0) == 0)) blocks += s.end - s.begin;
  }
  EXPECT_GT(windows, 0.1 * blocks) << windows << " us of " << blocks;
}

}  // namespace
}  // namespace lamina::test
