#include "lamina/io/llmc_model.hpp"

#include <climits>
#include <cstring>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/io/output_file.hpp"

namespace lamina {

namespace {

constexpr int kHeaderInts = 256;
constexpr std::int64_t kHeaderBytes = kHeaderInts * 4;

std::int32_t header_int(const std::uint8_t* p, int i) {
  std::int32_t v;
  std::memcpy(&v, p + 4 * i, 4);
  return v;
}

// Elements of array `a` for one layer (or the whole array where it is not per layer), and
// its rows and columns as stored.
struct ArrayShape {
  std::int64_t rows = 0, cols = 0;
  std::int64_t numel() const { return rows * cols; }
};

ArrayShape array_shape(const std::string& kind, std::int64_t C, std::int64_t T, std::int64_t Vp) {
  if (kind == "wte") return {Vp, C};
  if (kind == "wpe") return {T, C};
  if (kind == "attn.c_attn.weight") return {3 * C, C};
  if (kind == "attn.c_attn.bias") return {1, 3 * C};
  if (kind == "attn.c_proj.weight") return {C, C};
  if (kind == "mlp.c_fc.weight") return {4 * C, C};
  if (kind == "mlp.c_fc.bias") return {1, 4 * C};
  if (kind == "mlp.c_proj.weight") return {C, 4 * C};
  return {1, C};  // norms' gains and biases, projections' biases
}

}  // namespace

const std::vector<LlmcArray>& llmc_arrays() {
  static const std::vector<LlmcArray> arrays = {
      {"wte", false, false},
      {"wpe", false, false},
      {"ln_1.weight", true, false},
      {"ln_1.bias", true, false},
      {"attn.c_attn.weight", true, true},
      {"attn.c_attn.bias", true, false},
      {"attn.c_proj.weight", true, true},
      {"attn.c_proj.bias", true, false},
      {"ln_2.weight", true, false},
      {"ln_2.bias", true, false},
      {"mlp.c_fc.weight", true, true},
      {"mlp.c_fc.bias", true, false},
      {"mlp.c_proj.weight", true, true},
      {"mlp.c_proj.bias", true, false},
      {"ln_f.weight", false, false},
      {"ln_f.bias", false, false},
  };
  return arrays;
}

bool is_llmc_model_file(const std::uint8_t* head, std::int64_t size) {
  return size >= 4 && header_int(head, 0) == LlmcModelFile::kMagic;
}

std::int64_t llmc_padded_vocab(std::int64_t vocab) { return (vocab + 127) / 128 * 128; }

LlmcModelFile::LlmcModelFile(const std::string& path) : file_(path) {
  const auto bad = [&](const std::string& what) { return InputError(path + ": not a valid llm.c model file: " + what); };
  if (file_.size() < kHeaderBytes) {
    throw bad(strprintf("%lld bytes, fewer than its 1024-byte header", static_cast<long long>(file_.size())));
  }
  const std::uint8_t* h = file_.data();
  if (header_int(h, 0) != kMagic) {
    throw bad(strprintf("magic %d, expected %d", header_int(h, 0), kMagic));
  }
  const std::int32_t version = header_int(h, 1);
  if (version == 3) stored_ = StoredFloat::f32;
  else if (version == 5) stored_ = StoredFloat::bf16;
  else throw bad(strprintf("version %d; lamina reads versions 3 (float32) and 5 (bfloat16), which llm.c writes", version));
  const char* names[] = {"max sequence length", "vocabulary", "layers", "heads", "channels", "padded vocabulary"};
  std::int64_t v[6];
  for (int i = 0; i < 6; ++i) {
    v[i] = header_int(h, 2 + i);
    if (v[i] < 1) throw bad(strprintf("header[%d] (%s) = %lld, must be >= 1", 2 + i, names[i], static_cast<long long>(v[i])));
  }
  model_.seq_len = v[0];
  model_.vocab_size = v[1];
  model_.layers = v[2];
  model_.heads = v[3];
  model_.d_model = v[4];
  padded_vocab_ = v[5];
  if (model_.d_model % model_.heads != 0) {
    throw bad(strprintf("channels %lld are not divisible by heads %lld", static_cast<long long>(model_.d_model),
                        static_cast<long long>(model_.heads)));
  }
  if (padded_vocab_ < model_.vocab_size) {
    throw bad(strprintf("padded vocabulary %lld is smaller than the vocabulary %lld",
                        static_cast<long long>(padded_vocab_), static_cast<long long>(model_.vocab_size)));
  }
  // Every factor is below 2^31, so the sum fits in 128 bits.
  __int128 elements = 0;
  for (const LlmcArray& a : llmc_arrays()) {
    const ArrayShape s = array_shape(a.kind, model_.d_model, model_.seq_len, padded_vocab_);
    elements += static_cast<__int128>(s.rows) * s.cols * (a.per_layer ? model_.layers : 1);
  }
  const __int128 expected = kHeaderBytes + elements * stored_size(stored_);
  if (expected != file_.size()) {
    throw bad(strprintf("its header describes %s bytes (layers %lld, channels %lld, vocabulary %lld padded to %lld, "
                        "sequence %lld, %s), the file has %lld: truncated or not this model",
                        expected > LLONG_MAX ? "more than 2^63" : std::to_string(static_cast<long long>(expected)).c_str(),
                        static_cast<long long>(model_.layers), static_cast<long long>(model_.d_model),
                        static_cast<long long>(model_.vocab_size), static_cast<long long>(padded_vocab_),
                        static_cast<long long>(model_.seq_len), version == 3 ? "float32" : "bfloat16",
                        static_cast<long long>(file_.size())));
  }
}

std::vector<float> LlmcModelFile::tensor(const std::string& name, std::vector<std::int64_t>& shape) const {
  std::string kind = name;
  std::int64_t layer = 0;
  if (name.rfind("h.", 0) == 0) {
    const std::size_t dot = name.find('.', 2);
    layer = dot == std::string::npos ? -1 : std::atoll(name.substr(2, dot - 2).c_str());
    kind = dot == std::string::npos ? "" : name.substr(dot + 1);
    if (layer < 0 || layer >= model_.layers) throw InputError(path() + ": no tensor '" + name + "'");
  }
  const int elem = stored_size(stored_);
  std::int64_t offset = kHeaderBytes;
  for (const LlmcArray& a : llmc_arrays()) {
    const ArrayShape s = array_shape(a.kind, model_.d_model, model_.seq_len, padded_vocab_);
    const std::int64_t count = a.per_layer ? model_.layers : 1;
    if (a.kind != kind || a.per_layer != (name.rfind("h.", 0) == 0)) {
      offset += s.numel() * count * elem;
      continue;
    }
    const std::uint8_t* p = file_.data() + offset + layer * s.numel() * elem;
    const std::int64_t keep_rows = kind == "wte" ? model_.vocab_size : s.rows;  // the padding is not the model's
    std::vector<float> stored(static_cast<std::size_t>(keep_rows * s.cols));
    decode_floats(stored_, p, keep_rows * s.cols, stored.data());
    if (a.transposed) {
      shape = {s.cols, s.rows};
    } else if (kind != "wte" && kind != "wpe") {  // gains and biases
      shape = {s.cols};
    } else {
      shape = {keep_rows, s.cols};
    }
    if (!a.transposed) return stored;
    std::vector<float> out(stored.size());  // (out, in) -> (in, out)
    for (std::int64_t r = 0; r < s.rows; ++r) {
      for (std::int64_t c = 0; c < s.cols; ++c) out[c * s.rows + r] = stored[r * s.cols + c];
    }
    return out;
  }
  throw InputError(path() + ": no tensor '" + name + "'");
}

void write_llmc_model(const std::string& path, const ModelConfig& m, StoredFloat type,
                      const std::function<std::vector<float>(const std::string& name)>& get) {
  if (type != StoredFloat::f32 && type != StoredFloat::bf16) {
    throw InputError(path + ": llm.c model files hold float32 or bfloat16 parameters, not " +
                     std::string(safetensors_name(type)));
  }
  const std::int64_t Vp = llmc_padded_vocab(m.vocab_size);
  for (const std::int64_t d : {m.seq_len, m.vocab_size, m.layers, m.heads, m.d_model, Vp}) {
    if (d > INT_MAX) throw InputError(path + ": the model's sizes do not fit llm.c's int32 header");
  }
  std::vector<std::int32_t> header(kHeaderInts, 0);
  header[0] = LlmcModelFile::kMagic;
  header[1] = type == StoredFloat::f32 ? 3 : 5;
  header[2] = static_cast<std::int32_t>(m.seq_len);
  header[3] = static_cast<std::int32_t>(m.vocab_size);
  header[4] = static_cast<std::int32_t>(m.layers);
  header[5] = static_cast<std::int32_t>(m.heads);
  header[6] = static_cast<std::int32_t>(m.d_model);
  header[7] = static_cast<std::int32_t>(Vp);
  write_file_replacing(path, [&](OutputFile& f) {
    f.write(header.data(), header.size() * 4);
    std::vector<std::uint8_t> bytes;
    const auto put = [&](const std::vector<float>& values) {
      bytes.resize(values.size() * static_cast<std::size_t>(stored_size(type)));
      encode_floats(type, values.data(), static_cast<std::int64_t>(values.size()), bytes.data());
      f.write(bytes.data(), bytes.size());
    };
    for (const LlmcArray& a : llmc_arrays()) {
      const ArrayShape s = array_shape(a.kind, m.d_model, m.seq_len, Vp);
      for (std::int64_t l = 0; l < (a.per_layer ? m.layers : 1); ++l) {
        std::vector<float> t = get(a.per_layer ? "h." + std::to_string(l) + "." + a.kind : a.kind);
        if (a.kind == "wte") t.resize(static_cast<std::size_t>(Vp * m.d_model), 0.0f);
        if (a.transposed) {  // (in, out) -> (out, in)
          std::vector<float> out(t.size());
          for (std::int64_t r = 0; r < s.rows; ++r) {
            for (std::int64_t c = 0; c < s.cols; ++c) out[r * s.cols + c] = t[c * s.rows + r];
          }
          t.swap(out);
        }
        put(t);
      }
    }
  });
}

}  // namespace lamina
