// A small GPT-2 written by the project's Python (tests/reference/make_weights.py) as
// HuggingFace safetensors (float32 with the `transformer.` prefix and the tied head,
// bfloat16 without it, float16 in shards) and as llm.c files: every source gives the same
// tensors, and lamina's logits and loss with them equal PyTorch's within 1e-5.
#include "lamina/io/model_weights.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "lamina/core/error.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/io/llmc_model.hpp"
#include "lamina/io/model_checkpoint.hpp"
#include "lamina/io/safetensors.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/train/generate.hpp"
#include "lamina/train/runtime.hpp"

namespace lamina::test {
namespace {

const std::string kWeights = std::string(LAMINA_SOURCE_DIR) + "/tests/reference/weights";

ModelConfig tiny() {
  ModelConfig m;
  m.layers = 2;
  m.d_model = 32;
  m.heads = 4;
  m.seq_len = 16;
  m.vocab_size = 64;
  return m;
}

std::vector<float> rounded(const std::vector<float>& v, StoredFloat t) {
  std::vector<std::uint8_t> bytes(v.size() * static_cast<std::size_t>(stored_size(t)));
  encode_floats(t, v.data(), static_cast<std::int64_t>(v.size()), bytes.data());
  std::vector<float> out(v.size());
  decode_floats(t, bytes.data(), static_cast<std::int64_t>(v.size()), out.data());
  return out;
}

TEST(ModelWeights, EverySourceHoldsTheSameModel) {
  const auto llmc = open_weights(kWeights + "/llmc.bin");
  const auto llmc16 = open_weights(kWeights + "/llmc_bf16.bin");
  EXPECT_EQ(llmc->format(), WeightsFormat::llmc);
  const ParamLayout layout = ParamLayout::of(tiny());
  std::vector<std::unique_ptr<WeightsSource>> st;
  if (safetensors_supported()) {
    st.push_back(open_weights(kWeights + "/hf"));
    st.push_back(open_weights(kWeights + "/bare_bf16.safetensors"));
    st.push_back(open_weights(kWeights + "/sharded"));
    EXPECT_EQ(st[0]->model().heads, 4);  // from config.json
    EXPECT_EQ(st[1]->model().heads, 0);  // a bare file does not say
  }
  for (const LayerSpec& l : layout.layers()) {
    for (const TensorSpec& t : l.tensors) {
      const auto exact = fetch_tensor(*llmc, t.name, t.global_shape);
      EXPECT_EQ(fetch_tensor(*llmc16, t.name, t.global_shape), rounded(exact, StoredFloat::bf16)) << t.name;
      if (st.empty()) continue;
      EXPECT_EQ(fetch_tensor(*st[0], t.name, t.global_shape), exact) << t.name;
      EXPECT_EQ(fetch_tensor(*st[1], t.name, t.global_shape), rounded(exact, StoredFloat::bf16)) << t.name;
      EXPECT_EQ(fetch_tensor(*st[2], t.name, t.global_shape), rounded(exact, StoredFloat::f16)) << t.name;
    }
  }
}

// The expected values PyTorch computed (float64, from the float32 weights).
struct Expected {
  std::vector<std::int32_t> tokens;  // (B, T + 1)
  std::vector<double> logits;        // (B, T, V)
  double loss = 0.0;
};

Expected expected(const std::string& dir = kWeights) {
  Expected e;
  const SafetensorsFile f(dir + "/expected.safetensors");
  const auto& tok = f.tensor("tokens");
  e.tokens.resize(static_cast<std::size_t>(tok.numel()));
  std::memcpy(e.tokens.data(), tok.data, static_cast<std::size_t>(tok.bytes));
  const auto& lg = f.tensor("logits");
  e.logits.resize(static_cast<std::size_t>(lg.numel()));
  std::memcpy(e.logits.data(), lg.data, static_cast<std::size_t>(lg.bytes));
  std::memcpy(&e.loss, f.tensor("loss").data, 8);
  return e;
}

// lamina's logits and loss for model `m` from `path` on PyTorch's tokens (`expected_dir`'s);
// returns the largest logit difference. With `grads`, a file of PyTorch's gradients stored
// like the weights, every gradient too (relative L2 within 1e-5).
double expect_pytorch_outputs(const std::string& path, double tolerance = 1e-5, const ModelConfig& m = tiny(),
                              const std::string& expected_dir = kWeights, const std::string& grads = "") {
  SCOPED_TRACE(path);
  const Expected e = expected(expected_dir);
  const std::int64_t B = 2, T = m.seq_len, V = m.vocab_size;
  Plan plan;
  plan.layout.micro_batch_size = B;
  plan.blocks.assign(static_cast<std::size_t>(m.layers), LayerPolicy{});
  MemoryTracker tracker;
  Runtime rt(tracker, m, OptimizerConfig{}, plan, RunExtras{}, MPI_COMM_SELF);
  rt.state().init(1);
  const auto source = open_weights(path);
  check_weights_model(*source, m);
  read_model_weights(*source, rt.state().layout(), rt.state());
  double worst = 0.0;
  for (std::int64_t b = 0; b < B; ++b) {
    const std::vector<std::int32_t> x(e.tokens.begin() + b * (T + 1), e.tokens.begin() + b * (T + 1) + T);
    const auto logits = sequence_logits(rt.state(), tracker, x);
    EXPECT_EQ(static_cast<std::int64_t>(logits.size()), T * V);
    if (static_cast<std::int64_t>(logits.size()) != T * V) return INFINITY;
    for (std::int64_t i = 0; i < T * V; ++i) worst = std::max(worst, std::fabs(logits[i] - e.logits[b * T * V + i]));
  }
  if (tolerance == 0.0) return worst;
  EXPECT_LT(worst, tolerance) << "largest logit difference";
  const MicroBatchLoader load = [&](int, std::int32_t* inputs, std::int32_t* targets) {
    for (std::int64_t b = 0; b < B; ++b) {
      std::copy_n(e.tokens.begin() + b * (T + 1), T, inputs + b * T);
      std::copy_n(e.tokens.begin() + b * (T + 1) + 1, T, targets + b * T);
    }
  };
  const double loss = rt.forward_backward(load, B * T).loss;
  EXPECT_NEAR(loss, e.loss, 1e-5);
  EXPECT_GT(std::fabs(loss - std::log(static_cast<double>(V))), 1e-3);  // not a uniform model
  if (!grads.empty()) {
    const auto expected_grads = open_weights(grads);
    const ParamLayout& layout = rt.state().layout();
    for (int l = 0; l < layout.num_layers(); ++l) {
      const auto g = rt.state().grads_host(l);
      for (const TensorSpec& t : layout.layers()[static_cast<std::size_t>(l)].tensors) {
        const std::vector<float> want = fetch_tensor(*expected_grads, t.name, t.global_shape);
        double num = 0.0, den = 0.0;
        for (std::size_t i = 0; i < want.size(); ++i) {
          const double d = static_cast<double>(g[static_cast<std::size_t>(t.offset) + i]) - want[i];
          num += d * d;
          den += static_cast<double>(want[i]) * want[i];
        }
        EXPECT_LT(std::sqrt(num / den), 1e-5) << "gradient of " << t.name;
      }
    }
  }
  return worst;
}

TEST(ModelWeights, LogitsAndLossEqualPyTorchFromLlmcFile) {
  if (!safetensors_supported()) GTEST_SKIP() << "the expected values are a safetensors file";
  expect_pytorch_outputs(kWeights + "/llmc.bin");
  // The comparison sees a rounding of the weights: the bfloat16 file is visibly off.
  EXPECT_GT(expect_pytorch_outputs(kWeights + "/llmc_bf16.bin", 0.0), 1e-4);
}

TEST(ModelWeights, LogitsAndLossEqualPyTorchFromHuggingFace) {
  if (!safetensors_supported()) GTEST_SKIP() << "built without nlohmann-json";
  expect_pytorch_outputs(kWeights + "/hf");
  expect_pytorch_outputs(kWeights + "/hf/model.safetensors");
}

// The project's own PyTorch Llama (tests/reference/make_llama.py: grouped-query attention,
// rotary positions with Llama 3's scaling, SwiGLU, RMSNorm, tied head) in HuggingFace's
// LlamaForCausalLM files: lamina reads its configuration, and its logits, loss and every
// gradient are PyTorch's.
const std::string kLlama = kWeights + "/llama";

ModelConfig tiny_llama() {
  ModelConfig m = tiny();
  m.kv_heads = 2;
  m.ffn_hidden = 48;
  m.parts.norm = NormKind::rmsnorm;
  m.parts.position = PositionKind::rotary;
  m.parts.rope_scaling = {4.0, 1.0, 4.0, 8.0};
  m.parts.mlp = MlpKind::swiglu;
  m.parts.bias = false;
  return m;
}

TEST(ModelWeights, ALlamaFromHuggingFaceGivesPyTorchsLogitsLossAndGradients) {
  if (!safetensors_supported()) GTEST_SKIP() << "built without nlohmann-json";
  const auto source = open_weights(kLlama + "/hf");
  EXPECT_EQ(source->model().kv_heads, 2);
  EXPECT_EQ(source->model().mlp_hidden(), 48);
  EXPECT_DOUBLE_EQ(source->model().parts.rope_scaling.factor, 4.0);
  EXPECT_EQ(block_signature(source->model()), block_signature(tiny_llama()));
  expect_pytorch_outputs(kLlama + "/hf", 1e-5, tiny_llama(), kLlama, kLlama + "/grads");
  // bfloat16 shards: the same model, rounded.
  const auto bf16 = open_weights(kLlama + "/sharded");
  const ParamLayout layout = ParamLayout::of(tiny_llama());
  for (const LayerSpec& l : layout.layers()) {
    for (const TensorSpec& t : l.tensors) {
      EXPECT_EQ(fetch_tensor(*bf16, t.name, t.global_shape),
                rounded(fetch_tensor(*source, t.name, t.global_shape), StoredFloat::bf16))
          << t.name;
    }
  }
}

// The same with an untied output layer (lm_head.weight, tie_word_embeddings = false).
TEST(ModelWeights, AnUntiedLlamaGivesPyTorchsLogitsLossAndGradients) {
  if (!safetensors_supported()) GTEST_SKIP() << "built without nlohmann-json";
  const std::string dir = kWeights + "/llama_untied";
  ModelConfig m = tiny_llama();
  m.tie_embeddings = false;
  const auto source = open_weights(dir + "/hf");
  EXPECT_FALSE(source->model().tie_embeddings);
  EXPECT_EQ(model_signature(source->model()).substr(model_signature(source->model()).size() - 21),
            " tie_embeddings=false");
  expect_pytorch_outputs(dir + "/hf", 1e-5, m, dir, dir + "/grads");
  // Written back, the head is there under its own name.
  const std::string out = (std::filesystem::temp_directory_path() / ("lamina_untied_" + std::to_string(::getpid()))).string();
  write_weights(out, *source, source->model(), WeightsOutput{});
  const SafetensorsFile back(out + "/model.safetensors"), original(dir + "/hf/model.safetensors");
  EXPECT_EQ(back.floats("lm_head.weight"), original.floats("lm_head.weight"));
  EXPECT_EQ(back.tensors().size(), original.tensors().size());
  std::filesystem::remove_all(out);
}

// lamina writes LlamaForCausalLM's files as HuggingFace does, and reads them back bit for bit.
TEST(ModelWeights, ALlamaWrittenToHuggingFaceReadsBackBitExact) {
  if (!safetensors_supported()) GTEST_SKIP() << "built without nlohmann-json";
  const std::string dir = (std::filesystem::temp_directory_path() / ("lamina_llama_" + std::to_string(::getpid()))).string();
  const auto source = open_weights(kLlama + "/hf");
  WeightsOutput out;
  out.max_shard_bytes = 40000;  // shards and an index
  const auto files = write_weights(dir, *source, source->model(), out);
  EXPECT_GE(files.size(), 3u);
  const auto back = open_weights(dir);
  EXPECT_EQ(model_signature(back->model()), model_signature(source->model()));
  const ParamLayout layout = ParamLayout::of(tiny_llama());
  for (const LayerSpec& l : layout.layers()) {
    for (const TensorSpec& t : l.tensors) {
      EXPECT_EQ(fetch_tensor(*back, t.name, t.global_shape), fetch_tensor(*source, t.name, t.global_shape)) << t.name;
    }
  }
  // The tensors under HuggingFace's own names and shapes.
  const SafetensorsFile original(kLlama + "/hf/model.safetensors");
  std::size_t seen = 0;
  for (const auto& f : files) {
    if (f.size() < 12 || f.compare(f.size() - 12, 12, ".safetensors") != 0) continue;
    const SafetensorsFile shard(f);
    for (const auto& [key, t] : shard.tensors()) {
      ASSERT_TRUE(original.has(key)) << key;
      EXPECT_EQ(t.shape, original.tensor(key).shape) << key;
      EXPECT_EQ(shard.floats(key), original.floats(key)) << key;
      ++seen;
    }
  }
  EXPECT_EQ(seen, original.tensors().size());
  std::filesystem::remove_all(dir);
}

TEST(ModelWeights, ALlamaThatLaminaCannotReadIsRefusedSayingWhy) {
  if (!safetensors_supported()) GTEST_SKIP() << "built without nlohmann-json";
  const std::string dir = (std::filesystem::temp_directory_path() / ("lamina_llama_bad_" + std::to_string(::getpid()))).string();
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(kLlama + "/hf/model.safetensors", dir + "/model.safetensors");
  std::ifstream in(kLlama + "/hf/config.json");
  const std::string config((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto error_with = [&](const std::string& from, const std::string& to) {
    std::string c = config;
    const auto at = c.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    if (at != std::string::npos) c.replace(at, from.size(), to);
    std::ofstream(dir + "/config.json") << c;
    try {
      open_weights(dir);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_with("\"tie_word_embeddings\": true", "\"tie_word_embeddings\": false").find("no lm_head.weight"),
            std::string::npos);
  EXPECT_NE(error_with("\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"").find("hidden_act \"gelu\""),
            std::string::npos);
  EXPECT_NE(error_with("\"rope_type\": \"llama3\"", "\"rope_type\": \"yarn\"").find("rope_type \"llama3\""),
            std::string::npos);
  EXPECT_NE(error_with("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3").find("do not fit hidden_size"),
            std::string::npos);
  std::filesystem::remove(dir + "/config.json");
  try {
    open_weights(dir);
    ADD_FAILURE() << "a Llama without config.json was read";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("need their config.json"), std::string::npos) << e.what();
  }
  // A deck whose block differs is named with both blocks.
  std::ofstream(dir + "/config.json") << config;
  ModelConfig deck = tiny_llama();
  deck.parts.rope_theta = 500000;
  try {
    check_weights_model(*open_weights(dir), deck);
    ADD_FAILURE() << "a deck with another rotary base took the file";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("rope_theta=10000"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("rope_theta=500000"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(ModelWeights, AShapeThatDoesNotFitNamesTheTensorAndBothShapes) {
  const auto llmc = open_weights(kWeights + "/llmc.bin");
  try {
    fetch_tensor(*llmc, "h.0.mlp.c_fc.weight", {32, 256});
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'h.0.mlp.c_fc.weight' has shape (32, 128), the model needs (32, 256)"),
              std::string::npos)
        << e.what();
  }
  // A shorter context reads the first rows of the position table.
  EXPECT_EQ(fetch_tensor(*llmc, "wpe", {8, 32}).size(), 8u * 32u);
  ModelConfig deeper = tiny();
  deeper.layers = 3;
  deeper.heads = 8;
  try {
    check_weights_model(*llmc, deeper);
    ADD_FAILURE();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers 2 in the file (blocks h.0 to h.1), 3 in the deck; model.heads 4 in the file, 8"),
              std::string::npos)
        << e.what();
  }
}

class LlmcDamage : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() / ("lamina_llmc_" + std::to_string(::getpid()) + ".bin")).string();
    std::ifstream in(kWeights + "/llmc.bin", std::ios::binary);
    bytes_.assign(std::istreambuf_iterator<char>(in), {});
  }
  void TearDown() override { std::filesystem::remove(path_); }
  void expect_refused(const std::string& says) {
    std::ofstream(path_, std::ios::binary).write(bytes_.data(), static_cast<std::streamsize>(bytes_.size()));
    try {
      LlmcModelFile f(path_);
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
  void set(int i, std::int32_t v) { std::memcpy(&bytes_[4 * static_cast<std::size_t>(i)], &v, 4); }
  std::string path_;
  std::vector<char> bytes_;
};

TEST_F(LlmcDamage, HeadersThatDoNotDescribeTheFileAreRefused) {
  bytes_.resize(bytes_.size() - 4);
  expect_refused("truncated or not this model");
  SetUp();
  set(1, 4);
  expect_refused("version 4");
  SetUp();
  set(4, 1 << 30);  // layers
  expect_refused("truncated or not this model");
  SetUp();
  set(6, -32);
  expect_refused("header[6] (channels) = -32");
  SetUp();
  set(7, 32);  // padded vocabulary below the vocabulary
  expect_refused("smaller than the vocabulary");
  SetUp();
  set(5, 5);  // heads that do not divide the width
  expect_refused("not divisible by heads");
  bytes_.resize(100);
  expect_refused("fewer than its 1024-byte header");
}

}  // namespace
}  // namespace lamina::test
