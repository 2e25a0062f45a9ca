#pragma once
// HuggingFace safetensors files: an 8-byte little-endian header length N, N bytes of JSON
// (`{"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, ...,
// "__metadata__": {...}}`), then the tensors' bytes, little-endian and row-major, offsets
// relative to the end of the header. The file is mapped, never trusted: the header length,
// every offset, dtype and shape is checked against the specification and the file's size
// before a byte of data is read, and tensors must tile the data exactly (no overlaps, no
// holes), as the reference implementation requires. Anything else is an InputError naming
// the file and what is wrong. The JSON goes through nlohmann-json; a build without it
// says so when asked to read or write one.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lamina/io/mapped_file.hpp"
#include "lamina/io/stored_numbers.hpp"

namespace lamina {

// Whether this build reads and writes safetensors (nlohmann-json found at configure time).
bool safetensors_supported();

struct SafetensorsTensor {
  std::string dtype;  // as written: "F32", "BF16", "I32", ...
  std::vector<std::int64_t> shape;
  const std::uint8_t* data = nullptr;  // into the mapped file
  std::int64_t bytes = 0;
  std::int64_t numel() const;
};

class SafetensorsFile {
 public:
  // The reference implementation's bound on the header (100 MB): GPT-2 XL's is 20 kB.
  static constexpr std::int64_t kMaxHeaderBytes = 100'000'000;

  explicit SafetensorsFile(const std::string& path);  // throws InputError
  const std::string& path() const { return file_.path(); }
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  const SafetensorsTensor& tensor(const std::string& name) const;  // InputError if missing
  const std::map<std::string, SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // A floating-point tensor as float; another dtype is an InputError naming it.
  std::vector<float> floats(const std::string& name) const;

 private:
  MappedFile file_;
  std::map<std::string, SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

struct SafetensorsEntry {
  std::string name;
  std::vector<std::int64_t> shape;
  const float* values = nullptr;
};

// Writes the tensors, in the order given, stored as `type`, with `metadata` (HuggingFace's
// loaders want {"format": "pt"}). Written to `path`.tmp and renamed; a failed write is a
// RunError naming the file.
void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors, StoredFloat type,
                       const std::map<std::string, std::string>& metadata);

// The bytes of a tensor stored as `type`, as write_safetensors lays them out.
std::int64_t safetensors_bytes(const std::vector<std::int64_t>& shape, StoredFloat type);

}  // namespace lamina
