// The `lamina` command given what cannot work: decks that describe no valid run, paths
// in the way, bad options. Each is exit code 2 with a message that says where and what.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "apps/cli_fixture.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;

using CliFailures = Cli;

// Line 12 is [parallel]; its keys follow from line 13.
const std::string kDeck =
    "[model]\nlayers = 2\nd_model = 32\nheads = 2\nseq_len = 8\nvocab_size = 64\n"
    "[data]\nformat = \"synthetic\"\nbatch_size = 4\n[train]\nsteps = 1\n[parallel]\n";

void expect_exit2_with(const Result& r, const std::string& text) {
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(text), std::string::npos) << "expected '" << text << "' in:\n" << r.out;
}

TEST_F(CliFailures, PipelinePartitionErrorsNameTheDeckLine) {
  const std::string deck = file("pp.toml", kDeck + "pp = 2\n");
  expect_exit2_with(run("train " + deck + " --set model.layers=3"),
                    deck + ":13:6: parallel.pp: model.layers = 3 cannot be cut into parallel.pp = 2 equal stages");
  const std::string four = file("pp4.toml", kDeck + "pp = 4\n");
  expect_exit2_with(run("train " + four),
                    four + ":13:6: parallel.pp: 4 pipeline stages for model.layers = 2: every stage needs at least "
                           "one layer; use parallel.pp <= 2");
  const std::string chunks = file("vs.toml", kDeck + "pp = 2\nschedule = \"interleaved\"\nvirtual_stages = 3\n");
  expect_exit2_with(run("train " + chunks),
                    chunks + ":15:18: parallel.virtual_stages: model.layers = 2 cannot be cut into virtual_stages x "
                             "pp = 3 x 2 = 6 equal chunks");
}

TEST_F(CliFailures, RanksOtherThanDpTpPpNameTheDeckLine) {
  const std::string deck = file("dp.toml", kDeck + "dp = 2\n");
  expect_exit2_with(run("train " + deck + " --set output.dir=" + dir_ + "/dp"),
                    deck + ":13:6: parallel.dp: dp x tp x pp = 2 x 1 x 1 = 2 ranks, but the job runs on 1");
}

TEST_F(CliFailures, OutputDirThatIsAFileIsExitCode2) {
  const std::string deck = file("out.toml", kDeck);
  const std::string in_the_way = file("a_file", "");
  expect_exit2_with(run("train " + deck + " --set output.dir=" + in_the_way),
                    "--set output.dir=" + in_the_way + ": output.dir: " + in_the_way +
                        " is an existing file, not a directory; choose another output.dir");
  // Under it, and found by --check too; checkpoint.dir likewise.
  expect_exit2_with(run("train " + deck + " --check --set output.dir=" + in_the_way + "/run"),
                    in_the_way + " is an existing file, not a directory (in the path " + in_the_way + "/run)");
  expect_exit2_with(run("train " + deck + " --set output.dir=" + dir_ + "/ok --set checkpoint.dir=" + in_the_way),
                    "checkpoint.dir: " + in_the_way + " is an existing file");
  EXPECT_FALSE(fs::exists(dir_ + "/ok/metrics.jsonl"));
}

TEST_F(CliFailures, DeckThatIsADirectoryIsExitCode2SayingSo) {
  expect_exit2_with(run("train " + dir_), dir_ + ": is a directory, not a deck file");
}

TEST_F(CliFailures, VerifyToleranceMustBeFiniteAndNonNegative) {
  for (const char* bad : {"-1", "nan", "inf", "1e-4x"}) {
    expect_exit2_with(run("verify --reference " + dir_ + "/ref.h5 --tolerance " + std::string(bad)),
                      std::string("--tolerance: must be a finite number >= 0, got ") + bad);
  }
}

}  // namespace
}  // namespace lamina::test
