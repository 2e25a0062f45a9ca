#include "lamina/io/token_dataset.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "lamina/core/error.hpp"
#include "lamina/io/mapped_file.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;

class DataFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("lamina_data_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string path(const std::string& name) const { return (dir_ / name).string(); }
  void write(const std::string& name, const std::vector<char>& bytes) const {
    std::ofstream(path(name), std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
  template <class T>
  static void put(std::vector<char>& out, T v) {
    const char* p = reinterpret_cast<const char*>(&v);
    out.insert(out.end(), p, p + sizeof(T));
  }
  // An llm.c shard: 256 int32 header, then tokens.
  std::vector<char> llmc(const std::vector<std::uint16_t>& tokens, std::int32_t magic = 20240520) const {
    std::vector<char> b;
    std::int32_t header[256] = {};
    header[0] = magic;
    header[1] = 1;
    header[2] = static_cast<std::int32_t>(tokens.size());
    for (auto h : header) put(b, h);
    for (auto t : tokens) put(b, t);
    return b;
  }
  // A Megatron dataset of uint16 documents: writes P.bin and P.idx.
  void megatron(const std::string& prefix, const std::vector<std::vector<std::uint16_t>>& docs) const {
    std::vector<char> bin, idx;
    for (const auto& d : docs)
      for (auto t : d) put(bin, t);
    write(prefix + ".bin", bin);
    const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
    idx.insert(idx.end(), magic, magic + 9);
    put<std::uint64_t>(idx, 1);
    put<std::uint8_t>(idx, 8);  // uint16
    put<std::uint64_t>(idx, docs.size());
    put<std::uint64_t>(idx, docs.size() + 1);
    for (const auto& d : docs) put<std::int32_t>(idx, static_cast<std::int32_t>(d.size()));
    std::int64_t ptr = 0;
    for (const auto& d : docs) {
      put<std::int64_t>(idx, ptr);
      ptr += 2 * static_cast<std::int64_t>(d.size());
    }
    for (std::size_t i = 0; i <= docs.size(); ++i) put<std::int64_t>(idx, static_cast<std::int64_t>(i));
    write(prefix + ".idx", idx);
  }
  static std::string error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const InputError& e) {
      return e.what();
    }
    return "(no error)";
  }
  fs::path dir_;
};

TEST_F(DataFiles, TextFilesAreConcatenatedBytes) {
  write("a.txt", {'a', 'b', 'c'});
  write("b.txt", {'d', 'e'});
  auto ds = open_text_dataset({path("a.txt"), path("b.txt")}, 256);
  ASSERT_EQ(ds->num_tokens(), 5);
  std::vector<std::int32_t> out(4);
  ds->read(1, 4, out.data());
  EXPECT_EQ(out, (std::vector<std::int32_t>{'b', 'c', 'd', 'e'}));
}

// A data file that shrinks under the run (rewritten, truncated): reading a window past its
// new end is a RunError naming the file, not a SIGBUS that kills the job unsaved.
TEST_F(DataFiles, AFileThatShrinksUnderTheRunIsARunErrorNamingIt) {
  write("a.txt", std::vector<char>(3 * 4096, 'x'));
  auto ds = open_text_dataset({path("a.txt")}, 256);
  std::vector<std::int32_t> out(8);
  ds->read(2 * 4096, 8, out.data());
  fs::resize_file(path("a.txt"), 4096);
  try {
    ds->read(2 * 4096, 8, out.data());
    ADD_FAILURE() << "no error";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find(path("a.txt") + ": the file now holds 4096 bytes, 12288 when the run opened it"),
              std::string::npos)
        << e.what();
  }
}

// The same when the file shrinks between the size check and the read: the read's SIGBUS
// is caught, and reads go on working afterwards.
TEST_F(DataFiles, ASigbusDuringAReadIsARunErrorNamingTheFile) {
  write("a.txt", std::vector<char>(3 * 4096, 'y'));
  const MappedFile f(path("a.txt"));
  volatile std::uint8_t last = 0;
  auto shrink_then_read = [&] {
    fs::resize_file(path("a.txt"), 4096);
    last = f.data()[2 * 4096];
  };
  try {
    f.read_checked(3 * 4096, shrink_then_read);
    ADD_FAILURE() << "no error";
  } catch (const RunError& e) {
    EXPECT_NE(std::string(e.what()).find(path("a.txt") + ": the file now holds 4096 bytes"), std::string::npos)
        << e.what();
  }
  auto first_page = [&] { last = f.data()[0]; };
  f.read_checked(4096, first_page);
  EXPECT_EQ(last, 'y');
}

TEST_F(DataFiles, LlmcShardsAreReadAcrossFiles) {
  write("s0.bin", llmc({1, 2, 3}));
  write("s1.bin", llmc({4, 5}));
  auto ds = open_llmc_dataset({path("s0.bin"), path("s1.bin")}, 50257);
  ASSERT_EQ(ds->num_tokens(), 5);
  std::vector<std::int32_t> out(5);
  ds->read(0, 5, out.data());
  EXPECT_EQ(out, (std::vector<std::int32_t>{1, 2, 3, 4, 5}));
}

TEST_F(DataFiles, MegatronDocumentsAreConcatenatedInOrder) {
  megatron("corpus", {{10, 11, 12}, {20}, {30, 31}});
  auto ds = open_megatron_dataset({path("corpus")}, 100);
  ASSERT_EQ(ds->num_tokens(), 6);
  std::vector<std::int32_t> out(6);
  ds->read(0, 6, out.data());
  EXPECT_EQ(out, (std::vector<std::int32_t>{10, 11, 12, 20, 30, 31}));
  EXPECT_NE(ds->describe().find("3 documents"), std::string::npos) << ds->describe();
}

TEST_F(DataFiles, TruncatedLlmcShardNamesFileAndOffset) {
  auto bytes = llmc({1, 2, 3, 4});
  bytes.resize(bytes.size() - 3);
  write("t.bin", bytes);
  const std::string msg = error_of([&] { open_llmc_dataset({path("t.bin")}, 100); });
  EXPECT_NE(msg.find(path("t.bin") + ": byte offset 1029"), std::string::npos) << msg;
  EXPECT_NE(msg.find("truncated"), std::string::npos) << msg;
}

TEST_F(DataFiles, LlmcHeaderErrors) {
  write("short.bin", {'x', 'y'});
  EXPECT_NE(error_of([&] { open_llmc_dataset({path("short.bin")}, 100); }).find("file ends inside the 1024-byte"),
            std::string::npos);
  write("magic.bin", llmc({1}, 12345));
  EXPECT_NE(error_of([&] { open_llmc_dataset({path("magic.bin")}, 100); }).find("byte offset 0: magic 12345"),
            std::string::npos);
}

TEST_F(DataFiles, TokenOutsideVocabularyNamesByteOffset) {
  write("v.bin", llmc({1, 2, 700, 3}));
  auto ds = open_llmc_dataset({path("v.bin")}, 512);
  std::vector<std::int32_t> out(4);
  const std::string msg = error_of([&] { ds->read(0, 4, out.data()); });
  EXPECT_NE(msg.find(path("v.bin") + ": byte offset 1028: token id 700 is outside the vocabulary [0, 512)"),
            std::string::npos)
      << msg;
}

TEST_F(DataFiles, MegatronErrors) {
  megatron("good", {{1, 2}, {3}});
  // Bad magic.
  {
    std::ifstream in(path("good.idx"), std::ios::binary);
    std::vector<char> idx((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    idx[0] = 'X';
    write("badmagic.idx", idx);
    fs::copy_file(path("good.bin"), path("badmagic.bin"));
    EXPECT_NE(error_of([&] { open_megatron_dataset({path("badmagic")}, 100); }).find("byte offset 0: not a Megatron index"),
              std::string::npos);
    // Truncated index.
    idx[0] = 'M';
    idx.resize(40);
    write("shortidx.idx", idx);
    fs::copy_file(path("good.bin"), path("shortidx.bin"));
    EXPECT_NE(error_of([&] { open_megatron_dataset({path("shortidx")}, 100); }).find("file ends inside the sequence"),
              std::string::npos);
  }
  // Truncated .bin.
  fs::copy_file(path("good.idx"), path("shortbin.idx"));
  write("shortbin.bin", {1, 0, 2});
  const std::string msg = error_of([&] { open_megatron_dataset({path("shortbin")}, 100); });
  EXPECT_NE(msg.find(path("shortbin.bin") + ": byte offset 3: the index describes 6 bytes"), std::string::npos) << msg;
  // Missing files.
  EXPECT_NE(error_of([&] { open_megatron_dataset({path("nothere")}, 100); }).find("nothere.idx: cannot open"),
            std::string::npos);
}

TEST_F(DataFiles, PathPatternsExpandInSortedOrder) {
  write("shard_1.bin", llmc({3}));
  write("shard_0.bin", llmc({1, 2}));
  const auto paths = expand_paths({path("shard_*.bin")});
  ASSERT_EQ(paths.size(), 2u);
  EXPECT_EQ(paths[0], path("shard_0.bin"));
  EXPECT_NE(error_of([&] { expand_paths({path("none_*.bin")}); }).find("no data file matches"), std::string::npos);
  // A file whose name holds pattern characters is taken as named; a pattern with '[' that
  // matches nothing says how the shell reads it.
  write("run[1].bin", {'x'});
  EXPECT_EQ(expand_paths({path("run[1].bin")}), std::vector<std::string>{path("run[1].bin")});
  EXPECT_NE(error_of([&] { expand_paths({path("run[2].bin")}); }).find("'[...]' matches one of the characters inside"),
            std::string::npos);
}

TEST_F(DataFiles, UnigramEntropy) {
  write("u.txt", {'a', 'a', 'b', 'b'});
  auto ds = open_text_dataset({path("u.txt")}, 256);
  EXPECT_NEAR(unigram_entropy(*ds, 256, 1 << 20), std::log(2.0), 1e-12);
}

TEST(SyntheticData, IsDeterministicAndInVocabulary) {
  SyntheticTokenDataset a(37, 5), b(37, 5);
  std::vector<std::int32_t> x(1000), y(1000);
  a.read(123456, 1000, x.data());
  b.read(123456, 1000, y.data());
  EXPECT_EQ(x, y);
  for (auto t : x) EXPECT_TRUE(t >= 0 && t < 37);
}

}  // namespace
}  // namespace lamina::test
