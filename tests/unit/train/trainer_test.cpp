#include "lamina/train/trainer.hpp"

#include <gtest/gtest.h>
#include <hdf5.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lamina/core/error.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/io/hdf5_file.hpp"
#include "lamina/plan/memory_estimate.hpp"
#include "training_fixture.hpp"

namespace lamina::test {
namespace {

TEST_F(Training, ResumeContinuesBitIdentically) {
  // Uninterrupted: 6 steps.
  const TrainSummary full = run_training(deck("full", 6), quiet_, MPI_COMM_WORLD);
  EXPECT_EQ(full.last_step, 6);
  // Interrupted: 3 steps, then a restart from the latest checkpoint up to 6.
  run_training(deck("split", 3), quiet_, MPI_COMM_WORLD);
  const TrainSummary resumed = run_training(deck("split", 6, {"checkpoint.resume=latest"}), quiet_, MPI_COMM_WORLD);
  EXPECT_EQ(resumed.first_step, 3);
  EXPECT_EQ(resumed.last_step, 6);

  const auto a = metric_lines(dir_ + "/full/metrics.jsonl"), b = metric_lines(dir_ + "/split/metrics.jsonl");
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(b.size(), 6u);
  for (std::size_t i = 0; i < 6; ++i) EXPECT_EQ(loss_of(a[i]), loss_of(b[i])) << "step " << i + 1;
  EXPECT_EQ(full.final_loss, resumed.final_loss);

  const std::string fa = dir_ + "/full/checkpoints/step_00000006.h5", fb = dir_ + "/split/checkpoints/step_00000006.h5";
  for (const char* name : {"model/wte", "model/h.1.mlp.c_fc.weight", "model/ln_f.bias", "optimizer/exp_avg/wpe",
                           "optimizer/exp_avg_sq/h.0.attn.c_attn.weight"}) {
    EXPECT_EQ(dataset(fa, name), dataset(fb, name)) << name;
  }
  EXPECT_EQ(CheckpointReader(fa, MPI_COMM_SELF).meta().samples_consumed, 48);
}

TEST_F(Training, LayeredAccumulationIsBitIdenticalToPlainAccumulation) {
  // Each layer sums its micro-batches' gradients in the same order either way, except the
  // tied embedding: plain accumulation adds head and lookup gradients micro-batch by
  // micro-batch, layered all head parts first. One step isolates that difference.
  run_training(deck("plain", 1, {"optimizer.warmup_steps=0"}), quiet_, MPI_COMM_WORLD);
  run_training(deck("layered", 1, {"optimizer.warmup_steps=0", "parallel.layered=true", "parallel.schedule=gpipe"}),
               quiet_, MPI_COMM_WORLD);
  const std::string a = dir_ + "/plain/checkpoints/step_00000001.h5", b = dir_ + "/layered/checkpoints/step_00000001.h5";
  for (const char* name : {"model/h.0.attn.c_attn.weight", "model/h.1.mlp.c_proj.bias", "model/wpe",
                           "optimizer/exp_avg/h.0.ln_1.weight", "optimizer/exp_avg_sq/ln_f.weight"}) {
    EXPECT_EQ(dataset(a, name), dataset(b, name)) << name;
  }
  const auto wa = dataset(a, "optimizer/exp_avg/wte"), wb = dataset(b, "optimizer/exp_avg/wte");
  double num = 0, den = 0;
  for (std::size_t i = 0; i < wa.size(); ++i) {
    num += (wa[i] - wb[i]) * (wa[i] - wb[i]);
    den += wb[i] * wb[i];
  }
  EXPECT_LT(std::sqrt(num / den), 1e-6);
}

TEST_F(Training, ResumeAtTheEndDoesNothingAndWrongModelIsAnInputError) {
  run_training(deck("done", 2), quiet_, MPI_COMM_WORLD);
  const TrainSummary again = run_training(deck("done", 2, {"checkpoint.resume=latest"}), quiet_, MPI_COMM_WORLD);
  EXPECT_EQ(again.first_step, 2);
  EXPECT_EQ(again.last_step, 2);
  try {
    run_training(deck("done", 4, {"checkpoint.resume=latest", "model.d_model=64"}), quiet_, MPI_COMM_WORLD);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("the checkpoint holds a model with layers=2 d_model=32"), std::string::npos)
        << e.what();
  }
}

// Rewrites a checkpoint the way lamina wrote them before checksums: contiguous datasets.
std::int64_t strip_checksums(const std::string& from, const std::string& to, const ModelConfig& model) {
  const CheckpointMeta meta = CheckpointReader(from, MPI_COMM_SELF).meta();
  h5::Id in = h5::open_read(from, MPI_COMM_SELF);
  h5::Id f = h5::create(to, MPI_COMM_SELF);
  h5::Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
  H5Pset_create_intermediate_group(lcpl, 1);
  std::int64_t tensors = 0;
  const ParamLayout layout = ParamLayout::of(model);
  for (const auto& l : layout.layers()) {
    for (const auto& t : l.tensors) {
      for (const char* prefix : {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"}) {
        const std::string name = prefix + t.name;
        const std::vector<hsize_t> dims(t.global_shape.begin(), t.global_shape.end());
        std::vector<float> v(static_cast<std::size_t>(t.numel()));  // tp 1: the global tensor
        h5::read(in, from, name, v.data());
        h5::Id space(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), H5Sclose);
        h5::Id ds(H5Dcreate2(f, name.c_str(), H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
        EXPECT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()), 0) << name;
        ++tensors;
      }
    }
  }
  h5::set_attr(f, "format", std::string("lamina-checkpoint-1"));
  h5::set_attr(f, "step", meta.step);
  h5::set_attr(f, "samples_consumed", meta.samples_consumed);
  h5::set_attr(f, "optimizer_step", meta.optimizer_step);
  h5::set_attr(f, "seed", static_cast<std::int64_t>(meta.seed));
  h5::set_attr(f, "deck", meta.deck);
  h5::set_attr(f, "layout", meta.layout);
  h5::set_attr(f, "model", meta.model);
  h5::close(f, to);
  return tensors;
}

TEST_F(Training, ResumesFromACheckpointWithoutChecksumsAndWarns) {
  run_training(deck("new", 2), quiet_, MPI_COMM_WORLD);
  const std::string old = dir_ + "/old.h5";
  const std::int64_t tensors = strip_checksums(dir_ + "/new/checkpoints/step_00000002.h5", old, deck("new", 2).model);
  const TrainSummary a = run_training(deck("new", 3, {"checkpoint.resume=latest"}), quiet_, MPI_COMM_WORLD);
  ::testing::internal::CaptureStderr();
  const TrainSummary b = run_training(deck("old", 3, {"checkpoint.resume=" + old}), quiet_, MPI_COMM_WORLD);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(b.first_step, 2);
  EXPECT_EQ(a.final_loss, b.final_loss);
  EXPECT_NE(err.find("warning: " + old + ": " + std::to_string(tensors) + " tensor(s) carry no checksum"),
            std::string::npos)
      << err;
}

TEST_F(Training, MetricsHaveTheDocumentedFieldsAndMemoryMatchesTheEstimate) {
  const Deck d = deck("metrics", 2, {"output.peak_tflops=1.0"});
  run_training(d, quiet_, MPI_COMM_WORLD);
  const auto lines = metric_lines(dir_ + "/metrics/metrics.jsonl");
  ASSERT_EQ(lines.size(), 2u);
  for (const char* field : {"\"step\": 2", "\"loss\": ", "\"lr\": ", "\"grad_norm\": ", "\"step_ms\": ",
                            "\"tokens_per_s\": ", "\"tflops_per_rank\": ", "\"mfu\": ", "\"mem_peak_bytes\": {",
                            "\"mem_peak_by_category\": {"}) {
    EXPECT_NE(lines[1].find(field), std::string::npos) << field << " in " << lines[1];
  }
  // The tracked peak equals the analytic estimate byte for byte.
  const MemoryEstimate e = estimate_memory(d);
  const std::string space = e.bytes.begin()->first;
  const std::string peak = "\"mem_peak_bytes\": {\"" + space + "\": " + std::to_string(e.total(space)) + "}";
  EXPECT_NE(lines[1].find(peak), std::string::npos) << peak << " in " << lines[1];
  EXPECT_TRUE(fs::exists(dir_ + "/metrics/deck.resolved.toml"));
}

TEST_F(Training, NonFiniteLossStopsWithRunErrorOrIsSkipped) {
  const std::vector<std::string> explode = {"optimizer.lr=1e30", "optimizer.grad_clip=0", "optimizer.warmup_steps=0",
                                            "optimizer.min_lr=0"};
  try {
    run_training(deck("nan", 4, explode), quiet_, MPI_COMM_WORLD);
    FAIL() << "expected a RunError";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find("is not finite"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("step "), std::string::npos) << e.what();
  }
  auto sets = explode;
  sets.push_back("train.skip_nonfinite=true");
  const TrainSummary s = run_training(deck("skip", 4, sets), quiet_, MPI_COMM_WORLD);
  EXPECT_EQ(s.last_step, 4);
}

TEST_F(Training, MemoryBudgetFailsFastNamingWhatDoesNotFit) {
  try {
    run_training(deck("budget", 2, {"memory.device_budget=16KiB"}), quiet_, MPI_COMM_WORLD);
    FAIL() << "expected an InputError";
  } catch (const InputError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("memory.device_budget = 16.00 KiB, but the run needs"), std::string::npos) << msg;
    EXPECT_NE(msg.find("activations"), std::string::npos) << msg;
    EXPECT_NE(msg.find("data.micro_batch_size"), std::string::npos) << msg;
  }
  EXPECT_FALSE(fs::exists(dir_ + "/budget/metrics.jsonl"));
}

}  // namespace
}  // namespace lamina::test
