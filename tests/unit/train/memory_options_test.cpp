// Memory options change where data lives and when it is computed, never the numbers:
// each of them, alone and combined, trains bit for bit like keeping everything on the
// device (one kernel for host and device updates, exact copies, deterministic recompute).
// And the analytic memory model predicts what the run allocates.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>

#include "lamina/core/buffer.hpp"
#include "lamina/core/error.hpp"
#include "lamina/plan/plan.hpp"
#include "lamina/train/bench.hpp"
#include "lamina/train/trainer.hpp"
#include "training_fixture.hpp"

namespace lamina::test {
namespace {

using MemoryOptions = Training;

TEST_F(MemoryOptions, ActivationPoliciesTrainBitIdentically) {
  expect_like_baseline("recompute", {"memory.activations=recompute"});
  expect_like_baseline("offload", {"memory.activations=offload"});
  expect_like_baseline("mixed", {"memory.activations=[\"offload\", \"recompute\"]"});
}

// Layered accumulation with checkpoints in the host tier (Lamy-Poirier): the blocks
// recompute from checkpoints that went to the host and came back, exactly as stored.
TEST_F(MemoryOptions, OffloadedCheckpointsTrainBitIdentically) {
  const std::vector<std::string> layered{"parallel.layered=true"};
  expect_like_baseline("checkpoints", {"memory.activations=offload_checkpoint"}, layered);
  expect_like_baseline("checkpoints_mixed", {"memory.activations=[\"keep\", \"offload_checkpoint\"]"}, layered);
  expect_like_baseline("checkpoints_zero3", {"memory.activations=offload_checkpoint", "parallel.zero=3"}, layered);
}

TEST_F(MemoryOptions, OffloadedCheckpointsTrainBitIdenticallyInBf16) {
  const std::vector<std::string> bf16{"parallel.layered=true", "train.precision=bf16"};
  expect_like_baseline("checkpoints_bf16", {"memory.activations=offload_checkpoint"}, bf16);
  expect_like_baseline("checkpoints_bf16_mixed", {"memory.activations=[\"offload_checkpoint\", \"offload\"]"},
                       bf16);
}

TEST_F(MemoryOptions, ParameterAndOptimizerPlacementsTrainBitIdentically) {
  expect_like_baseline("optimizer_host", {"memory.optimizer=host"});
  expect_like_baseline("params_host", {"memory.params=host", "memory.optimizer=host"});
  expect_like_baseline("per_layer", {"memory.params=[\"host\", \"device\"]", "memory.optimizer=[\"dynamic\", \"host\"]"});
}

TEST_F(MemoryOptions, DeepOptimizerStatesSplitsTrainBitIdentically) {
  for (const char* split : {"all_host", "all_device", "alternate", "model"}) {
    for (const char* subgroup : {"300", "1000", "100000"}) {
      const std::string name = std::string("dos_") + split + "_" + subgroup;
      expect_like_baseline(name, {"memory.optimizer=dynamic", std::string("memory.dos_split=") + split,
                                  std::string("optimizer.subgroup_size=") + subgroup});
    }
  }
}

TEST_F(MemoryOptions, EverythingAtOnceTrainsBitIdentically) {
  expect_like_baseline("all", {"memory.activations=[\"recompute\", \"offload\"]", "memory.params=host",
                               "memory.optimizer=dynamic", "memory.dos_split=alternate",
                               "optimizer.subgroup_size=500"});
}

// Copies between the memory tiers on worker threads beside the host (parallel.host_copies =
// "threads"), each started up to 300 us late at random, so that they land in every order a
// device could run them in: a wait the instruction lists lacked would show as other bits.
class ThreadedCopies : public Training {
 protected:
  void SetUp() override {
    Training::SetUp();
    setenv("LAMINA_COPY_DELAY_US", "300", 1);
  }
  void TearDown() override {
    unsetenv("LAMINA_COPY_DELAY_US");
    Training::TearDown();
  }
};

TEST_F(ThreadedCopies, EveryPolicyTrainsBitIdenticallyToInlineCopies) {
  const std::string threads = "parallel.host_copies=threads";
  expect_like_baseline("threads_mixed", {"memory.activations=[\"offload\", \"recompute\"]", threads});
  expect_like_baseline("threads_all", {"memory.activations=[\"recompute\", \"offload\"]", "memory.params=host",
                                       "memory.optimizer=dynamic", "memory.dos_split=alternate",
                                       "optimizer.subgroup_size=500", threads});
}

// ZeRO-3 on one rank reduces every micro-batch's gradients: a baseline of its own.
TEST_F(ThreadedCopies, ZeroThreeTrainsBitIdenticallyToInlineCopies) {
  expect_like_baseline("threads_zero3_host",
                       {"memory.activations=offload", "memory.params=host", "memory.optimizer=host",
                        "parallel.host_copies=threads"},
                       {"parallel.zero=3"});
}

TEST_F(ThreadedCopies, OffloadedCheckpointsTrainBitIdenticallyToInlineCopies) {
  const std::vector<std::string> layered{"parallel.layered=true"};
  expect_like_baseline("threads_checkpoints",
                       {"memory.activations=[\"offload_checkpoint\", \"offload\"]", "parallel.host_copies=threads"},
                       layered);
}

TEST_F(ThreadedCopies, Bf16TrainsBitIdenticallyToInlineCopies) {
  const std::vector<std::string> bf16{"train.precision=bf16"};
  expect_like_baseline("threads_bf16", {"memory.activations=offload", "memory.params=host",
                                        "memory.optimizer=dynamic", "parallel.host_copies=threads"},
                       bf16);
}

// The head's loss in chunks of rows (model.loss_chunk; 24 rows of a micro-batch's 64: two
// whole chunks and a partial one), backward computing each chunk's logits again: the losses
// and the model of the whole logits, but for the order in which the output layer's gradient
// adds the chunks' rows (fp32 sums regrouped: the model within 2.4e-7, 2.1e-8 in bf16).
TEST_F(MemoryOptions, LossChunksTrainAsTheWholeLogits) {
  for (const std::string precision : {"fp32", "bf16"}) {
    const std::vector<std::string> common = {"train.precision=" + precision};
    std::vector<std::string> chunked = common;
    chunked.push_back("model.loss_chunk=24");
    run_training(deck("whole_" + precision, 3, common), quiet_, MPI_COMM_WORLD);
    const Deck d = deck("chunked_" + precision, 3, chunked);
    run_training(d, quiet_, MPI_COMM_WORLD);
    const auto whole = metric_lines(dir_ + "/whole_" + precision + "/metrics.jsonl");
    const auto chunks = metric_lines(dir_ + "/chunked_" + precision + "/metrics.jsonl");
    ASSERT_EQ(whole.size(), 3u);
    ASSERT_EQ(chunks.size(), whole.size());
    for (std::size_t i = 0; i < whole.size(); ++i) {
      const double a = std::stod(loss_of(whole[i])), b = std::stod(loss_of(chunks[i]));
      EXPECT_NEAR(b, a, 1e-6 * a) << precision << " step " << i + 1;
    }
    const ParamLayout layout = ParamLayout::of(d.model);
    double worst = 0;
    for (const auto& l : layout.layers()) {
      for (const auto& t : l.tensors) {
        const auto x = dataset(dir_ + "/whole_" + precision + "/checkpoints/step_00000003.h5", "model/" + t.name);
        const auto y = dataset(dir_ + "/chunked_" + precision + "/checkpoints/step_00000003.h5", "model/" + t.name);
        double num = 0, den = 0;
        for (std::size_t k = 0; k < x.size(); ++k) {
          num += (double(x[k]) - y[k]) * (double(x[k]) - y[k]);
          den += double(x[k]) * x[k];
        }
        worst = std::max(worst, std::sqrt(num / std::max(den, 1e-30)));
      }
    }
    EXPECT_LT(worst, 1e-5) << precision;
  }
}

TEST_F(MemoryOptions, PredictedPeakMemoryIsWhatTheRunAllocates) {
  for (const std::vector<std::string>& sets :
       {std::vector<std::string>{}, {"memory.activations=recompute"}, {"memory.activations=offload"},
        {"memory.params=host", "memory.optimizer=host"}, {"memory.optimizer=dynamic", "memory.dos_split=alternate"},
        {"memory.activations=[\"offload\", \"keep\"]", "memory.optimizer=dynamic",
         "memory.dos_split=all_device"},
        {"parallel.layered=true", "memory.activations=offload_checkpoint"},
        {"parallel.layered=true", "memory.activations=[\"offload_checkpoint\", \"keep\"]", "parallel.zero=3"},
        {"parallel.layered=true", "memory.activations=offload_checkpoint", "train.precision=bf16"},
        {"model.loss_chunk=24"}}) {
    const JsonObject j = bench_memory(deck("bench", 2, sets), 2, quiet_);
    const std::string s = j.str();
    const auto k = s.find("\"max_relative_error\": ");
    ASSERT_NE(k, std::string::npos) << s;
    EXPECT_LT(std::stod(s.substr(k + 22)), 1e-9) << s;
  }
}

// A Llama block (multi-query attention here: heads = 2, kv_heads = 1) under the memory
// options: bit for bit like keeping everything, and the predicted peak what it allocates.
TEST_F(MemoryOptions, LlamaBlocksTrainBitIdenticallyAndThePeakIsPredicted) {
  const std::vector<std::string> llama{"model.arch=llama", "model.kv_heads=1", "model.ffn_hidden=40"};
  expect_like_baseline("llama_recompute", {"memory.activations=recompute"}, llama);
  expect_like_baseline("llama_offload", {"memory.activations=offload", "memory.params=host",
                                         "memory.optimizer=dynamic"}, llama);
  // An untied output layer's: the same options, the same numbers as keeping everything.
  std::vector<std::string> untied = llama;
  untied.push_back("model.tie_embeddings=false");
  run_training(deck("untied_baseline", 3, untied), quiet_, MPI_COMM_WORLD);
  std::vector<std::string> moved = untied;
  for (const char* s : {"memory.activations=recompute", "memory.params=host", "memory.optimizer=dynamic"}) {
    moved.push_back(s);
  }
  const Deck d = deck("untied_moved", 3, moved);
  run_training(d, quiet_, MPI_COMM_WORLD);
  expect_identical_checkpoints(dir_ + "/untied_baseline/checkpoints/step_00000003.h5",
                               dir_ + "/untied_moved/checkpoints/step_00000003.h5", d.model);
  for (std::vector<std::string> sets :
       {std::vector<std::string>{}, {"memory.activations=recompute"}, {"memory.activations=offload"},
        {"memory.params=host", "memory.optimizer=host"},
        {"parallel.layered=true", "memory.activations=offload_checkpoint", "train.precision=bf16"},
        {"model.tie_embeddings=false", "memory.params=host", "memory.optimizer=dynamic", "train.precision=bf16"}}) {
    sets.insert(sets.end(), llama.begin(), llama.end());
    const std::string s = bench_memory(deck("llama_bench", 2, sets), 2, quiet_).str();
    const auto k = s.find("\"max_relative_error\": ");
    ASSERT_NE(k, std::string::npos) << s;
    EXPECT_LT(std::stod(s.substr(k + 22)), 1e-9) << s;
  }
}

TEST_F(MemoryOptions, PredictedPeakMemoryIsExactForTheShippedDecks) {
  // gpt2-124m.toml is left out: one of its micro-batches needs tens of GiB.
  for (const char* name : {"demo", "llama-demo", "bench-torch", "scaling-small"}) {
    const Deck d = load_deck(std::string(LAMINA_SOURCE_DIR) + "/inputs/" + name + ".toml",
                             {"output.dir=" + dir_ + "/" + name, "optimizer.warmup_steps=0"});
    const std::string s = bench_memory(d, 1, quiet_).str();
    const auto k = s.find("\"max_relative_error\": ");
    ASSERT_NE(k, std::string::npos) << s;
    EXPECT_LT(std::stod(s.substr(k + 22)), 1e-9) << name << ": " << s;
  }
}

TEST_F(MemoryOptions, OffloadingMovesBytesToTheHostTier) {
  // Measured peak bytes of the host tier ("Host (host tier)" where the device is the host,
  // "Host" beside a GPU); 0 when the run allocated none there.
  const std::string key = "\"" + tier_label(MemTier::host) + "\": ";
  auto host_bytes = [&](const std::vector<std::string>& sets) {
    const std::string s = bench_memory(deck("tiers", 2, sets), 1, quiet_).str();
    const std::string measured =
        s.substr(s.find("\"measured_bytes\""), s.find("\"predicted_by_category\"") - s.find("\"measured_bytes\""));
    const auto at = measured.find(key);
    return at == std::string::npos ? 0.0 : std::stod(measured.substr(at + key.size()));
  };
  const double base = host_bytes({});
  EXPECT_GT(host_bytes({"memory.activations=offload"}), base);
  EXPECT_GT(host_bytes({"memory.optimizer=host"}), base);
  EXPECT_GT(host_bytes({"parallel.layered=true", "memory.activations=offload_checkpoint"}), base);
}

TEST_F(MemoryOptions, ABudgetTooSmallNamesTheOptionsThatHelp) {
  try {
    run_training(deck("budget", 3, {"memory.device_budget=64KiB"}), quiet_, MPI_COMM_WORLD);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    for (const char* s : {"memory.device_budget = 64.00 KiB", "over", "memory.activations", "memory.optimizer",
                          "parallel.zero"}) {
      EXPECT_NE(msg.find(s), std::string::npos) << s << " in " << msg;
    }
  }
}

TEST_F(MemoryOptions, BadCombinationsAreDeckErrors) {
  auto error_of = [&](const std::vector<std::string>& sets) {
    try {
      plan_from_deck(deck("bad", 3, sets));
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  EXPECT_NE(error_of({"memory.params=host", "memory.optimizer=device"}).find("use 'host' or 'dynamic'"),
            std::string::npos);
  EXPECT_NE(error_of({"memory.activations=[\"keep\"]"}).find("the list has 1 entries, model.layers = 2"),
            std::string::npos);
  EXPECT_NE(error_of({"memory.activations=recompte"}).find("(did you mean 'recompute'?)"), std::string::npos);
  EXPECT_NE(error_of({"memory.activations=offload_checkpoint"}).find("needs parallel.layered = true"),
            std::string::npos);
}

}  // namespace
}  // namespace lamina::test
