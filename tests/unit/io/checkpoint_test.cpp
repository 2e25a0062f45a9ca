#include "lamina/io/checkpoint.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;

class CheckpointFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lamina_ckpt_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "(no error)";
  }
  std::string dir_;
};

CheckpointMeta meta_at(std::int64_t step) {
  CheckpointMeta m;
  m.step = step;
  m.samples_consumed = 8 * step;
  m.optimizer_step = step;
  m.seed = 99;
  m.deck = "[model]\nlayers = 1\n";
  m.layout = "dp=1 tp=1 pp=1 zero=0";
  m.model = "layers=1";
  return m;
}

TEST_F(CheckpointFiles, RoundTripKeepsTensorsAndMetadataExactly) {
  std::vector<float> a(6), b(5);
  for (int i = 0; i < 6; ++i) a[i] = 0.1f * i - 0.25f;
  for (int i = 0; i < 5; ++i) b[i] = 1e-30f * i;
  std::vector<TensorSlab> slabs = {{"model/a", {2, 3}, {0, 0}, {2, 3}, a.data()},
                                   {"optimizer/exp_avg/b", {5}, {0}, {5}, b.data()}};
  const std::string path = write_checkpoint(dir_, meta_at(12), slabs, 3, MPI_COMM_WORLD);
  EXPECT_EQ(path, dir_ + "/step_00000012.h5");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(resolve_checkpoint("latest", dir_), path);

  const CheckpointMeta m = read_checkpoint_meta(path, MPI_COMM_WORLD);
  EXPECT_EQ(m.step, 12);
  EXPECT_EQ(m.samples_consumed, 96);
  EXPECT_EQ(m.optimizer_step, 12);
  EXPECT_EQ(m.seed, 99u);
  EXPECT_EQ(m.deck, "[model]\nlayers = 1\n");
  EXPECT_EQ(m.layout, "dp=1 tp=1 pp=1 zero=0");

  std::vector<float> a2(6, -1), b2(5, -1);
  std::vector<TensorSlab> read = {{"model/a", {2, 3}, {0, 0}, {2, 3}, a2.data()},
                                  {"optimizer/exp_avg/b", {5}, {0}, {5}, b2.data()}};
  read_checkpoint_tensors(path, read, MPI_COMM_WORLD);
  EXPECT_EQ(a2, a);
  EXPECT_EQ(b2, b);

  // A hyperslab: the second row only.
  std::vector<float> row(3);
  read_checkpoint_tensors(path, {{"model/a", {2, 3}, {1, 0}, {1, 3}, row.data()}}, MPI_COMM_WORLD);
  EXPECT_EQ(row, (std::vector<float>{a[3], a[4], a[5]}));
}

TEST_F(CheckpointFiles, KeepsOnlyTheNewestAndLatestPointsAtTheLast) {
  std::vector<float> a(4, 1.0f);
  std::vector<TensorSlab> slabs = {{"model/a", {4}, {0}, {4}, a.data()}};
  for (std::int64_t step : {10, 20, 30, 40}) write_checkpoint(dir_, meta_at(step), slabs, 2, MPI_COMM_WORLD);
  const auto files = list_checkpoints(dir_);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], dir_ + "/step_00000030.h5");
  EXPECT_EQ(files[1], dir_ + "/step_00000040.h5");
  EXPECT_EQ(resolve_checkpoint("latest", dir_), dir_ + "/step_00000040.h5");
}

TEST_F(CheckpointFiles, ShapeMismatchMissingTensorAndTruncationAreInputErrors) {
  std::vector<float> a(6, 2.0f);
  const std::string path =
      write_checkpoint(dir_, meta_at(1), {{"model/a", {2, 3}, {0, 0}, {2, 3}, a.data()}}, 1, MPI_COMM_WORLD);
  std::vector<float> out(6);
  EXPECT_NE(error_of([&] {
              read_checkpoint_tensors(path, {{"model/a", {3, 2}, {0, 0}, {3, 2}, out.data()}}, MPI_COMM_WORLD);
            }).find("tensor 'model/a' has shape (2, 3), the model needs (3, 2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              read_checkpoint_tensors(path, {{"model/b", {6}, {0}, {6}, out.data()}}, MPI_COMM_WORLD);
            }).find("dataset 'model/b' is missing"),
            std::string::npos);
  // Truncate a copy to half its size.
  const std::string cut = dir_ + "/cut.h5";
  fs::copy_file(path, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  const std::string msg = error_of([&] {
    read_checkpoint_meta(cut, MPI_COMM_WORLD);
    read_checkpoint_tensors(cut, {{"model/a", {2, 3}, {0, 0}, {2, 3}, out.data()}}, MPI_COMM_WORLD);
  });
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
  EXPECT_NE(msg.find("(no error)"), 0u) << msg;
  // Not a checkpoint at all.
  const std::string junk = dir_ + "/junk.h5";
  std::ofstream(junk) << "junk";
  EXPECT_NE(error_of([&] { read_checkpoint_meta(junk, MPI_COMM_WORLD); }).find("not an HDF5 file"), std::string::npos);
  EXPECT_NE(error_of([&] { resolve_checkpoint("latest", dir_ + "/empty"); }).find("no checkpoint was completed"),
            std::string::npos);
}

}  // namespace
}  // namespace lamina::test
