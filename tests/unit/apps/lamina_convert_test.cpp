// `lamina convert`, `model.init` and `lamina eval` as a user runs them, on the small GPT-2
// tests/reference/make_weights.py wrote and the Llama of make_llama.py: round trips through
// every format are bit-exact, llm.c files come out byte for byte as llm.c's own writer lays
// them out, the held-out loss equals PyTorch's, and files that do not fit are exit 2 with
// the reason.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "cli_fixture.hpp"
#include "lamina/io/directory_lock.hpp"
#include "lamina/io/model_weights.hpp"
#include "lamina/io/safetensors.hpp"
#include "lamina/model/param_layout.hpp"

namespace lamina::test {
namespace {

const std::string kWeights = std::string(LAMINA_SOURCE_DIR) + "/tests/reference/weights";

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

// Every tensor of the two files equal, bit for bit.
void expect_same_weights(const std::string& a, const std::string& b) {
  const auto x = open_weights(a), y = open_weights(b);
  ModelConfig m = x->model();
  m.heads = 4;
  const ParamLayout layout = ParamLayout::of(m);
  for (const LayerSpec& l : layout.layers()) {
    for (const TensorSpec& t : l.tensors) {
      const auto u = fetch_tensor(*x, t.name, t.global_shape), v = fetch_tensor(*y, t.name, t.global_shape);
      EXPECT_EQ(std::memcmp(u.data(), v.data(), u.size() * 4), 0) << t.name << ": " << a << " vs " << b;
    }
  }
}

// PyTorch's mean loss over the held-out windows (make_weights.py: 12 windows).
double pytorch_eval_loss() {
  const SafetensorsFile f(kWeights + "/expected.safetensors");
  const auto& w = f.tensor("window_loss");
  std::vector<double> v(static_cast<std::size_t>(w.numel()));
  std::memcpy(v.data(), w.data, static_cast<std::size_t>(w.bytes));
  double sum = 0.0;
  for (const double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

class Convert : public Cli {
 protected:
  void SetUp() override {
    Cli::SetUp();
    if (!safetensors_supported()) GTEST_SKIP() << "built without nlohmann-json";
  }
  std::string deck(const std::string& init, const std::string& extra = "") const {
    return file("d.toml", "[model]\nlayers = 2\nd_model = 32\nheads = 4\nseq_len = 16\nvocab_size = 64\ninit = \"" +
                              init + "\"\n[data]\nformat = \"llmc\"\npath = \"" + kWeights +
                              "/eval_tokens.bin\"\neval_path = \"" + kWeights +
                              "/eval_tokens.bin\"\nbatch_size = 2\n[train]\nsteps = 2\n[output]\ndir = \"" + dir_ +
                              "/run\"\n" + extra);
  }
};

TEST_F(Convert, RoundTripsThroughEveryFormatAreBitExact) {
  const std::string d = dir_ + "/";
  ASSERT_EQ(run("convert " + kWeights + "/hf " + d + "a.h5").code, 0);
  Result r = run("convert " + d + "a.h5 " + d + "hf_out");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(slurp(d + "hf_out/config.json").find("\"n_head\": 4"), std::string::npos);
  ASSERT_EQ(run("convert " + d + "hf_out " + d + "b.h5").code, 0);
  ASSERT_EQ(run("convert " + d + "a.h5 " + d + "x.bin").code, 0);
  ASSERT_EQ(run("convert " + d + "x.bin " + d + "c.h5").code, 0);
  expect_same_weights(d + "a.h5", d + "b.h5");
  expect_same_weights(d + "a.h5", d + "c.h5");
  expect_same_weights(d + "a.h5", kWeights + "/llmc.bin");
  // llm.c's layout, byte for byte as the Python writer (after llm.c's train_gpt2.py) made it.
  EXPECT_EQ(slurp(d + "x.bin"), slurp(kWeights + "/llmc.bin"));
  // bfloat16 out and back: the rounded values, and as llm.c's bf16 file holds them.
  ASSERT_EQ(run("convert " + d + "a.h5 " + d + "x16.bin --dtype bf16").code, 0);
  EXPECT_EQ(slurp(d + "x16.bin"), slurp(kWeights + "/llmc_bf16.bin"));
  // Shards with an index, float16.
  r = run("convert " + d + "a.h5 " + d + "shards --dtype fp16 --max-shard-size 30KB");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(d + "shards/model.safetensors.index.json"));
  EXPECT_NE(r.out.find("shards/model-00002-of-0000"), std::string::npos) << r.out;  // more than one shard
  expect_same_weights(d + "shards", kWeights + "/sharded");
}

TEST_F(Convert, EvalFromEachFormatEqualsPyTorch) {
  const double expected = pytorch_eval_loss();
  for (const std::string& init : {kWeights + "/hf", kWeights + "/llmc.bin"}) {
    deck(init);
    const Result r = run("eval " + dir_ + "/d.toml");
    ASSERT_EQ(r.code, 0) << r.out;
    const std::string metrics = slurp(dir_ + "/run/metrics.jsonl");
    const auto at = metrics.rfind("\"eval_loss\": ");
    ASSERT_NE(at, std::string::npos) << metrics;
    EXPECT_NEAR(std::atof(metrics.c_str() + at + 13), expected, 1e-5) << init;
    EXPECT_NE(r.out.find("perplexity"), std::string::npos);
  }
  // Appended: one line per evaluation, the training's lines kept.
  const std::string metrics = slurp(dir_ + "/run/metrics.jsonl");
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 2);
}

TEST_F(Convert, TrainingFromInitialWeightsEvaluatesBeforeAndAfter) {
  deck(kWeights + "/hf", "[checkpoint]\nsave_final = true\n");
  Result r = run("train " + dir_ + "/d.toml --set train.eval_every=1");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("initial weights: " + kWeights + "/hf"), std::string::npos) << r.out;
  const std::string metrics = slurp(dir_ + "/run/metrics.jsonl");
  // The baseline is the imported model's: PyTorch's loss.
  const auto at = metrics.find("\"eval_loss\": ");
  ASSERT_NE(at, std::string::npos);
  EXPECT_NEAR(std::atof(metrics.c_str() + at + 13), pytorch_eval_loss(), 1e-5);
  EXPECT_EQ(std::count(metrics.begin(), metrics.end(), '\n'), 5) << metrics;  // eval 0, step 1, eval 1, step 2, eval 2
  // Handing the result back: the trained checkpoint converts and reads back bit-exact.
  ASSERT_EQ(run("convert " + dir_ + "/run/checkpoints/step_00000002.h5 " + dir_ + "/out").code, 0);
  ASSERT_EQ(run("convert " + dir_ + "/out " + dir_ + "/back.h5").code, 0);
  expect_same_weights(dir_ + "/run/checkpoints/step_00000002.h5", dir_ + "/back.h5");
}

// Fine-tuning a HuggingFace Llama as a user would: a deck describing its block, the
// directory as model.init, two steps, and the checkpoint handed back as HuggingFace files
// that read back bit-exact; a deck with another block is exit 2 naming both.
TEST_F(Convert, ALlamaFineTunesFromHuggingFaceAndConvertsBack) {
  const std::string llama = kWeights + "/llama/hf";
  deck(llama,
       "[checkpoint]\nsave_final = true\n");
  const std::string parts = " --set model.arch=llama --set model.kv_heads=2 --set model.ffn_hidden=48"
                            " --set model.rope_scaling=4 --set model.rope_original_context=8";
  Result r = run("train " + dir_ + "/d.toml" + parts);
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(r.out.find("model: Llama, "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("initial weights: " + llama), std::string::npos) << r.out;
  const std::string ckpt = dir_ + "/run/checkpoints/step_00000002.h5";
  r = run("convert " + ckpt + " " + dir_ + "/out");
  ASSERT_EQ(r.code, 0) << r.out;
  EXPECT_NE(slurp(dir_ + "/out/config.json").find("\"LlamaForCausalLM\""), std::string::npos);
  ASSERT_EQ(run("convert " + dir_ + "/out " + dir_ + "/back.h5").code, 0);
  const auto a = open_weights(ckpt), b = open_weights(dir_ + "/back.h5");
  const ParamLayout layout = ParamLayout::of(a->model());
  for (const LayerSpec& l : layout.layers()) {
    for (const TensorSpec& t : l.tensors) {
      EXPECT_EQ(fetch_tensor(*a, t.name, t.global_shape), fetch_tensor(*b, t.name, t.global_shape)) << t.name;
    }
  }
  r = run("train " + dir_ + "/d.toml" + parts + " --set model.rope_theta=500000 --check");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("rope_theta=500000"), std::string::npos) << r.out;
}

// `lamina eval` of HuggingFace Llama weights: the loss of the reference's first sequence,
// as PyTorch's logits (make_llama.py, float64) give it.
TEST_F(Convert, ALlamaEvaluatesFromHuggingFaceWeightsAsPyTorch) {
  const SafetensorsFile e(kWeights + "/llama/expected.safetensors");
  const auto& tokens = e.tensor("tokens");  // (2, 17) int32
  const auto& logits = e.tensor("logits");  // (2, 16, 64) float64
  const std::int64_t T = 16, V = 64;
  std::vector<std::int32_t> x(T + 1);
  std::memcpy(x.data(), tokens.data, x.size() * 4);
  std::vector<double> z(static_cast<std::size_t>(T * V));
  std::memcpy(z.data(), logits.data, z.size() * 8);
  double expected = 0.0;
  for (std::int64_t t = 0; t < T; ++t) {
    const double* row = z.data() + t * V;
    const double top = *std::max_element(row, row + V);
    double sum = 0.0;
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - top);
    expected += (top + std::log(sum) - row[x[static_cast<std::size_t>(t + 1)]]) / static_cast<double>(T);
  }
  // An llm.c token file holding that one window of T + 1 tokens.
  std::ofstream out(dir_ + "/window.bin", std::ios::binary);
  std::int32_t header[256] = {20240520, 1, static_cast<std::int32_t>(T + 1)};
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  for (const std::int32_t t : x) {
    const auto u = static_cast<std::uint16_t>(t);
    out.write(reinterpret_cast<const char*>(&u), 2);
  }
  out.close();
  file("d.toml", "[model]\narch = \"llama\"\nlayers = 2\nd_model = 32\nheads = 4\nkv_heads = 2\nffn_hidden = 48\n"
                 "seq_len = 16\nvocab_size = 64\nrope_scaling = 4\nrope_original_context = 8\ninit = \"" +
                     kWeights + "/llama/hf\"\n[data]\nformat = \"llmc\"\npath = \"" + dir_ +
                     "/window.bin\"\neval_path = \"" + dir_ + "/window.bin\"\nbatch_size = 1\n[train]\nsteps = 1\n[output]\ndir = \"" +
                     dir_ + "/run\"\n");
  const Result r = run("eval " + dir_ + "/d.toml");
  ASSERT_EQ(r.code, 0) << r.out;
  const std::string metrics = slurp(dir_ + "/run/metrics.jsonl");
  const auto at = metrics.rfind("\"eval_loss\": ");
  ASSERT_NE(at, std::string::npos) << metrics;
  EXPECT_NEAR(std::atof(metrics.c_str() + at + 13), expected, 1e-5);
}

TEST_F(Convert, WeightsThatDoNotFitTheDeckAreExit2) {
  deck(kWeights + "/hf");
  Result r = run("train " + dir_ + "/d.toml --set model.vocab_size=96");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("tensor 'wte' has shape (64, 32), the model needs (96, 32)"), std::string::npos) << r.out;
  r = run("train " + dir_ + "/d.toml --set model.layers=3");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("model.layers 2 in the file (blocks h.0 to h.1), 3 in the deck"), std::string::npos) << r.out;
  r = run("train " + dir_ + "/d.toml --set model.heads=8 --check");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("model.heads 4 in the file, 8 in the deck"), std::string::npos) << r.out;
  r = run("train " + dir_ + "/d.toml --set model.init=\\\"" + dir_ + "/missing\\\"");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("no such file or directory"), std::string::npos) << r.out;
  // A hostile file given to convert.
  std::ofstream(dir_ + "/bad.safetensors", std::ios::binary) << std::string("\xff\xff\xff\xff\xff\xff\xff\x7f{}", 10);
  r = run("convert " + dir_ + "/bad.safetensors " + dir_ + "/x.h5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("exceeds the specification's limit"), std::string::npos) << r.out;
  r = run("convert " + kWeights + "/bare_bf16.safetensors " + dir_ + "/y.h5");
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.out.find("give --heads"), std::string::npos) << r.out;
  r = run("eval " + dir_ + "/d.toml --set data.eval_path=[]");
  EXPECT_EQ(r.code, 2) << r.out;
}

// A sharded index is taken at its word: a tensor it places in a shard that lacks it is an
// error naming both, and a shard that is a directory is named as one.
TEST_F(Convert, ASkewedShardIndexOrADirectoryShardIsExit2NamingIt) {
  namespace fs = std::filesystem;
  const std::string d = dir_ + "/skewed";
  fs::copy(kWeights + "/sharded", d);
  const std::string index = d + "/model.safetensors.index.json";
  std::string text = slurp(index);
  const std::string entry = "\"transformer.wpe.weight\": \"model-00001-of-00002.safetensors\"";
  const auto at = text.find(entry);
  ASSERT_NE(at, std::string::npos) << text;
  text.replace(at, entry.size(), "\"transformer.wpe.weight\": \"model-00002-of-00002.safetensors\"");
  std::ofstream(index) << text;
  Result r = run("convert " + d + " " + dir_ + "/skewed.h5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(index + ": weight_map[\"transformer.wpe.weight\"] names model-00002-of-00002.safetensors, which "
                               "does not hold it"),
            std::string::npos)
      << r.out;
  fs::remove(d + "/model-00002-of-00002.safetensors");
  fs::create_directory(d + "/model-00002-of-00002.safetensors");
  r = run("convert " + d + " " + dir_ + "/skewed.h5");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find(d + "/model-00002-of-00002.safetensors: is a directory, not a file"), std::string::npos) << r.out;
}

using ConvertOutput = Cli;

// convert never writes onto its input (its own checkpoint once became a step-0 file with
// zeroed optimizer state), replaces an existing output only with --force, and never writes
// into a directory that a running job holds.
TEST_F(ConvertOutput, NeverOntoItsInputOverAnOutputWithoutForceOrIntoAJobsDirectory) {
  const std::string in = kWeights + "/llmc.bin", h5 = dir_ + "/w.h5";
  ASSERT_EQ(run("convert " + in + " " + h5).code, 0);
  const std::string before = slurp(h5);
  Result r = run("convert " + h5 + " " + h5 + " --force");
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("convert: " + h5 + " would write onto the input " + h5), std::string::npos) << r.out;
  r = run("convert " + h5 + " " + dir_ + " --to hf --force");  // a directory holding the input
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_EQ(slurp(h5), before);
  r = run("convert " + in + " " + h5);
  EXPECT_EQ(r.code, 2) << r.out;
  EXPECT_NE(r.out.find("convert: " + h5 + " exists; give --force to replace it"), std::string::npos) << r.out;
  EXPECT_EQ(run("convert " + in + " " + h5 + " --force").code, 0);
  const std::string held = dir_ + "/ckpt";
  std::filesystem::create_directories(held);
  {
    const DirectoryLock job(held, "checkpoint.dir");  // as a running job holds its checkpoint.dir
    r = run("convert " + in + " " + held + "/w.h5");
    EXPECT_EQ(r.code, 2) << r.out;
    EXPECT_NE(r.out.find("convert's output directory = " + held + " is in use by a job on host "), std::string::npos)
        << r.out;
    EXPECT_FALSE(std::filesystem::exists(held + "/w.h5"));
  }
  EXPECT_EQ(run("convert " + in + " " + held + "/w.h5").code, 0);
  // A file into a directory that does not exist yet: made, as for a HuggingFace directory.
  r = run("convert " + in + " " + dir_ + "/new/dir/w.h5");
  EXPECT_EQ(r.code, 0) << r.out;
  EXPECT_TRUE(std::filesystem::exists(dir_ + "/new/dir/w.h5"));
}

}  // namespace
}  // namespace lamina::test
