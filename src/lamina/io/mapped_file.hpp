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

  // Calls read(), which reads the map below byte `end`, once the file still holds that many
  // bytes. A file that shrank since it was mapped (rewritten or truncated under the run)
  // is a RunError naming it, also where it shrinks during the read: the SIGBUS of a read
  // past its end is caught. read() must not throw (it would leave the SIGBUS guard set).
  template <class F>
  void read_checked(std::int64_t end, F& read) const {
    read_checked(end, [](void* f) { (*static_cast<F*>(f))(); }, &read);
  }

  // "" while the file holds every byte it held when mapped; else what read_checked() would
  // throw for a read of the whole map.
  std::string shrinkage() const;

 private:
  std::string shrank(std::int64_t now, std::int64_t end) const;
  void read_checked(std::int64_t end, void (*read)(void*), void* context) const;

  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::int64_t size_ = 0;
  int fd_ = -1;  // kept open to see the file's size now
};

}  // namespace lamina
