#include "lamina/io/output_file.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;

class OutputFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lamina_out_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  // A path whose writes fail with ENOSPC, as on a full disk.
  std::string full_disk(const std::string& name) const {
    const std::string p = dir_ + "/" + name;
    fs::create_symlink("/dev/full", p);
    return p;
  }
  static std::string run_error_of(const std::function<void()>& f) {
    try {
      f();
    } catch (const RunError& e) {
      return e.what();
    }
    return "(no error)";
  }
  static std::string read(const std::string& path) {
    std::ifstream in(path);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  std::string dir_;
};

TEST_F(OutputFiles, WritesTruncatesAndAppends) {
  const std::string p = dir_ + "/a.txt";
  write_text_file(p, "old\n");
  OutputFile f(p, false);
  f.write("one\n");
  EXPECT_EQ(read(p), "one\n");  // flushed as written
  f.close();
  OutputFile g(p, true);
  g.write("two\n");
  g.close();
  EXPECT_EQ(read(p), "one\ntwo\n");
}

TEST_F(OutputFiles, AFullDiskIsARunErrorNamingTheFileAndTheReason) {
  const std::string p = full_disk("metrics.jsonl");
  OutputFile f(p, false);
  EXPECT_EQ(run_error_of([&] { f.write("{\"step\": 1}\n"); }), "cannot write " + p + ": No space left on device");
  EXPECT_EQ(run_error_of([&] { write_text_file(p, "x"); }), "cannot write " + p + ": No space left on device");
  EXPECT_EQ(run_error_of([&] { OutputFile(dir_ + "/missing/f", false); }),
            "cannot write " + dir_ + "/missing/f: No such file or directory");
}

}  // namespace
}  // namespace lamina::test
