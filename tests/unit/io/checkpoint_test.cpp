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

// A whole tensor as one rank's piece.
TensorSlab whole(const std::string& name, std::vector<std::int64_t> shape, float* data) {
  return {name, shape, {h5::Hyperslab{std::vector<std::int64_t>(shape.size(), 0), shape}}, shape, data};
}

std::string write_one(const std::string& dir, std::int64_t step, std::vector<TensorSlab> slabs, std::int64_t keep) {
  CheckpointWriter w(dir, step, MPI_COMM_WORLD);
  for (const auto& s : slabs) w.write(s);
  return w.commit(meta_at(step), keep);
}

TEST_F(CheckpointFiles, RoundTripKeepsTensorsAndMetadataExactly) {
  std::vector<float> a(6), b(5);
  for (int i = 0; i < 6; ++i) a[i] = 0.1f * i - 0.25f;
  for (int i = 0; i < 5; ++i) b[i] = 1e-30f * i;
  const std::string path =
      write_one(dir_, 12, {whole("model/a", {2, 3}, a.data()), whole("optimizer/exp_avg/b", {5}, b.data())}, 3);
  EXPECT_EQ(path, dir_ + "/step_00000012.h5");
  EXPECT_FALSE(fs::exists(path + ".tmp"));
  EXPECT_EQ(resolve_checkpoint("latest", dir_), path);

  CheckpointReader r(path, MPI_COMM_WORLD);
  const CheckpointMeta& m = r.meta();
  EXPECT_EQ(m.step, 12);
  EXPECT_EQ(m.samples_consumed, 96);
  EXPECT_EQ(m.optimizer_step, 12);
  EXPECT_EQ(m.seed, 99u);
  EXPECT_EQ(m.deck, "[model]\nlayers = 1\n");
  EXPECT_EQ(m.layout, "dp=1 tp=1 pp=1 zero=0");

  std::vector<float> a2(6, -1), b2(5, -1);
  r.read(whole("model/a", {2, 3}, a2.data()));
  r.read(whole("optimizer/exp_avg/b", {5}, b2.data()));
  EXPECT_EQ(a2, a);
  EXPECT_EQ(b2, b);
  // A piece: the second row only.
  std::vector<float> row(3);
  r.read({"model/a", {2, 3}, {h5::Hyperslab{{1, 0}, {1, 3}}}, {1, 3}, row.data()});
  EXPECT_EQ(row, (std::vector<float>{a[3], a[4], a[5]}));
}

TEST_F(CheckpointFiles, PiecesOfSplitTensorsLandInGlobalPlace) {
  // A (2, 6) tensor with element (r, c) = 10 r + c whose columns are three blocks
  // [q | k | v] of two, each split over two tensor-parallel ranks: rank 0 holds global
  // columns 0, 2, 4 as a local (2, 3) array. Written alone, the rest keeps the fill value.
  const std::vector<float> local = {0, 2, 4, 10, 12, 14};
  const std::vector<h5::Hyperslab> pieces = {{{0, 0}, {2, 1}}, {{0, 2}, {2, 1}}, {{0, 4}, {2, 1}}};
  {
    CheckpointWriter w(dir_, 1, MPI_COMM_WORLD);
    w.write({"model/qkv", {2, 6}, pieces, {2, 3}, const_cast<float*>(local.data())});
    w.commit(meta_at(1), 1);
  }
  CheckpointReader r(dir_ + "/step_00000001.h5", MPI_COMM_WORLD);
  std::vector<float> full(12, -1);
  r.read(whole("model/qkv", {2, 6}, full.data()));
  EXPECT_EQ(full, (std::vector<float>{0, 0, 2, 0, 4, 0, 10, 0, 12, 0, 14, 0}));
  std::vector<float> back(6, -1);
  r.read({"model/qkv", {2, 6}, pieces, {2, 3}, back.data()});
  EXPECT_EQ(back, local);
}

TEST_F(CheckpointFiles, KeepsOnlyTheNewestAndLatestPointsAtTheLast) {
  std::vector<float> a(4, 1.0f);
  for (std::int64_t step : {10, 20, 30, 40}) write_one(dir_, step, {whole("model/a", {4}, a.data())}, 2);
  const auto files = list_checkpoints(dir_);
  ASSERT_EQ(files.size(), 2u);
  EXPECT_EQ(files[0], dir_ + "/step_00000030.h5");
  EXPECT_EQ(files[1], dir_ + "/step_00000040.h5");
  EXPECT_EQ(resolve_checkpoint("latest", dir_), dir_ + "/step_00000040.h5");
}

TEST_F(CheckpointFiles, ShapeMismatchMissingTensorAndTruncationAreInputErrors) {
  std::vector<float> a(6, 2.0f);
  const std::string path = write_one(dir_, 1, {whole("model/a", {2, 3}, a.data())}, 1);
  std::vector<float> out(6);
  CheckpointReader r(path, MPI_COMM_WORLD);
  EXPECT_NE(error_of([&] { r.read(whole("model/a", {3, 2}, out.data())); })
                .find("tensor 'model/a' has shape (2, 3), the model needs (3, 2)"),
            std::string::npos);
  EXPECT_NE(error_of([&] { r.read(whole("model/b", {6}, out.data())); }).find("dataset 'model/b' is missing"),
            std::string::npos);
  // Truncate a copy to half its size.
  const std::string cut = dir_ + "/cut.h5";
  fs::copy_file(path, cut);
  fs::resize_file(cut, fs::file_size(cut) / 2);
  const std::string msg = error_of([&] {
    CheckpointReader c(cut, MPI_COMM_WORLD);
    c.read(whole("model/a", {2, 3}, out.data()));
  });
  EXPECT_NE(msg.find(cut), std::string::npos) << msg;
  // Not a checkpoint at all.
  const std::string junk = dir_ + "/junk.h5";
  std::ofstream(junk) << "junk";
  EXPECT_NE(error_of([&] { CheckpointReader j(junk, MPI_COMM_WORLD); }).find("not an HDF5 file"), std::string::npos);
  EXPECT_NE(error_of([&] { resolve_checkpoint("latest", dir_ + "/empty"); }).find("no checkpoint was completed"),
            std::string::npos);
}

TEST_F(CheckpointFiles, UnfinishedWritesAreRemovedAndNothingElse) {
  fs::create_directories(dir_);
  const std::vector<std::string> stale = {"latest.tmp", "step_00000012.h5.tmp"};
  const std::vector<std::string> kept = {"latest", "step_00000011.h5", "step_x.h5.tmp", "notes.tmp",
                                         "step_00000012.h5.tmp.bak"};
  for (const auto& n : stale) std::ofstream(dir_ + "/" + n) << "x";
  for (const auto& n : kept) std::ofstream(dir_ + "/" + n) << "x";
  fs::create_directories(dir_ + "/step_00000013.h5.tmp");  // not a file
  EXPECT_EQ(remove_partial_checkpoints(dir_),
            (std::vector<std::string>{dir_ + "/latest.tmp", dir_ + "/step_00000012.h5.tmp"}));
  for (const auto& n : stale) EXPECT_FALSE(fs::exists(dir_ + "/" + n)) << n;
  for (const auto& n : kept) EXPECT_TRUE(fs::exists(dir_ + "/" + n)) << n;
  EXPECT_TRUE(fs::is_directory(dir_ + "/step_00000013.h5.tmp"));
  EXPECT_TRUE(remove_partial_checkpoints(dir_ + "/missing").empty());
}

}  // namespace
}  // namespace lamina::test
