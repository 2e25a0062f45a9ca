#include "lamina/io/metrics_writer.hpp"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

namespace fs = std::filesystem;

class Metrics : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (fs::temp_directory_path() / ("lamina_metrics_" + std::to_string(::getpid()))).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  static JsonObject line(std::int64_t step) {
    JsonObject j;
    j.add("step", step).add("loss", 1.0);
    return j;
  }
  static std::vector<std::int64_t> steps_in(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::int64_t> out;
    std::string l;
    while (std::getline(in, l)) out.push_back(std::atoll(l.c_str() + l.find("\"step\": ") + 8));
    return out;
  }
  std::string dir_;
};

TEST_F(Metrics, AResumedRunKeepsTheLinesUpToItsCheckpoint) {
  const std::string p = dir_ + "/metrics.jsonl";
  {
    MetricsWriter w(p, 0);
    for (int s = 1; s <= 5; ++s) w.write(line(s));
    w.close();
  }
  MetricsWriter w(p, 3);
  w.write(line(4));
  w.close();
  EXPECT_EQ(steps_in(p), (std::vector<std::int64_t>{1, 2, 3, 4}));
  MetricsWriter fresh(p, 0);
  fresh.close();
  EXPECT_TRUE(steps_in(p).empty());
}

TEST_F(Metrics, ALineLostToAFullDiskIsARunErrorNamingTheFile) {
  const std::string p = dir_ + "/metrics.jsonl";
  fs::create_symlink("/dev/full", p);  // every write fails with ENOSPC
  MetricsWriter w(p, 0);
  try {
    w.write(line(1));
    FAIL() << "the write to a full disk succeeded";
  } catch (const RunError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot write " + p + ": No space left on device");
  }
}

}  // namespace
}  // namespace lamina::test
