#pragma once
// Files a run writes besides checkpoints (metrics.jsonl, deck.resolved.toml, `latest`).
// Every write, flush and close is checked: a full disk or a failing file system is a
// RunError naming the file and the system's reason ("cannot write out/metrics.jsonl: No
// space left on device"), never output lost while the run goes on and exits 0.
#include <cstdio>
#include <functional>
#include <memory>
#include <string>

namespace lamina {

class OutputFile {
 public:
  OutputFile() = default;
  // Truncates the file, or appends to it.
  OutputFile(const std::string& path, bool append);
  // Handed to the operating system before it returns (flushed), so the file can be
  // tailed and a crash loses nothing written.
  void write(const std::string& text) { write(text.data(), text.size()); }
  void write(const void* data, std::size_t bytes);
  // Closes and checks the close; the destructor closes without checking.
  void close();
  bool is_open() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }

 private:
  struct Closer {
    void operator()(std::FILE* f) const { std::fclose(f); }
  };
  [[noreturn]] void fail() const;
  std::string path_;
  std::unique_ptr<std::FILE, Closer> file_;
};

// Writes `text` as the whole content of `path`, checked as above.
void write_text_file(const std::string& path, const std::string& text);

// Writes `path` whole or not at all: `fill` writes `path`.tmp, which is then closed and
// renamed over `path`; a failure (or an exception from `fill`) removes the .tmp.
void write_file_replacing(const std::string& path, const std::function<void(OutputFile&)>& fill);

}  // namespace lamina
