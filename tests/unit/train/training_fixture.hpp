#pragma once
// A fixture for tests that train: a scratch directory with a small text corpus, a small
// deck over it, and readers for what a run leaves behind (metrics, checkpoint tensors).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lamina/core/deck.hpp"
#include "lamina/core/log.hpp"
#include "lamina/io/hdf5_file.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/train/trainer.hpp"

namespace lamina::test {

namespace fs = std::filesystem;

class Training : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lamina_train_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    // A small text corpus with structure to learn.
    std::ofstream out(dir_ + "/corpus.txt");
    for (int i = 0; i < 400; ++i) out << "the quick brown fox " << i % 7 << " jumps over the lazy dog\n";
  }
  void TearDown() override { fs::remove_all(dir_); }

  Deck deck(const std::string& run, std::int64_t steps, std::vector<std::string> sets = {}) const {
    const std::string text = R"(
[model]
layers = 2
d_model = 32
heads = 2
seq_len = 16
[data]
format = "text"
path = ")" + dir_ + R"(/corpus.txt"
batch_size = 8
micro_batch_size = 4
[train]
steps = 6
seed = 11
[optimizer]
lr = 3e-3
warmup_steps = 2
subgroup_size = 1000
)";
    sets.push_back("train.steps=" + std::to_string(steps));
    sets.push_back("output.dir=" + dir_ + "/" + run);
    return parse_deck(text, "test.toml", sets);
  }

  static std::vector<std::string> metric_lines(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string l; std::getline(in, l);) lines.push_back(l);
    return lines;
  }
  // The loss field of a metrics line, as written (so equal text means equal bits at %.9g).
  static std::string loss_of(const std::string& line) {
    const auto a = line.find("\"loss\": ") + 8;
    return line.substr(a, line.find(',', a) - a);
  }
  static std::vector<float> dataset(const std::string& file, const std::string& name) {
    h5::Id f = h5::open_read(file, MPI_COMM_SELF);
    std::int64_t n = 1;
    for (auto d : h5::shape(f, file, name)) n *= d;
    std::vector<float> v(static_cast<std::size_t>(n));
    h5::read(f, file, name, v.data());
    return v;
  }

  // Every parameter and both Adam moments of two checkpoints, bit for bit.
  static void expect_identical_checkpoints(const std::string& a, const std::string& b, const ModelConfig& model) {
    const ParamLayout layout = ParamLayout::of(model);
    for (const auto& l : layout.layers()) {
      for (const auto& t : l.tensors) {
        for (const char* prefix : {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"}) {
          EXPECT_EQ(dataset(a, prefix + t.name), dataset(b, prefix + t.name)) << prefix << t.name << " in " << b;
        }
      }
    }
  }

  // Trains 3 steps with `sets` (and `common`) and compares the final checkpoint bit for bit
  // with a baseline's that trained with `common` alone (once per test).
  void expect_like_baseline(const std::string& name, std::vector<std::string> sets,
                            const std::vector<std::string>& common = {}) {
    if (!baseline_done_) {
      run_training(deck("baseline", 3, common), quiet_, MPI_COMM_WORLD);
      baseline_done_ = true;
    }
    sets.insert(sets.end(), common.begin(), common.end());
    const Deck d = deck(name, 3, sets);
    run_training(d, quiet_, MPI_COMM_WORLD);
    expect_identical_checkpoints(dir_ + "/baseline/checkpoints/step_00000003.h5",
                                 dir_ + "/" + name + "/checkpoints/step_00000003.h5", d.model);
  }

  Log quiet_{0, Log::Level::warn};
  std::string dir_;
  bool baseline_done_ = false;
};

}  // namespace lamina::test
