#pragma once
// Running the `lamina` binary from a test: its exit code and output, in a scratch
// directory that each test gets fresh.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

namespace lamina::test {

struct Result {
  int code = -1;
  std::string out;  // what the command sends to the pipe
};

// Runs a shell command line; kLamina is the path of the binary under test.
inline Result shell(const std::string& command) {
  Result r;
  FILE* p = ::popen(command.c_str(), "r");
  char buf[4096];
  while (p != nullptr && std::fgets(buf, sizeof buf, p) != nullptr) r.out += buf;
  const int status = p == nullptr ? -1 : ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

const std::string kLamina = LAMINA_BINARY;

// `lamina <args>`, stdout and stderr together.
inline Result run(const std::string& args) { return shell(kLamina + " " + args + " 2>&1"); }

class Cli : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = (std::filesystem::temp_directory_path() / ("lamina_cli_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  std::string file(const std::string& name, const std::string& text) const {
    const std::string p = dir_ + "/" + name;
    std::ofstream(p) << text;
    return p;
  }
  std::string dir_;
};

}  // namespace lamina::test
