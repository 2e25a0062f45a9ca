#pragma once
// A read-only memory map of a whole file (POSIX). Datasets are mapped, not read, so a
// run touches only the samples it uses and the page cache is shared between ranks.
#include <cstddef>
#include <cstdint>
#include <string>

namespace lamina {

class MappedFile {
 public:
  MappedFile() = default;
  explicit MappedFile(const std::string& path);  // throws InputError
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  ~MappedFile();

  const std::uint8_t* data() const { return data_; }
  std::int64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::int64_t size_ = 0;
};

}  // namespace lamina
