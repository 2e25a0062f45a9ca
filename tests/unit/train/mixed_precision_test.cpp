// bf16 mixed precision: bf16 parameters and stored activations, fp32 master weights,
// moments and gradients. Every memory option trains bit for bit like the bf16 run that
// keeps everything (stored activations are bf16 whatever the policy); the memory model
// predicts what the run allocates; and the demo learns as well as in fp32.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numeric>

#include "lamina/model/gpt_activations.hpp"
#include "lamina/train/bench.hpp"
#include "lamina/train/generate.hpp"
#include "lamina/train/runtime.hpp"
#include "lamina/train/trainer.hpp"
#include "training_fixture.hpp"

namespace lamina::test {
namespace {

class MixedPrecision : public Training {
 protected:
  void expect_like_bf16_baseline(const std::string& name, const std::vector<std::string>& sets) {
    expect_like_baseline(name, sets, {"train.precision=bf16"});
  }
  // Measured peak bytes of one category in one memory tier, from `lamina bench memory`.
  std::int64_t measured(const std::vector<std::string>& sets, MemTier tier, const std::string& category) {
    const std::string s = bench_memory(deck("peak", 2, sets), 1, quiet_).str();
    const auto space = s.find("\"" + tier_label(tier) + "\": {", s.find("\"measured_by_category\""));
    const auto k = s.find("\"" + category + "\": ", space);
    EXPECT_TRUE(space != std::string::npos && k != std::string::npos && k < s.find('}', space)) << s;
    return k == std::string::npos ? 0 : std::stoll(s.substr(k + category.size() + 4));
  }
};

TEST_F(MixedPrecision, MemoryOptionsTrainBitIdenticallyInBf16) {
  expect_like_bf16_baseline("recompute", {"memory.activations=recompute"});
  expect_like_bf16_baseline("offload", {"memory.activations=offload"});
  expect_like_bf16_baseline("host", {"memory.params=host", "memory.optimizer=host"});
  expect_like_bf16_baseline("dynamic", {"memory.optimizer=dynamic", "memory.dos_split=alternate",
                                        "optimizer.subgroup_size=300"});
  expect_like_bf16_baseline("mixed", {"memory.activations=[\"offload\", \"recompute\"]",
                                      "memory.params=[\"device\", \"host\"]",
                                      "memory.optimizer=[\"dynamic\", \"host\"]", "memory.dos_split=all_device"});
}

TEST_F(MixedPrecision, Bf16DiffersFromFp32ButOnlyByRounding) {
  run_training(deck("fp32", 3), quiet_, MPI_COMM_WORLD);
  run_training(deck("bf16", 3, {"train.precision=bf16"}), quiet_, MPI_COMM_WORLD);
  const auto a = metric_lines(dir_ + "/fp32/metrics.jsonl"), b = metric_lines(dir_ + "/bf16/metrics.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_NE(loss_of(a[0]), loss_of(b[0]));  // bf16 parameters change the very first forward
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(std::stod(loss_of(b[i])), std::stod(loss_of(a[i])), 2e-2) << i;
  // The checkpoint holds the fp32 master weights, not their bf16 rounding.
  const auto w = dataset(dir_ + "/bf16/checkpoints/step_00000003.h5", "model/h.0.mlp.c_fc.weight");
  std::size_t not_bf16 = 0;
  for (const float x : w) {
    std::uint32_t u;
    std::memcpy(&u, &x, sizeof(u));
    not_bf16 += (u & 0xffffu) != 0;
  }
  EXPECT_GT(not_bf16, w.size() / 2);
}

// A Llama block (grouped queries: 2 heads share 1 key/value head) in bf16: within bf16's
// rounding of its fp32 run, and bit for bit the same under the memory options.
TEST_F(MixedPrecision, ALlamaInBf16DiffersFromFp32OnlyByRoundingUnderEveryPolicy) {
  const std::vector<std::string> llama{"model.arch=llama", "model.kv_heads=1", "model.ffn_hidden=40"};
  auto with = [&](std::vector<std::string> sets) {
    sets.insert(sets.end(), llama.begin(), llama.end());
    return sets;
  };
  run_training(deck("llama_fp32", 3, with({})), quiet_, MPI_COMM_WORLD);
  run_training(deck("llama_bf16", 3, with({"train.precision=bf16"})), quiet_, MPI_COMM_WORLD);
  const auto a = metric_lines(dir_ + "/llama_fp32/metrics.jsonl"), b = metric_lines(dir_ + "/llama_bf16/metrics.jsonl");
  ASSERT_EQ(a.size(), 3u);
  ASSERT_EQ(b.size(), 3u);
  EXPECT_NE(loss_of(a[0]), loss_of(b[0]));
  for (std::size_t i = 0; i < 3; ++i) EXPECT_NEAR(std::stod(loss_of(b[i])), std::stod(loss_of(a[i])), 2e-2) << i;
  expect_like_baseline("llama_bf16_recompute", {"memory.activations=recompute"}, with({"train.precision=bf16"}));
  expect_like_baseline("llama_bf16_offload", {"memory.activations=offload", "memory.optimizer=dynamic"},
                       with({"train.precision=bf16"}));
}

TEST_F(MixedPrecision, PredictedPeakMemoryIsWhatTheRunAllocates) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{}, {"memory.activations=recompute"}, {"memory.activations=offload"},
        {"memory.params=host", "memory.optimizer=host"}, {"memory.optimizer=dynamic", "memory.dos_split=alternate"},
        {"memory.activations=[\"offload\", \"keep\"]", "memory.optimizer=dynamic", "memory.dos_split=all_device",
         "memory.params=host"}}) {
    auto with = sets;
    with.push_back("train.precision=bf16");
    const std::string s = bench_memory(deck("bench", 2, with), 2, quiet_).str();
    const auto k = s.find("\"max_relative_error\": ");
    ASSERT_NE(k, std::string::npos) << s;
    EXPECT_LT(std::stod(s.substr(k + 22)), 1e-9) << s;
  }
}

TEST_F(MixedPrecision, StoredParametersAndActivationsTakeHalfTheBytes) {
  // With parameters and optimizer in the host tier, its parameter bytes are the stored copy.
  const std::vector<std::string> fp32 = {"model.layers=4", "memory.params=host", "memory.optimizer=host"};
  std::vector<std::string> bf16 = fp32;
  bf16.push_back("train.precision=bf16");
  const MemTier host = MemTier::host, device = MemTier::device;
  EXPECT_NEAR(measured(bf16, host, "parameters"), measured(fp32, host, "parameters") / 2, 8 * 6);  // 6 layers' padding
  // fp32 master weights join m and v: 12 bytes per parameter instead of 8.
  EXPECT_NEAR(measured(bf16, host, "optimizer_state"), measured(fp32, host, "optimizer_state") * 3 / 2, 12 * 6);
  // Kept inner activations, the residual stream (the range's input and the four blocks'
  // outputs) and the final norm's output take half the bytes, which the kernels read and
  // write as they are: no fp32 copy of a block's activations (the logits and the residual
  // stream's gradient stay fp32).
  const Deck d = deck("sizes", 2, fp32);
  const Dims dims = Dims::of(d.model, d.data.micro_batch_size);
  const ActivationSizes a = activation_sizes(dims);
  ASSERT_EQ(a.boundary % 2, 0);
  EXPECT_EQ(measured(fp32, device, "activations") - measured(bf16, device, "activations"),
            4 * 2 * a.inner + 5 * 2 * a.boundary + 2 * dims.N() * dims.C);
}

// The demo deck as shipped, in both precisions (the one test that trains it for long).
TEST_F(MixedPrecision, TheDemoLearnsAsInFp32Over200Steps) {
  std::vector<double> last[2];
  for (int bf16 = 0; bf16 < 2; ++bf16) {
    const std::string run = bf16 ? "demo_bf16" : "demo_fp32";
    const Deck d = load_deck(std::string(LAMINA_SOURCE_DIR) + "/inputs/demo.toml",
                             {"train.steps=200", "output.dir=" + dir_ + "/" + run, "output.sample_tokens=0", "output.log_every=1",
                              "checkpoint.every=0", "checkpoint.save_final=false",
                              std::string("train.precision=") + (bf16 ? "bf16" : "fp32")});
    const TrainSummary s = run_training(d, quiet_, MPI_COMM_WORLD);
    const auto lines = metric_lines(dir_ + "/" + run + "/metrics.jsonl");
    ASSERT_EQ(lines.size(), 200u);
    EXPECT_GT(std::stod(loss_of(lines.front())), 5.0) << run;  // ln 256 = 5.55 at initialisation
    EXPECT_LT(s.final_loss, 3.0) << run;  // the licenses' unigram entropy is 3.19 nats
    for (std::size_t i = 180; i < 200; ++i) last[bf16].push_back(std::stod(loss_of(lines[i])));
  }
  const double fp32 = std::accumulate(last[0].begin(), last[0].end(), 0.0) / 20;
  const double bf16 = std::accumulate(last[1].begin(), last[1].end(), 0.0) / 20;
  EXPECT_LT(fp32, 2.3);  // well below the text's unigram entropy (3.2 nats): it learnt
  EXPECT_NEAR(bf16, fp32, 0.03 * fp32) << "mean loss of steps 181-200";
}

// Sampling (output.sample_every) runs the model as training does: in a bf16 run the same
// storage and the same products (the bf16 engine where the run has one), so its logits give
// the training forward's loss on the same tokens. (Before, sampling kept fp32 products,
// which on a device meant the host BLAS given device memory, and fp32 storage.)
TEST_F(MixedPrecision, SamplingComputesWhatTrainingComputes) {
  const Deck d = deck("sample", 2, {"train.precision=bf16", "data.micro_batch_size=1", "data.batch_size=1"});
  Plan plan = plan_from_deck(d);
  MemoryTracker tracker;
  Runtime rt(tracker, d.model, d.optimizer, plan, RunExtras{}, MPI_COMM_SELF);
  rt.state().init(7);
  const std::int64_t T = d.model.seq_len, V = d.model.vocab_size;
  std::vector<std::int32_t> x(static_cast<std::size_t>(T + 1));
  for (std::int64_t t = 0; t <= T; ++t) x[static_cast<std::size_t>(t)] = static_cast<std::int32_t>((t * 37 + 5) % V);
  const std::vector<std::int32_t> inputs(x.begin(), x.end() - 1);
  const std::vector<float> logits = sequence_logits(rt.state(), tracker, inputs);
  ASSERT_EQ(static_cast<std::int64_t>(logits.size()), T * V);
  double sampled = 0.0;  // mean cross-entropy of the sampled logits
  for (std::int64_t t = 0; t < T; ++t) {
    const float* row = logits.data() + t * V;
    const double top = *std::max_element(row, row + V);
    double sum = 0.0;
    for (std::int64_t v = 0; v < V; ++v) sum += std::exp(row[v] - top);
    sampled += top + std::log(sum) - row[x[static_cast<std::size_t>(t + 1)]];
  }
  sampled /= static_cast<double>(T);
  const MicroBatchLoader load = [&](int, std::int32_t* in, std::int32_t* out) {
    std::copy_n(x.begin(), T, in);
    std::copy_n(x.begin() + 1, T, out);
  };
  const double trained = rt.forward_backward(load, T).loss;
  // The same numbers, up to the loss kernel's float sums (measured on a CPU with oneDNN's
  // bf16 products: 5e-9 of the loss; with sampling's former fp32 storage 1.4e-5, 6e-6 with
  // fp32 products too).
  EXPECT_NEAR(sampled, trained, 1e-6 * trained) << "products: " << product_math_name(rt.dims().products);
}

}  // namespace
}  // namespace lamina::test
