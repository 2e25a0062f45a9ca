// The `lamina` command given what cannot work. Decks that describe no valid run, paths in
// the way and bad options are exit code 2 with a message that says where and what; output
// that cannot be written (a full disk) is exit code 3 naming the file, never lost quietly.
#include <Kokkos_Macros.hpp>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdint>
#include <filesystem>
#include <limits>
#include <fstream>
#include <string>
#include <vector>

#include "apps/cli_fixture.hpp"
#include "io/file_damage.hpp"
#include "lamina/core/format.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/io/hdf5_file.hpp"

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

// A command word that names no command is named, with the nearest one and the list.
TEST_F(CliFailures, AnUnknownCommandIsNamedWithTheNearestOne) {
  expect_exit2_with(run("frobnicate"), "error: lamina: unknown command 'frobnicate'; the commands: train, eval, convert");
  expect_exit2_with(run("trian x.toml"), "error: lamina: unknown command 'trian' (did you mean 'train'?)");
  expect_exit2_with(run("bench stpe"), "error: lamina bench: unknown command 'stpe' (did you mean 'step'?)");
}

// --check opens the held-out data too: a missing data.eval_path ended the run at its
// first evaluation.
TEST_F(CliFailures, CheckNamesAMissingEvalFile) {
  const std::string deck = file("eval.toml", kDeck + "[output]\npeak_tflops = 1\n");
  const Result r = run("train " + deck + " --check --set data.format=\\\"text\\\" --set data.path=" + deck +
                       " --set data.eval_path=" + dir_ + "/missing.txt --set model.vocab_size=256");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(dir_ + "/missing.txt"), std::string::npos) << r.out;
}

// Data too short for one window names the key and its files (it named neither).
TEST_F(CliFailures, DataTooShortNamesTheKeyAndTheFile) {
  const std::string data = file("short.txt", "abc");
  const std::string deck = file("short.toml", "[model]\nlayers = 2\nd_model = 32\nheads = 2\nseq_len = 8\n"
                                              "vocab_size = 256\n[data]\nformat = \"text\"\npath = \"" + data +
                                              "\"\nbatch_size = 4\n[train]\nsteps = 1\n");
  for (const char* mode : {" --check", ""}) {
    expect_exit2_with(run("train " + deck + mode + " --set output.dir=" + dir_ + "/short"),
                      deck + ":9:8: data.path = " + data + ": the data holds 3 tokens, fewer than model.seq_len + 1 = 9");
  }
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

TEST_F(CliFailures, VerifyAttentionMustBeOneOfTheWaysItRuns) {
  const Result r = run("verify --reference " + dir_ + "/ref.h5 --attention flash");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("--attention: flash not in {auto,in_place,staged,fused}"), std::string::npos) << r.out;
}

void expect_exit3_with(const Result& r, const std::string& text) {
  EXPECT_EQ(r.code, 3) << r.out;
  EXPECT_NE(r.out.find(text), std::string::npos) << "expected '" << text << "' in:\n" << r.out;
}

// /dev/full takes the place of a file of the run: every write to it fails with ENOSPC.
TEST_F(CliFailures, MetricsOnAFullDiskIsExitCode3NamingTheFile) {
  const std::string deck = file("full.toml", kDeck + "[output]\npeak_tflops = 1\n");
  fs::create_directories(dir_ + "/out");
  fs::create_symlink("/dev/full", dir_ + "/out/metrics.jsonl");
  expect_exit3_with(run("train " + deck + " --set output.dir=" + dir_ + "/out"),
                    "error: cannot write " + dir_ + "/out/metrics.jsonl: No space left on device");
  fs::create_directories(dir_ + "/deck");
  fs::create_symlink("/dev/full", dir_ + "/deck/deck.resolved.toml");
  expect_exit3_with(run("train " + deck + " --set output.dir=" + dir_ + "/deck"),
                    "error: cannot write " + dir_ + "/deck/deck.resolved.toml: No space left on device");
}

TEST_F(CliFailures, LogOnAFullDiskIsExitCode3) {
  const std::string deck = file("log.toml", kDeck + "[output]\npeak_tflops = 1\n");
  // stderr to the pipe, stdout (the log) to the full disk.
  expect_exit3_with(shell(kLamina + " train " + deck + " --set output.dir=" + dir_ + "/out 2>&1 >/dev/full"),
                    "error: cannot write the log to standard output (/dev/full): No space left on device");
  expect_exit3_with(shell(kLamina + " bench adam --params 1000 --reps 1 2>&1 >/dev/full"),
                    "error: cannot write the log to standard output");
}

// A file-size limit (ulimit -f, SIGXFSZ ignored so writes fail with EFBIG) of 32 MiB lets
// the run start (MPI's own files need a few) and its first checkpoint (76 MB) fail half-way,
// as on a disk that fills up.
TEST_F(CliFailures, CheckpointThatCannotBeWrittenIsExitCode3AndLeavesNoTemporaryFile) {
  const std::string deck = file("ckpt.toml", "[model]\nlayers = 2\nd_model = 512\nheads = 4\nseq_len = 8\n"
                                             "vocab_size = 64\n[data]\nformat = \"synthetic\"\nbatch_size = 2\n"
                                             "[train]\nsteps = 1\n[output]\npeak_tflops = 1\n");
  const std::string out = dir_ + "/out";
  const Result r = shell("trap '' XFSZ; ulimit -f 32768; " + kLamina + " train " + deck + " --set output.dir=" + out +
                         " 2>&1");
  expect_exit3_with(r, "error: cannot write " + out + "/checkpoints/step_00000001.h5.tmp (");
  // Nothing but the job's (emptied) hold on the directory.
  std::vector<std::string> left;
  for (const auto& e : fs::directory_iterator(out + "/checkpoints")) left.push_back(e.path().filename().string());
  EXPECT_EQ(left, std::vector<std::string>{"lamina.lock"}) << r.out;
}

TEST_F(CliFailures, UnfinishedCheckpointWritesOfAnEarlierRunAreRemoved) {
  const std::string deck = file("stale.toml", kDeck + "[output]\npeak_tflops = 1\n[checkpoint]\nsave_final = false\n");
  const std::string ckpt = dir_ + "/out/checkpoints";
  fs::create_directories(ckpt);
  for (const char* name : {"step_00000007.h5.tmp", "latest.tmp", "notes.tmp", "step_00000007.h5.tmp.bak"}) {
    std::ofstream(ckpt + "/" + name) << "x";
  }
  const Result r = run("train " + deck + " --set output.dir=" + dir_ + "/out");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("removed " + ckpt + "/step_00000007.h5.tmp, the unfinished write of an earlier run"),
            std::string::npos)
      << r.out;
  EXPECT_FALSE(fs::exists(ckpt + "/step_00000007.h5.tmp"));
  EXPECT_FALSE(fs::exists(ckpt + "/latest.tmp"));
  EXPECT_TRUE(fs::exists(ckpt + "/notes.tmp"));
  EXPECT_TRUE(fs::exists(ckpt + "/step_00000007.h5.tmp.bak"));
}

// Resuming an earlier step of a run that went further: its later checkpoints are the
// user's to decide on (refused by default, naming them; kept; or renamed aside), never
// deleted by retention, and `latest` always names a file that exists.
TEST_F(CliFailures, ResumingAnEarlierStepLeavesTheLaterCheckpointsToTheUser) {
  const std::string deck = file("future.toml", kDeck + "[output]\npeak_tflops = 1\n[checkpoint]\nevery = 1\n");
  const std::string out = dir_ + "/out", ck = out + "/checkpoints";
  const auto step = [&](int s) { return ck + strprintf("/step_%08d.h5", s); };
  ASSERT_EQ(run("train " + deck + " --set output.dir=" + out + " --set train.steps=6 --set checkpoint.keep=10").code, 0);
  const std::string from3 = "train " + deck + " --set output.dir=" + out +
                            " --set train.steps=4 --set checkpoint.keep=1 --set checkpoint.resume=" + step(3);
  expect_exit2_with(run(from3), "holds checkpoints of later steps, which `latest` and retention would leave behind:\n  " +
                                    step(4) + "\n  " + step(5) + "\n  " + step(6) + "\nset checkpoint.newer");
  for (int s : {3, 4, 5, 6}) EXPECT_TRUE(fs::exists(step(s))) << s;
  const Result kept = run(from3 + " --set checkpoint.newer=keep");
  ASSERT_EQ(kept.code, 0) << kept.out;
  EXPECT_FALSE(fs::exists(step(3)));  // keep = 1 of the steps up to the one written
  for (int s : {4, 5, 6}) EXPECT_TRUE(fs::exists(step(s))) << s;
  EXPECT_EQ(resolve_checkpoint("latest", ck), step(4));
  const Result aside = run("train " + deck + " --set output.dir=" + out + " --set train.steps=5 --set checkpoint.keep=1 " +
                           "--set checkpoint.resume=" + step(4) + " --set checkpoint.newer=aside");
  ASSERT_EQ(aside.code, 0) << aside.out;
  EXPECT_TRUE(fs::exists(step(5) + ".abandoned"));
  EXPECT_TRUE(fs::exists(step(6) + ".abandoned"));
  EXPECT_TRUE(fs::exists(step(5)));  // this run's own step 5
  EXPECT_EQ(resolve_checkpoint("latest", ck), step(5));
}

// A resume that names an unfinished write is refused before the clean-up that would
// delete it, and the file is still there.
TEST_F(CliFailures, ResumingFromATmpFileIsExitCode2AndDeletesNothing) {
  const std::string deck = file("tmp.toml", kDeck + "[output]\npeak_tflops = 1\n");
  const std::string out = dir_ + "/out", tmp = out + "/checkpoints/step_00000001.h5.tmp";
  ASSERT_EQ(run("train " + deck + " --set output.dir=" + out).code, 0);
  fs::copy_file(out + "/checkpoints/step_00000001.h5", tmp);
  expect_exit2_with(run("train " + deck + " --set output.dir=" + out + " --set train.steps=2 --set checkpoint.resume=" +
                        tmp),
                    "error: checkpoint.resume: " + tmp + " is an unfinished write");
  EXPECT_TRUE(fs::exists(tmp));
}

TEST_F(CliFailures, ResumingFromADamagedCheckpointIsExitCode2NamingTheTensor) {
  const std::string deck = file("resume.toml", kDeck + "[output]\npeak_tflops = 1\n");
  const std::string out = dir_ + "/out", ckpt = out + "/checkpoints/step_00000001.h5";
  ASSERT_EQ(run("train " + deck + " --set output.dir=" + out).code, 0);
  std::vector<float> wte(64 * 32);
  {
    h5::Id f = h5::open_read(ckpt, MPI_COMM_SELF);
    h5::read(f, ckpt, "model/wte", wte.data());
  }
  ASSERT_TRUE(flip_byte_in(ckpt, wte.data() + 100, 8));
  expect_exit2_with(run("train " + deck + " --set output.dir=" + out +
                        " --set train.steps=2 --set checkpoint.resume=latest"),
                    "error: " + ckpt + ": dataset 'model/wte' does not match its checksum");
}

// A checkpoint attribute edited to near INT64_MAX, its checksums intact: the resume is exit
// 2 naming the file and the attribute, never a step that overflows it and writes a
// checkpoint the next resume refuses. samples_consumed within the reader's bound but past
// what this run can count on from there is refused by the run.
TEST_F(CliFailures, CheckpointCountsPastWhatARunCanReachAreExitCode2NamingTheAttribute) {
  const std::string deck = file("counts.toml", kDeck + "[output]\npeak_tflops = 1\n");
  const std::string out = dir_ + "/out", ckpt = out + "/checkpoints/step_00000001.h5";
  ASSERT_EQ(run("train " + deck + " --set output.dir=" + out).code, 0);
  const auto edit = [&](const char* name, std::int64_t value) {
    h5::Id f(H5Fopen(ckpt.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), H5Fclose);
    h5::Id a(H5Aopen(f, name, H5P_DEFAULT), H5Aclose);
    ASSERT_GE(H5Awrite(a, H5T_NATIVE_INT64, &value), 0);
  };
  const std::string resume = "train " + deck + " --set output.dir=" + out + " --set train.steps=3 --set checkpoint.resume=latest";
  edit("step", std::numeric_limits<std::int64_t>::max() - 1);
  expect_exit2_with(run(resume), ckpt + ": attribute 'step' = 9223372036854775806 is out of range");
  edit("step", 1);
  edit("samples_consumed", (std::int64_t{1} << 62) - 10);
  expect_exit2_with(run(resume), ckpt + ": attribute 'samples_consumed' = 4611686018427387894: with the 8 samples");
  edit("samples_consumed", 4);
  EXPECT_EQ(run(resume).code, 0);
}

// Text inputs are read with a cap: /dev/zero or a FIFO as the deck is exit 2 at once, under
// a memory limit that reading /dev/zero to the end would exceed.
TEST_F(CliFailures, ADeckThatIsNotARegularFileIsExitCode2BeforeItIsRead) {
  const std::string fifo = dir_ + "/deck.fifo";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
#if defined(__SANITIZE_ADDRESS__) || defined(KOKKOS_ENABLE_CUDA)
  // AddressSanitizer reserves terabytes of address space for its shadow memory, CUDA's
  // runtime as much for unified addressing (under the limit its threads could not start and
  // the run hung): no limit on it then (a read that never ends still runs into the timeout).
  const std::string limit = "timeout 60 ";
#else
  const std::string limit = "ulimit -v 2000000; timeout 60 ";
#endif
  const Result zero = shell(limit + kLamina + " train /dev/zero 2>&1");
  expect_exit2_with(zero, "/dev/zero: is a character device, not a deck file");
  const Result pipe = shell(limit + kLamina + " train " + fifo + " 2>&1");
  expect_exit2_with(pipe, fifo + ": is a FIFO (named pipe), not a deck file");
  const Result machine = shell(limit + kLamina + " plan " + file("m.toml", kDeck) + " --machine /dev/zero 2>&1");
  expect_exit2_with(machine, "/dev/zero: is a character device, not a machine description file");
  std::ofstream(dir_ + "/big.toml") << std::string(17 << 20, '#');
  expect_exit2_with(run("train " + dir_ + "/big.toml"), "a deck is at most 16777216 bytes");
}

// Messages that name the real cause: the --set argument that is wrong, a range said as it
// is, and the rank counts that would have a layout.
TEST_F(CliFailures, MessagesNameTheSetArgumentTheRangeAndTheRankCountsThatWork) {
  const std::string deck = file("msg.toml", kDeck);
  expect_exit2_with(run("train " + deck + " --set data.path= --check"), "error: --set data.path=: data.path: holds an empty string");
  expect_exit2_with(run("train " + deck + " --set foo.bar=1 --check"), "error: --set foo.bar=1: unknown section 'foo'");
  expect_exit2_with(run("train " + deck + " --set 'train.steps=3\nfoo.bar=1' --check"),
                    "--set train.steps=3...: the value spans several lines");
  expect_exit2_with(run("train " + deck + " --set output.dir= --check"), "error: --set output.dir=: output.dir: is empty");
  expect_exit2_with(run("train " + deck + " --set train.steps=4611686018427387904 --check"),
                    "train.steps: 4611686018427387904 is out of range: must be in [0, 1099511627776]");
  const Result ranks = run("plan " + deck + " --ranks 0");
  EXPECT_NE(ranks.code, 0);
  EXPECT_NE(ranks.out.find("--ranks: must be a whole number from 1 to 2147483647, got 0"), std::string::npos) << ranks.out;
  // 3 ranks: tp 3 does not divide 2 heads, pp 3 exceeds 2 layers, dp 3 does not divide 4.
  const std::string dgx = std::string(LAMINA_SOURCE_DIR) + "/inputs/machines/dgx-a100-80gb.toml";
  expect_exit2_with(run("plan " + deck + " --ranks 3 --machine " + dgx),
                    "no layout of 3 rank(s) splits this model and batch: dp x tp x pp must be 3, with tp dividing the "
                    "2 heads, the MLP width and the vocabulary of 64, a divisor or a multiple of the key/value heads, "
                    "and at most the 8 device(s) of a node, pp at most the 2 layers, and dp x micro-batch dividing the batch of 4 sequences; rank counts that have layouts: 1, 2, 4, 8, 16");
}

}  // namespace
}  // namespace lamina::test
