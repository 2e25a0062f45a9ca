// The `lamina` command end to end: help, exit codes, error messages, JSON last lines.
#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "apps/cli_fixture.hpp"

namespace lamina::test {
namespace {

std::string last_line(const std::string& s) {
  const auto end = s.find_last_not_of('\n');
  const auto start = s.rfind('\n', end);
  return s.substr(start == std::string::npos ? 0 : start + 1, end - (start == std::string::npos ? 0 : start + 1) + 1);
}

TEST_F(Cli, HelpAndVersion) {
  const Result h = run("--help");
  EXPECT_EQ(h.code, 0);
  for (const char* s : {"train", "verify", "bench", "Exit codes"}) EXPECT_NE(h.out.find(s), std::string::npos) << s;
  const Result t = run("train --help");
  EXPECT_EQ(t.code, 0);
  EXPECT_NE(t.out.find("--set"), std::string::npos);
  EXPECT_NE(t.out.find("--check"), std::string::npos);
  EXPECT_EQ(run("bench step --help").code, 0);
  EXPECT_NE(run("--version").out.find("Kokkos"), std::string::npos);
}

TEST_F(Cli, BadCommandLineIsExitCode2) {
  EXPECT_EQ(run("").code, 2);
  EXPECT_EQ(run("frobnicate").code, 2);
  EXPECT_EQ(run("train").code, 2);
}

TEST_F(Cli, DeckTypoIsExitCode2WithLocationAndHint) {
  const std::string deck = file("typo.toml", "[model]\nlayers = 2\nd_model = 32\nheads = 2\nseq_len = 8\nvocab_size = 64\n"
                                             "[data]\nformat = \"synthetic\"\nbatch_size = 2\n[train]\nsteps = 1\n"
                                             "[optimizer]\nlr_rate = 1e-3\n");
  const Result r = run("train " + deck);
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find(deck + ":13:1: unknown key 'lr_rate' in optimizer (did you mean 'lr'?)"), std::string::npos)
      << r.out;
}

TEST_F(Cli, CheckPrintsResolvedDeckAndMemoryEstimate) {
  const std::string deck = file("ok.toml", "[model]\nlayers = 2\nd_model = 32\nheads = 2\nseq_len = 8\nvocab_size = 64\n"
                                           "[data]\nformat = \"synthetic\"\nbatch_size = 2\n[train]\nsteps = 1\n");
  const Result r = run("train " + deck + " --check --set optimizer.lr=0.01");
  EXPECT_EQ(r.code, 0) << r.out;
  for (const char* s : {"[optimizer]", "lr = 0.01", "memory estimate", "parameters", "deck OK"}) {
    EXPECT_NE(r.out.find(s), std::string::npos) << s << " in " << r.out;
  }
}

// train.steps = 0 writes a fresh model's weights as the step-0 checkpoint, so that another
// trainer and lamina can start from the same ones; a run from them (model.init) trains as
// the run from the seed does.
TEST_F(Cli, ZeroStepsWriteTheInitialWeights) {
  const std::string deck = file("zero.toml", "[model]\nlayers = 2\nd_model = 32\nheads = 2\nseq_len = 8\n"
                                             "vocab_size = 64\n[data]\nformat = \"synthetic\"\nbatch_size = 4\n"
                                             "[train]\nsteps = 0\n[output]\npeak_tflops = 1\n");
  const Result r = run("train " + deck + " --set output.dir=" + dir_ + "/zero");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string weights = dir_ + "/zero/checkpoints/step_00000000.h5";
  EXPECT_NE(r.out.find("train.steps = 0: the initial weights are in " + weights), std::string::npos) << r.out;
  const auto losses = [&](const std::string& name, const std::string& sets) {
    const Result t = run("train " + deck + " --set train.steps=2 --set output.dir=" + dir_ + "/" + name + " " + sets);
    EXPECT_EQ(t.code, 0) << t.out;
    std::ifstream in(dir_ + "/" + name + "/metrics.jsonl");
    std::string line, all;
    while (std::getline(in, line)) all += line.substr(0, line.find(", \"lr\"")) + "\n";  // step and loss
    return all;
  };
  const std::string seeded = losses("seeded", ""), loaded = losses("loaded", "--set model.init=\\\"" + weights + "\\\"");
  EXPECT_NE(seeded.find("\"loss\""), std::string::npos) << seeded;
  EXPECT_EQ(loaded, seeded);
}

TEST_F(Cli, MissingDataFileIsExitCode2) {
  const std::string deck = file("nodata.toml", "[model]\nlayers = 1\nd_model = 32\nheads = 2\nseq_len = 8\n"
                                               "[data]\npath = \"/nonexistent/corpus.txt\"\nbatch_size = 2\n"
                                               "[train]\nsteps = 1\n");
  const Result r = run("train " + deck + " --set output.dir=" + dir_ + "/out");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("/nonexistent/corpus.txt: cannot open"), std::string::npos) << r.out;
}

TEST_F(Cli, NonFiniteLossIsExitCode3NamingTheStep) {
  const std::string deck = file("nan.toml", "[model]\nlayers = 1\nd_model = 32\nheads = 2\nseq_len = 8\nvocab_size = 64\n"
                                            "[data]\nformat = \"synthetic\"\nbatch_size = 2\n[train]\nsteps = 5\n"
                                            "[optimizer]\nlr = 1e30\ngrad_clip = 0\nmin_lr = 0\n");
  const Result r = run("train " + deck + " --set output.dir=" + dir_ + "/nan --set output.peak_tflops=1");
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find("error: step 2: the loss is not finite"), std::string::npos) << r.out;
}

TEST_F(Cli, VerifyMalformedReferenceIsExitCode2) {
  const Result r = run("verify --reference " + file("bad.h5", "not hdf5"));
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("not an HDF5 file"), std::string::npos) << r.out;
}

TEST_F(Cli, MultiRankLayoutOnOneRankIsExitCode2) {
  const std::string deck = file("dp.toml", "[model]\nlayers = 1\nd_model = 32\nheads = 2\nseq_len = 8\nvocab_size = 64\n"
                                           "[data]\nformat = \"synthetic\"\nbatch_size = 4\n[train]\nsteps = 1\n"
                                           "[parallel]\ndp = 2\n");
  const Result r = run("train " + deck + " --set output.dir=" + dir_ + "/dp");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("mpirun -np 2"), std::string::npos) << r.out;
}

TEST_F(Cli, BenchPrintsOneJsonObjectLast) {
  const Result a = run("bench adam --params 100000 --reps 3");
  EXPECT_EQ(a.code, 0) << a.out;
  const std::string j = last_line(a.out);
  EXPECT_EQ(j.front(), '{');
  for (const char* k : {"\"params\": 100000", "\"ms_median\"", "\"gbytes_per_s\"", "\"bandwidth_fraction\""}) {
    EXPECT_NE(j.find(k), std::string::npos) << k << " in " << j;
  }
  const std::string deck = file("b.toml", "[model]\nlayers = 1\nd_model = 32\nheads = 2\nseq_len = 8\nvocab_size = 64\n"
                                          "[data]\nformat = \"synthetic\"\nbatch_size = 2\n[train]\nsteps = 1\n");
  const Result s = run("bench step " + deck + " --steps 2 --warmup 1");
  EXPECT_EQ(s.code, 0) << s.out;
  for (const char* k : {"\"step_ms_median\"", "\"tokens_per_s\"", "\"tflops\"", "\"gemm_fraction\""}) {
    EXPECT_NE(last_line(s.out).find(k), std::string::npos) << k;
  }
}

TEST_F(Cli, PlanWritesADeckTheTrainerRunsAndExplainsWhatCannotFit) {
  const std::string deck = file("plan.toml", R"([model]
layers = 2
d_model = 64
heads = 4
seq_len = 32
vocab_size = 512
[data]
format = "synthetic"
batch_size = 8
[train]
steps = 1
[checkpoint]
save_final = false
)");
  const std::string machine = std::string(LAMINA_SOURCE_DIR) + "/inputs/machines/dgx-a100-80gb.toml";
  const std::string planned = dir_ + "/planned.toml";
  const Result p = run("plan " + deck + " --ranks 8 --machine " + machine + " --write-deck " + planned + " --tokens 1e9");
  ASSERT_EQ(p.code, 0) << p.out;
  const std::string json = last_line(p.out);
  for (const char* key : {"\"feasible\": true", "\"solve_s\": ", "\"ranks\": 8", "\"dp\": ", "\"tp\": ",
                          "\"pp\": ", "\"zero\": ", "\"schedule\": ", "\"virtual_stages\": ", "\"layered\": ",
                          "\"micro_batch_size\": ", "\"step_s\": ", "\"tokens_per_s\": ",
                          "\"model_flops_per_step\": ", "\"mfu\": ", "\"peak_bytes\": {\"device\": ",
                          "\"capacity_bytes\": {\"device\": ", "\"train_days\": "}) {
    EXPECT_NE(json.find(key), std::string::npos) << key << " in " << json;
  }
  // The written deck is complete: the trainer accepts it as it is.
  const Result check = run("train " + planned + " --check");
  EXPECT_EQ(check.code, 0) << check.out;
  // A machine too small for the model: exit 2, the memory it would need, what helps.
  std::ifstream in(machine);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  text.replace(text.find("memory = \"80GB\""), 15, "memory = \"1MB\"");
  const Result small = run("plan " + deck + " --ranks 1 --machine " + file("tiny.toml", text));
  EXPECT_EQ(small.code, 2) << small.out;
  EXPECT_NE(small.out.find("no plan fits"), std::string::npos) << small.out;
  EXPECT_NE(small.out.find("what helps"), std::string::npos) << small.out;
  EXPECT_NE(last_line(small.out).find("\"feasible\": false"), std::string::npos) << small.out;
}

}  // namespace
}  // namespace lamina::test
