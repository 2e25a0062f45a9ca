// Weights interop on several ranks: the held-out loss of an imported GPT-2 is PyTorch's on
// any layout, and a checkpoint trained with tensor parallelism converts to HuggingFace and
// back bit-exact.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "mpi_launcher.hpp"
#include "lamina/io/safetensors.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;
const std::string kWeights = std::string(LAMINA_SOURCE_DIR) + "/tests/reference/weights";

std::string sh(const std::string& cmd, int& code) {
  std::string out;
  FILE* p = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) out += buf;
  const int status = p == nullptr ? -1 : ::pclose(p);
  code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return out;
}

class WeightsInterop : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!safetensors_supported()) GTEST_SKIP() << "built without nlohmann-json";
    dir_ = (fs::temp_directory_path() / ("lamina_wi_" + std::to_string(::getpid()))).string();
    fs::create_directories(dir_);
    std::ofstream(dir_ + "/d.toml") << "[model]\nlayers = 2\nd_model = 32\nheads = 4\nseq_len = 16\nvocab_size = 64\n"
                                       "init = \"" + kWeights + "/hf\"\n[data]\nformat = \"llmc\"\npath = \"" +
                                           kWeights + "/eval_tokens.bin\"\neval_path = \"" + kWeights +
                                           "/eval_tokens.bin\"\nbatch_size = 2\n[train]\nsteps = 2\n";
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string lamina(int ranks, const std::string& args, int& code) const {
    return sh(std::string(LAMINA_MPIRUN) + " -np " + std::to_string(ranks) + " " + LAMINA_BINARY + " " + args, code);
  }
  std::string dir_;
};

double eval_loss(const std::string& out) {
  const auto at = out.rfind("| loss ");
  return at == std::string::npos ? NAN : std::atof(out.c_str() + at + 7);
}

TEST_F(WeightsInterop, HeldOutLossIsPyTorchsOnEveryLayout) {
  const SafetensorsFile f(kWeights + "/expected.safetensors");
  const auto& w = f.tensor("window_loss");
  std::vector<double> v(static_cast<std::size_t>(w.numel()));
  std::memcpy(v.data(), w.data, static_cast<std::size_t>(w.bytes));
  double expected = 0.0;
  for (const double x : v) expected += x / static_cast<double>(v.size());
  for (const char* layout : {"parallel.dp=2", "parallel.pp=2", "parallel.tp=2", "parallel.dp=2 --set parallel.zero=3"}) {
    int code = 0;
    const std::string out =
        lamina(2, "eval " + dir_ + "/d.toml --set output.dir=\\\"" + dir_ + "/run\\\" --set " + std::string(layout), code);
    ASSERT_EQ(code, 0) << out;
    // Printed with 4 decimals; metrics.jsonl has the full value.
    std::ifstream in(dir_ + "/run/metrics.jsonl");
    std::string line, last;
    while (std::getline(in, line)) last = line;
    const auto at = last.find("\"eval_loss\": ");
    ASSERT_NE(at, std::string::npos) << last;
    EXPECT_NEAR(std::atof(last.c_str() + at + 13), expected, 1e-5) << layout;
    EXPECT_NEAR(eval_loss(out), expected, 1e-4) << layout;
  }
}

TEST_F(WeightsInterop, ACheckpointTrainedWithTensorParallelismConvertsBitExact) {
  int code = 0;
  std::string out = lamina(2, "train " + dir_ + "/d.toml --set parallel.tp=2 --set output.dir=\\\"" + dir_ + "/tp\\\"", code);
  ASSERT_EQ(code, 0) << out;
  const std::string ckpt = dir_ + "/tp/checkpoints/step_00000002.h5";
  out = lamina(1, "convert " + ckpt + " " + dir_ + "/hf", code);
  ASSERT_EQ(code, 0) << out;
  out = lamina(1, "convert " + dir_ + "/hf " + dir_ + "/back.h5", code);
  ASSERT_EQ(code, 0) << out;
  // Compared as llm.c files (float32, every tensor): byte-equal files, bit-equal weights.
  out = lamina(1, "convert " + ckpt + " " + dir_ + "/a.bin", code);
  ASSERT_EQ(code, 0) << out;
  out = lamina(1, "convert " + dir_ + "/back.h5 " + dir_ + "/b.bin", code);
  ASSERT_EQ(code, 0) << out;
  const auto slurp = [](const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(slurp(dir_ + "/a.bin"), slurp(dir_ + "/b.bin"));
  EXPECT_NE(slurp(dir_ + "/a.bin"), slurp(kWeights + "/llmc.bin"));  // training changed the weights
  // And evaluates the same on one rank as on the two that trained it.
  out = lamina(1, "eval " + dir_ + "/d.toml --set model.init=\\\"" + dir_ + "/hf\\\" --set output.dir=\\\"" + dir_ +
                      "/e1\\\"", code);
  ASSERT_EQ(code, 0) << out;
  const double one = eval_loss(out);
  out = lamina(2, "eval " + dir_ + "/d.toml --set parallel.tp=2 --set checkpoint.resume=\\\"" + ckpt +
                      "\\\" --set output.dir=\\\"" + dir_ + "/e2\\\"", code);
  ASSERT_EQ(code, 0) << out;
  EXPECT_NEAR(eval_loss(out), one, 1e-4);
}

}  // namespace
}  // namespace lamina::test
