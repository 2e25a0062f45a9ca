// The safetensors reader against files written by the project's Python (make_weights.py),
// a write-read round trip, and hostile headers: each is an InputError saying what is wrong,
// never a crash or a read outside the file.
#include "lamina/io/safetensors.hpp"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

const std::string kWeights = std::string(LAMINA_SOURCE_DIR) + "/tests/reference/weights";

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!safetensors_supported()) GTEST_SKIP() << "built without nlohmann-json";
    dir_ = (std::filesystem::temp_directory_path() / ("lamina_st_" + std::to_string(::getpid()))).string();
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  // A file of an 8-byte length (header.size() unless given), the header, then `data` bytes.
  std::string write(const std::string& header, std::int64_t data, std::uint64_t length = UINT64_MAX) const {
    const std::string p = dir_ + "/f.safetensors";
    std::ofstream f(p, std::ios::binary);
    const std::uint64_t n = length == UINT64_MAX ? header.size() : length;
    for (int i = 0; i < 8; ++i) f.put(static_cast<char>(n >> (8 * i)));
    f << header << std::string(static_cast<std::size_t>(data), '\0');
    return p;
  }
  void expect_refused(const std::string& path, const std::string& says) const {
    try {
      SafetensorsFile f(path);
      ADD_FAILURE() << "accepted; expected: " << says;
    } catch (const InputError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
  std::string dir_;
};

TEST_F(Safetensors, ReadsWhatPythonWrote) {
  const SafetensorsFile f(kWeights + "/hf/model.safetensors");
  EXPECT_EQ(f.metadata().at("format"), "pt");
  const auto& wte = f.tensor("transformer.wte.weight");
  EXPECT_EQ(wte.dtype, "F32");
  EXPECT_EQ(wte.shape, (std::vector<std::int64_t>{64, 32}));
  EXPECT_EQ(f.floats("lm_head.weight"), f.floats("transformer.wte.weight"));
  // The same weights in bfloat16: each value the float32 one rounded.
  const SafetensorsFile b(kWeights + "/bare_bf16.safetensors");
  const auto w32 = f.floats("transformer.h.1.mlp.c_fc.weight"), w16 = b.floats("h.1.mlp.c_fc.weight");
  ASSERT_EQ(w32.size(), w16.size());
  std::vector<std::uint8_t> rounded(w32.size() * 2);
  encode_floats(StoredFloat::bf16, w32.data(), static_cast<std::int64_t>(w32.size()), rounded.data());
  EXPECT_EQ(std::memcmp(rounded.data(), b.tensor("h.1.mlp.c_fc.weight").data, rounded.size()), 0);
  EXPECT_THROW(b.floats("nope"), InputError);
}

TEST_F(Safetensors, WriteThenReadIsBitExact) {
  const SafetensorsFile src(kWeights + "/hf/model.safetensors");
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsEntry> entries;
  for (const auto& [name, t] : src.tensors()) {
    values.push_back(src.floats(name));
    entries.push_back({name, t.shape, nullptr});
  }
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i].values = values[i].data();
  const std::string out = dir_ + "/out.safetensors";
  write_safetensors(out, entries, StoredFloat::f32, {{"format", "pt"}});
  const SafetensorsFile back(out);
  ASSERT_EQ(back.tensors().size(), src.tensors().size());
  for (const auto& [name, t] : src.tensors()) {
    EXPECT_EQ(back.tensor(name).shape, t.shape);
    EXPECT_EQ(std::memcmp(back.tensor(name).data, t.data, static_cast<std::size_t>(t.bytes)), 0) << name;
  }
  EXPECT_FALSE(std::filesystem::exists(out + ".tmp"));
}

TEST_F(Safetensors, HostileHeadersAreRefused) {
  const std::string ok = R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  EXPECT_NO_THROW(SafetensorsFile(write(ok, 8)));
  expect_refused(write("", 0, 0), "does not start with '{'");
  expect_refused(write(ok, 8, 1ull << 62), "exceeds the specification's limit");
  expect_refused(write(ok, 8, UINT64_MAX - 1), "exceeds the specification's limit");
  expect_refused(write(ok, 8, 99'000'000), "runs past the end of the file");
  expect_refused(write(ok, 4), "data_offsets must be");  // the data is cut short
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8])", 8), "not JSON");
  expect_refused(write(R"([1,2])", 0), "does not start with '{'");
  expect_refused(write(R"({"a":{"dtype":"F42","shape":[2],"data_offsets":[0,8]}})", 8), "unknown dtype 'F42'");
  expect_refused(write(R"({"a":{"dtype":7,"shape":[2],"data_offsets":[0,8]}})", 8), "dtype is not a string");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8), "shape holds");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[1.5],"data_offsets":[0,8]}})", 8), "shape holds");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})", 8),
                 "too large");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "needs 12");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})", 8), "data_offsets must be");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615]}})", 8),
                 "data_offsets must be");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[2]}})", 8), "lacks dtype, shape or data_offsets");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},
                           "b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "overlaps");
  expect_refused(write(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},
                           "b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12), "belong to no tensor");
  expect_refused(write(ok, 12), "4 bytes at the end belong to no tensor");
  expect_refused(write(R"({"__metadata__":{"format":3}})", 0), "is not a string");
  expect_refused(write(std::string(1, '{') + std::string(200000, '['), 0), "not JSON");
  const std::string none = dir_ + "/short";
  std::ofstream(none) << "abc";
  expect_refused(none, "fewer than the 8");
}

}  // namespace
}  // namespace lamina::test
