#include "lamina/io/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <tuple>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/io/output_file.hpp"

#if defined(LAMINA_HAVE_NLOHMANN_JSON)
#include <nlohmann/json.hpp>
#endif

namespace lamina {

bool safetensors_supported() {
#if defined(LAMINA_HAVE_NLOHMANN_JSON)
  return true;
#else
  return false;
#endif
}

std::int64_t SafetensorsTensor::numel() const {
  std::int64_t n = 1;
  for (const auto d : shape) n *= d;
  return n;
}

std::int64_t safetensors_bytes(const std::vector<std::int64_t>& shape, StoredFloat type) {
  std::int64_t n = stored_size(type);
  for (const auto d : shape) n *= d;
  return n;
}

#if defined(LAMINA_HAVE_NLOHMANN_JSON)

namespace {

constexpr std::int64_t kMaxElements = std::int64_t(1) << 50;  // far past any model, far from overflow

// Bytes per element of the specification's dtypes; 0 for a name it does not have.
int dtype_size(const std::string& d) {
  static const std::map<std::string, int> sizes = {
      {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
      {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
  const auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  using nlohmann::json;
  const std::int64_t size = file_.size();
  const auto bad = [&](const std::string& what) { return InputError(path + ": not a valid safetensors file: " + what); };
  if (size < 8) throw bad(strprintf("%lld bytes, fewer than the 8 of the header length", static_cast<long long>(size)));
  std::uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | file_.data()[i];  // little-endian whatever the host
  if (n > static_cast<std::uint64_t>(kMaxHeaderBytes)) {
    throw bad(strprintf("the header length %llu exceeds the specification's limit of %lld bytes",
                        static_cast<unsigned long long>(n), static_cast<long long>(kMaxHeaderBytes)));
  }
  if (static_cast<std::int64_t>(n) > size - 8) {
    throw bad(strprintf("the header length %llu runs past the end of the file (%lld bytes): truncated?",
                        static_cast<unsigned long long>(n), static_cast<long long>(size)));
  }
  const char* begin = reinterpret_cast<const char*>(file_.data()) + 8;
  if (n == 0 || begin[0] != '{') throw bad("the header does not start with '{'");
  json header;
  try {
    header = json::parse(begin, begin + n);
  } catch (const json::exception& e) {
    throw bad(std::string("the header is not JSON: ") + e.what());
  }
  if (!header.is_object()) throw bad("the header is not a JSON object");
  const std::uint8_t* data = file_.data() + 8 + n;
  const std::int64_t data_bytes = size - 8 - static_cast<std::int64_t>(n);
  const auto whole = [](const json& v, std::int64_t hi, std::int64_t& out) {
    if (!v.is_number_unsigned() && !(v.is_number_integer() && v.get<std::int64_t>() >= 0)) return false;
    const std::uint64_t u = v.get<std::uint64_t>();
    if (u > static_cast<std::uint64_t>(hi)) return false;
    out = static_cast<std::int64_t>(u);
    return true;
  };
  std::vector<std::tuple<std::int64_t, std::int64_t, std::string>> spans;
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") {
      if (!entry.is_object()) throw bad("__metadata__ is not an object of strings");
      for (const auto& [k, v] : entry.items()) {
        if (!v.is_string()) throw bad("__metadata__ value '" + k + "' is not a string");
        metadata_[k] = v.get<std::string>();
      }
      continue;
    }
    const std::string where = "tensor '" + name + "'";
    if (!entry.is_object() || !entry.contains("dtype") || !entry.contains("shape") || !entry.contains("data_offsets")) {
      throw bad(where + " lacks dtype, shape or data_offsets");
    }
    SafetensorsTensor t;
    if (!entry["dtype"].is_string()) throw bad(where + ": dtype is not a string");
    t.dtype = entry["dtype"].get<std::string>();
    const int elem = dtype_size(t.dtype);
    if (elem == 0) throw bad(where + ": unknown dtype '" + t.dtype + "'");
    const json& shape = entry["shape"];
    if (!shape.is_array() || shape.size() > 8) throw bad(where + ": shape is not an array of at most 8 sizes");
    std::int64_t numel = 1;
    for (const json& d : shape) {
      std::int64_t v = 0;
      if (!whole(d, kMaxElements, v)) throw bad(where + ": shape holds something other than a size");
      t.shape.push_back(v);
      numel = v == 0 ? 0 : (numel > kMaxElements / v ? kMaxElements + 1 : numel * v);
      if (numel > kMaxElements) throw bad(where + ": shape " + shape_string(t.shape) + " is too large");
    }
    const json& off = entry["data_offsets"];
    std::int64_t b = 0, e = 0;
    if (!off.is_array() || off.size() != 2 || !whole(off[0], data_bytes, b) || !whole(off[1], data_bytes, e) || e < b) {
      throw bad(strprintf("%s: data_offsets must be [begin, end] with begin <= end <= %lld, the bytes after the header",
                          where.c_str(), static_cast<long long>(data_bytes)));
    }
    if (e - b != numel * elem) {
      throw bad(strprintf("%s: data_offsets [%lld, %lld] span %lld bytes, but %s %s needs %lld", where.c_str(),
                          static_cast<long long>(b), static_cast<long long>(e), static_cast<long long>(e - b),
                          t.dtype.c_str(), shape_string(t.shape).c_str(), static_cast<long long>(numel * elem)));
    }
    t.data = data + b;
    t.bytes = e - b;
    spans.emplace_back(b, e, name);
    tensors_.emplace(name, std::move(t));
  }
  // Tensors tile the data: a byte belongs to exactly one tensor.
  std::sort(spans.begin(), spans.end());
  std::int64_t at = 0;
  std::string previous = "the header";
  for (const auto& [b, e, name] : spans) {
    if (b < at) throw bad("tensor '" + name + "' overlaps " + previous);
    if (b > at) throw bad(strprintf("bytes %lld to %lld after %s belong to no tensor", static_cast<long long>(at),
                                    static_cast<long long>(b), previous.c_str()));
    at = e;
    previous = "tensor '" + name + "'";
  }
  if (at != data_bytes) {
    throw bad(strprintf("%lld bytes at the end belong to no tensor", static_cast<long long>(data_bytes - at)));
  }
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>& tensors, StoredFloat type,
                       const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json header;
  if (!metadata.empty()) header["__metadata__"] = metadata;
  std::int64_t at = 0;
  for (const auto& t : tensors) {
    const std::int64_t bytes = safetensors_bytes(t.shape, type);
    header[t.name] = {{"dtype", safetensors_name(type)}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
    at += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data starts 8-byte aligned, as the reference writer does
  write_file_replacing(path, [&](OutputFile& f) {
    std::uint8_t len[8];
    for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(static_cast<std::uint64_t>(text.size()) >> (8 * i));
    f.write(len, 8);
    f.write(text);
    constexpr std::int64_t kChunk = 1 << 20;  // elements converted at a time
    std::vector<std::uint8_t> buf;
    for (const auto& t : tensors) {
      const std::int64_t n = safetensors_bytes(t.shape, type) / stored_size(type);
      for (std::int64_t i = 0; i < n; i += kChunk) {
        const std::int64_t m = std::min(kChunk, n - i);
        buf.resize(static_cast<std::size_t>(m * stored_size(type)));
        encode_floats(type, t.values + i, m, buf.data());
        f.write(buf.data(), buf.size());
      }
    }
  });
}

#else

[[noreturn]] void no_json(const std::string& path) {
  throw InputError(path + ": this lamina was built without nlohmann-json, so it cannot read or write safetensors "
                          "(Debian: nlohmann-json3-dev; spack: nlohmann-json; then rebuild)");
}

SafetensorsFile::SafetensorsFile(const std::string& path) { no_json(path); }

void write_safetensors(const std::string& path, const std::vector<SafetensorsEntry>&, StoredFloat,
                       const std::map<std::string, std::string>&) {
  no_json(path);
}

#endif

const SafetensorsTensor& SafetensorsFile::tensor(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) throw InputError(path() + ": no tensor '" + name + "'");
  return it->second;
}

std::vector<float> SafetensorsFile::floats(const std::string& name) const {
  const SafetensorsTensor& t = tensor(name);
  StoredFloat type = StoredFloat::f32;
  if (t.dtype == "F32") type = StoredFloat::f32;
  else if (t.dtype == "F16") type = StoredFloat::f16;
  else if (t.dtype == "BF16") type = StoredFloat::bf16;
  else if (t.dtype == "F64") type = StoredFloat::f64;
  else throw InputError(path() + ": tensor '" + name + "' is " + t.dtype + ", not a floating-point type lamina reads (F32, F16, BF16, F64)");
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  decode_floats(type, t.data, t.numel(), out.data());
  return out;
}

}  // namespace lamina
