#include "lamina/io/checkpoint.hpp"

#include <gtest/gtest.h>

#include <limits>
#include <hdf5.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "lamina/core/error.hpp"
#include "io/file_damage.hpp"

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
  return {name, shape, {h5::Hyperslab{std::vector<std::int64_t>(shape.size(), 0), shape, {}}}, shape, data};
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
  r.read({"model/a", {2, 3}, {h5::Hyperslab{{1, 0}, {1, 3}, {}}}, {1, 3}, row.data()});
  EXPECT_EQ(row, (std::vector<float>{a[3], a[4], a[5]}));
}

// A rank that writes some of its local array only (the first copy of a piece other ranks
// also hold is written by that copy): each piece says where it sits locally.
TEST_F(CheckpointFiles, PiecesWrittenFromWhereTheySitInTheLocalArray) {
  // Local (2, 3): columns 0 and 2 are this rank's, column 1 another rank's to write.
  std::vector<float> local = {1, -7, 2, 3, -7, 4};
  const std::string path = write_one(
      dir_, 1,
      {{"model/a", {2, 4}, {h5::Hyperslab{{0, 1}, {2, 1}, {0, 0}}, h5::Hyperslab{{0, 3}, {2, 1}, {0, 2}}}, {2, 3},
        local.data()}},
      1);
  CheckpointReader r(path, MPI_COMM_WORLD);
  std::vector<float> all(8, -1);
  r.read(whole("model/a", {2, 4}, all.data()));
  EXPECT_EQ(all, (std::vector<float>{0, 1, 0, 2, 0, 3, 0, 4}));  // never written: HDF5's fill value
}

// GPT-2 models keep the signature their checkpoints always had; any other block adds its
// parts, and the signature reads back into the same model.
TEST(ModelSignature, NamesTheBlocksPartsBeyondGpt2sAndReadsBack) {
  ModelConfig gpt2;
  gpt2.layers = 2;
  gpt2.d_model = 64;
  gpt2.heads = 4;
  gpt2.seq_len = 32;
  gpt2.vocab_size = 256;
  EXPECT_EQ(model_signature(gpt2), "layers=2 d_model=64 heads=4 seq_len=32 vocab_size=256");
  gpt2.kv_heads = 4;
  gpt2.ffn_hidden = 256;
  EXPECT_EQ(model_signature(gpt2), "layers=2 d_model=64 heads=4 seq_len=32 vocab_size=256");

  ModelConfig llama = gpt2;
  llama.kv_heads = 2;
  llama.ffn_hidden = 176;
  llama.parts.norm = NormKind::rmsnorm;
  llama.parts.norm_eps = 1e-6;
  llama.parts.position = PositionKind::rotary;
  llama.parts.rope_theta = 500000;
  llama.parts.rope_scaling.factor = 32;
  llama.parts.mlp = MlpKind::swiglu;
  llama.parts.bias = false;
  const std::string s = model_signature(llama);
  EXPECT_EQ(s, "layers=2 d_model=64 heads=4 seq_len=32 vocab_size=256 kv_heads=2 ffn_hidden=176 norm=rmsnorm "
               "norm_eps=1e-06 position=rotary rope_theta=500000 rope_scaling=32 rope_low_freq_factor=1 "
               "rope_high_freq_factor=4 rope_original_context=8192 mlp=swiglu");
  ModelConfig back;
  ASSERT_TRUE(parse_model_signature(s, back));
  EXPECT_EQ(model_signature(back), s);
  EXPECT_FALSE(back.parts.bias);
  ModelConfig plain;
  ASSERT_TRUE(parse_model_signature(model_signature(gpt2), plain));
  EXPECT_TRUE(gpt2_block(plain));
  for (const char* bad : {" norm=batchnorm", " kv_heads=2.5", " rope_theta=-1", " colour=blue", " mlp"}) {
    EXPECT_FALSE(parse_model_signature(model_signature(gpt2) + bad, back)) << bad;
  }
}

TEST_F(CheckpointFiles, PiecesOfSplitTensorsLandInGlobalPlace) {
  // A (2, 6) tensor with element (r, c) = 10 r + c whose columns are three blocks
  // [q | k | v] of two, each split over two tensor-parallel ranks: rank 0 holds global
  // columns 0, 2, 4 as a local (2, 3) array. Written alone, the rest keeps the fill value.
  const std::vector<float> local = {0, 2, 4, 10, 12, 14};
  const std::vector<h5::Hyperslab> pieces = {{{0, 0}, {2, 1}, {}}, {{0, 2}, {2, 1}, {}}, {{0, 4}, {2, 1}, {}}};
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

// Only names the writer makes are checkpoints: a user's files beside them are neither
// counted by retention nor deleted by it, and steps past 10^8 (a ninth digit) sort by step.
TEST_F(CheckpointFiles, RetentionTouchesOnlyTheNamesTheWriterMakes) {
  fs::create_directories(dir_);
  const std::vector<std::string> users = {"step_00000003_best.h5", "step_notes.h5", "step_3.h5", "step_00000003.h5.bak",
                                          "step_+0000003.h5"};
  for (const auto& n : users) std::ofstream(dir_ + "/" + n) << "x";
  std::vector<float> a(4, 1.0f);
  for (std::int64_t step : {5, 6, 7}) write_one(dir_, step, {whole("model/a", {4}, a.data())}, 1);
  for (const auto& n : users) EXPECT_TRUE(fs::exists(dir_ + "/" + n)) << n;
  EXPECT_EQ(list_checkpoints(dir_), std::vector<std::string>{dir_ + "/step_00000007.h5"});
  EXPECT_EQ(checkpoint_step("step_00000007.h5"), 7);
  EXPECT_EQ(checkpoint_step("step_123456789.h5"), 123456789);
  EXPECT_EQ(checkpoint_step("step_00000007.h5.tmp", ".tmp"), 7);
  for (const auto& n : users) EXPECT_EQ(checkpoint_step(n), -1) << n;
  EXPECT_EQ(checkpoint_step("step_0123456789.h5"), -1);  // not how the writer pads
  write_one(dir_, 123456789, {whole("model/a", {4}, a.data())}, 2);
  EXPECT_EQ(list_checkpoints(dir_),
            (std::vector<std::string>{dir_ + "/step_00000007.h5", dir_ + "/step_123456789.h5"}));
}

// Resuming an earlier step leaves checkpoints of later ones in the directory: retention
// counts the steps up to the one it wrote and never deletes a later one.
TEST_F(CheckpointFiles, RetentionNeverDeletesTheCheckpointJustWrittenNorLaterOnes) {
  std::vector<float> a(4, 1.0f);
  for (std::int64_t step : {1, 2, 3, 4, 5, 6}) write_one(dir_, step, {whole("model/a", {4}, a.data())}, 10);
  EXPECT_EQ(write_one(dir_, 4, {whole("model/a", {4}, a.data())}, 1), dir_ + "/step_00000004.h5");
  EXPECT_EQ(list_checkpoints(dir_), (std::vector<std::string>{dir_ + "/step_00000004.h5", dir_ + "/step_00000005.h5",
                                                              dir_ + "/step_00000006.h5"}));
  EXPECT_EQ(resolve_checkpoint("latest", dir_), dir_ + "/step_00000004.h5");
}

// An unfinished write named in checkpoint.resume is refused, and left where it is.
TEST_F(CheckpointFiles, ResumingFromAnUnfinishedWriteIsRefused) {
  fs::create_directories(dir_);
  const std::string tmp = dir_ + "/step_00000006.h5.tmp";
  std::ofstream(tmp) << "x";
  try {
    resolve_checkpoint(tmp, dir_);
    ADD_FAILURE() << "no error";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(tmp + " is an unfinished write"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(fs::exists(tmp));
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

TEST_F(CheckpointFiles, EveryTensorCarriesAChecksumThatCatchesAChangedByte) {
  std::vector<float> a(4096), b(64, 0.5f);
  for (std::size_t i = 0; i < a.size(); ++i) a[i] = 0.001f * static_cast<float>(i) - 1.0f;
  const std::string path =
      write_one(dir_, 3, {whole("model/a", {64, 64}, a.data()), whole("model/b", {64}, b.data())}, 1);
  {
    CheckpointReader r(path, MPI_COMM_WORLD);
    std::vector<float> out(4096);
    r.read(whole("model/a", {64, 64}, out.data()));
    EXPECT_EQ(r.unchecked(), 0);
  }
  ASSERT_TRUE(flip_byte_in(path, a.data() + 1000, 8));
  CheckpointReader r(path, MPI_COMM_WORLD);
  std::vector<float> out(4096);
  EXPECT_EQ(error_of([&] { r.read(whole("model/a", {64, 64}, out.data())); }),
            path + ": dataset 'model/a' does not match its checksum: the file was damaged after it was written (a "
                   "disk or transfer error)");
  r.read(whole("model/b", {64}, out.data()));  // the damage is in model/a only
  EXPECT_EQ(out[63], 0.5f);
}

TEST_F(CheckpointFiles, TensorsThatAreNotFiniteAreInputErrors) {
  std::vector<float> a(6, 1.0f), b(4, 2.0f);
  a[4] = std::nanf("");
  b[0] = -INFINITY;
  b[3] = INFINITY;
  const std::string path = write_one(dir_, 1, {whole("model/a", {2, 3}, a.data()), whole("model/b", {4}, b.data())}, 1);
  CheckpointReader r(path, MPI_COMM_WORLD);
  std::vector<float> out(6);
  EXPECT_EQ(error_of([&] { r.read(whole("model/a", {2, 3}, out.data())); }),
            path + ": tensor 'model/a' holds 1 value(s) that are not finite (NaN or infinite); use another checkpoint");
  EXPECT_NE(error_of([&] { r.read(whole("model/b", {4}, out.data())); }).find("'model/b' holds 2 value(s)"),
            std::string::npos);
  // A rank that reads no piece has nothing to check.
  r.read({"model/a", {2, 3}, {}, {2, 3}, nullptr});
}

TEST_F(CheckpointFiles, AttributesOutOfRangeAreInputErrors) {
  std::vector<float> a(4, 1.0f);
  const auto with = [&](std::int64_t step, std::int64_t samples, std::int64_t optimizer_step) {
    fs::remove_all(dir_);
    CheckpointWriter w(dir_, 1, MPI_COMM_WORLD);
    w.write(whole("model/a", {4}, a.data()));
    CheckpointMeta m = meta_at(1);
    m.step = step;
    m.samples_consumed = samples;
    m.optimizer_step = optimizer_step;
    const std::string path = w.commit(m, 1);
    return error_of([&] { CheckpointReader r(path, MPI_COMM_WORLD); });
  };
  EXPECT_NE(with(-5, 0, 0).find("attribute 'step' = -5 is out of range: must be >= 0"), std::string::npos);
  EXPECT_NE(with(5, -1, 5).find("attribute 'samples_consumed' = -1 is out of range"), std::string::npos);
  EXPECT_NE(with(5, 40, 6).find("attribute 'optimizer_step' = 6 is out of range: must be >= 0 and <= step"),
            std::string::npos);
  EXPECT_EQ(with(5, 40, 4), "(no error)");  // a skipped step
  // Edited to near the largest int64 (checksums intact): refused before a step overflows it.
  const std::int64_t huge = std::numeric_limits<std::int64_t>::max() - 1;
  EXPECT_NE(with(huge, 40, 4).find("attribute 'step' = 9223372036854775806 is out of range: must be >= 0 and <= 2^40"),
            std::string::npos);
  EXPECT_NE(with(5, huge, 4).find("attribute 'samples_consumed' = 9223372036854775806 is out of range: must be >= 0 "
                                  "and <= 2^62"),
            std::string::npos);
}

// What lamina wrote before checksums: contiguous datasets without filters.
TEST_F(CheckpointFiles, CheckpointsWithoutChecksumsStillLoad) {
  fs::create_directories(dir_);
  const std::string path = dir_ + "/old.h5";
  const std::vector<float> a = {1, 2, 3, 4};
  {
    h5::Id f = h5::create(path, MPI_COMM_WORLD);
    const hsize_t n = 4;
    h5::Id space(H5Screate_simple(1, &n, nullptr), H5Sclose);
    h5::Id lcpl(H5Pcreate(H5P_LINK_CREATE), H5Pclose);
    H5Pset_create_intermediate_group(lcpl, 1);
    h5::Id ds(H5Dcreate2(f, "model/a", H5T_IEEE_F32LE, space, lcpl, H5P_DEFAULT, H5P_DEFAULT), H5Dclose);
    ASSERT_GE(H5Dwrite(ds, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, a.data()), 0);
    const CheckpointMeta m = meta_at(2);
    h5::set_attr(f, "format", std::string("lamina-checkpoint-1"));
    h5::set_attr(f, "step", m.step);
    h5::set_attr(f, "samples_consumed", m.samples_consumed);
    h5::set_attr(f, "optimizer_step", m.optimizer_step);
    h5::set_attr(f, "seed", static_cast<std::int64_t>(m.seed));
    for (const char* s : {"deck", "layout", "model"}) h5::set_attr(f, s, std::string("x"));
  }
  CheckpointReader r(path, MPI_COMM_WORLD);
  std::vector<float> out(4);
  r.read(whole("model/a", {4}, out.data()));
  EXPECT_EQ(out, a);
  EXPECT_EQ(r.unchecked(), 1);
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
