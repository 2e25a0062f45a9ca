#include "lamina/io/output_file.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>

#include "lamina/core/error.hpp"

namespace lamina {

OutputFile::OutputFile(const std::string& path, bool append) : path_(path) {
  errno = 0;
  file_.reset(std::fopen(path.c_str(), append ? "a" : "w"));
  if (file_ == nullptr) fail();
}

// errno is cleared before each call, so a failure reports its own reason or none.
void OutputFile::fail() const {
  throw RunError("cannot write " + path_ + ": " + (errno != 0 ? std::strerror(errno) : "write error"));
}

void OutputFile::write(const void* data, std::size_t bytes) {
  errno = 0;
  if (std::fwrite(data, 1, bytes, file_.get()) != bytes || std::fflush(file_.get()) != 0) fail();
}

void OutputFile::close() {
  if (file_ == nullptr) return;
  errno = 0;
  if (std::fclose(file_.release()) != 0) fail();
}

void write_text_file(const std::string& path, const std::string& text) {
  OutputFile f(path, false);
  f.write(text);
  f.close();
}

void write_file_replacing(const std::string& path, const std::function<void(OutputFile&)>& fill) {
  const std::string tmp = path + ".tmp";
  try {
    OutputFile f(tmp, false);
    fill(f);
    f.close();
  } catch (...) {
    std::remove(tmp.c_str());
    throw;
  }
  errno = 0;
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    throw RunError("cannot write " + path + ": renaming " + tmp + " failed: " + std::strerror(err));
  }
}

}  // namespace lamina
