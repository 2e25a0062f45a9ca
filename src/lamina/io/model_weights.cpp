#include "lamina/io/model_weights.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/text_file.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/io/llmc_model.hpp"
#include "lamina/io/output_file.hpp"
#include "lamina/io/safetensors.hpp"
#include "lamina/model/param_layout.hpp"

#if defined(LAMINA_HAVE_NLOHMANN_JSON)
#include <nlohmann/json.hpp>
#endif

namespace lamina {

namespace fs = std::filesystem;

namespace {

constexpr std::int64_t kMaxJsonBytes = 64 << 20;  // an index or config.json; GPT-2's are a few kB

// ---------------------------------------------------------------------------------------
// lamina checkpoints

class CheckpointSource : public WeightsSource {
 public:
  explicit CheckpointSource(const std::string& path) : reader_(path, MPI_COMM_SELF) {
    if (!parse_model_signature(reader_.meta().model, model_)) {
      throw InputError(path + ": attribute 'model' = \"" + reader_.meta().model + "\" does not describe a model");
    }
  }
  const std::string& path() const override { return reader_.path(); }
  WeightsFormat format() const override { return WeightsFormat::lamina; }
  std::string describe() const override {
    return strprintf("lamina checkpoint, step %lld, float32, %s", static_cast<long long>(reader_.meta().step),
                     model_signature(model_).c_str());
  }
  const ModelConfig& model() const override { return model_; }
  WeightsTensor tensor(const std::string& name) const override {
    WeightsTensor t;
    t.shape = reader_.shape("model/" + name);
    std::int64_t n = 1;
    for (const auto d : t.shape) n *= d;
    t.values.resize(static_cast<std::size_t>(n));
    TensorSlab slab;
    slab.name = "model/" + name;
    slab.global_shape = t.shape;
    slab.local_shape = t.shape;
    slab.pieces.push_back({std::vector<std::int64_t>(t.shape.size(), 0), t.shape});
    slab.data = t.values.data();
    reader_.read(slab);
    return t;
  }

 private:
  mutable CheckpointReader reader_;
  ModelConfig model_;
};

// ---------------------------------------------------------------------------------------
// llm.c model files

class LlmcSource : public WeightsSource {
 public:
  explicit LlmcSource(const std::string& path) : file_(path) {}
  const std::string& path() const override { return file_.path(); }
  WeightsFormat format() const override { return WeightsFormat::llmc; }
  std::string describe() const override {
    return strprintf("llm.c model file, %s, vocabulary padded to %lld, %s",
                     file_.stored() == StoredFloat::f32 ? "float32" : "bfloat16",
                     static_cast<long long>(file_.padded_vocab()), model_signature(file_.model()).c_str());
  }
  const ModelConfig& model() const override { return file_.model(); }
  WeightsTensor tensor(const std::string& name) const override {
    WeightsTensor t;
    t.values = file_.tensor(name, t.shape);
    return t;
  }

 private:
  LlmcModelFile file_;
};

// ---------------------------------------------------------------------------------------
// HuggingFace safetensors

#if defined(LAMINA_HAVE_NLOHMANN_JSON)
nlohmann::json read_json(const std::string& path, const char* what) {
  try {
    return nlohmann::json::parse(read_text_file(path, what, kMaxJsonBytes));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(path + ": not valid JSON: " + e.what());
  }
}
#endif

// lamina's name for a GPT2LMHeadModel key, "" for the attention-mask buffers older files
// carry, "lm_head" for the tied head; anything else is not GPT-2's.
std::string lamina_name(const std::string& key) {
  std::string k = key.rfind("transformer.", 0) == 0 ? key.substr(12) : key;
  if (k == "wte.weight" || k == "wpe.weight") return k.substr(0, 3);
  if (k == "lm_head.weight") return "lm_head";
  const auto ends = [&](const char* s) {
    const std::size_t n = std::strlen(s);
    return k.size() >= n && k.compare(k.size() - n, n, s) == 0;
  };
  if (k.rfind("h.", 0) == 0 && (ends(".attn.bias") || ends(".attn.masked_bias"))) return "";
  return k;
}

class SafetensorsSource : public WeightsSource {
 public:
  explicit SafetensorsSource(const std::string& path) : path_(path) {
    std::string dir = path;
    std::vector<std::string> files;
    std::error_code ec;
    if (fs::is_directory(path, ec)) {
      if (fs::exists(path + "/model.safetensors.index.json", ec)) {
        files = shards_of(path + "/model.safetensors.index.json");
      } else if (fs::exists(path + "/model.safetensors", ec)) {
        files = {path + "/model.safetensors"};
      } else {
        throw InputError(path + ": a directory without model.safetensors or model.safetensors.index.json");
      }
    } else {
      dir = fs::path(path).parent_path().string();
      if (dir.empty()) dir = ".";
      const bool index = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
      files = index ? shards_of(path) : std::vector<std::string>{path};
    }
    for (const auto& f : files) shards_.push_back(std::make_unique<SafetensorsFile>(f));
    // The index must say where each tensor is: a key it names in a shard that lacks it is a
    // stale or edited index, whatever the other shards hold.
    for (const auto& [key, file] : index_) {
      const auto shard = std::find_if(shards_.begin(), shards_.end(), [&](const auto& s) { return s->path() == file; });
      if (shard != shards_.end() && (*shard)->tensors().count(key) == 0) {
        throw InputError(index_path_ + ": weight_map[\"" + key + "\"] names " + fs::path(file).filename().string() +
                         ", which does not hold it (a stale or edited index?)");
      }
    }
    std::set<std::int64_t> blocks;
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      for (const auto& [key, t] : shards_[s]->tensors()) {
        const std::string name = lamina_name(key);
        if (name.empty()) continue;
        const bool known = name == "wte" || name == "wpe" || name == "lm_head" || name == "ln_f.weight" ||
                           name == "ln_f.bias" || name.rfind("h.", 0) == 0;
        if (!known) {
          throw InputError(shards_[s]->path() + ": tensor '" + key + "' is not part of GPT-2 (GPT2LMHeadModel)");
        }
        if (!where_.emplace(name, std::make_pair(s, key)).second) {
          throw InputError(path + ": tensor '" + name + "' is stored twice (as '" + where_[name].second + "' and '" +
                           key + "')");
        }
        if (name.rfind("h.", 0) == 0) blocks.insert(std::atoll(name.c_str() + 2));
      }
    }
    for (const char* needed : {"wte", "wpe"}) {
      if (where_.count(needed) == 0) throw InputError(path + ": no tensor '" + needed + ".weight' (is this GPT-2?)");
    }
    const auto& wte = raw("wte");
    const auto& wpe = raw("wpe");
    if (wte.shape.size() != 2 || wpe.shape.size() != 2) throw InputError(path + ": wte and wpe must be matrices");
    model_.vocab_size = wte.shape[0];
    model_.d_model = wte.shape[1];
    model_.seq_len = wpe.shape[0];
    model_.layers = static_cast<std::int64_t>(blocks.size());
    if (!blocks.empty() && (*blocks.begin() != 0 || *blocks.rbegin() != model_.layers - 1)) {
      throw InputError(path + ": the blocks h.N are not numbered 0 to " + std::to_string(model_.layers - 1));
    }
    dtype_ = wte.dtype;
    read_config(dir + "/config.json");
  }

  const std::string& path() const override { return path_; }
  WeightsFormat format() const override { return WeightsFormat::huggingface; }
  std::string describe() const override {
    return strprintf("HuggingFace safetensors, %s, %zu file(s)%s, %s", dtype_.c_str(), shards_.size(),
                     config_.empty() ? " without config.json" : "", model_signature(model_).c_str());
  }
  const ModelConfig& model() const override { return model_; }

  WeightsTensor tensor(const std::string& name) const override {
    const auto it = where_.find(name);
    if (it == where_.end()) throw InputError(path_ + ": no tensor '" + name + "' (nor 'transformer." + name + "')");
    const SafetensorsFile& f = *shards_[it->second.first];
    WeightsTensor t{f.tensor(it->second.second).shape, f.floats(it->second.second)};
    // A head stored beside the embedding must be the same tensor: lamina's GPT-2 ties them.
    if (name == "wte" && where_.count("lm_head") != 0) {
      const WeightsTensor head = tensor("lm_head");
      if (head.shape != t.shape || std::memcmp(head.values.data(), t.values.data(), t.values.size() * 4) != 0) {
        throw InputError(path_ + ": lm_head.weight differs from wte: an untied output layer, which GPT-2 (and "
                                 "lamina's model) does not have");
      }
    }
    return t;
  }

 private:
  const SafetensorsTensor& raw(const std::string& name) const {
    const auto& w = where_.at(name);
    return shards_[w.first]->tensor(w.second);
  }

  std::vector<std::string> shards_of(const std::string& index) {
#if defined(LAMINA_HAVE_NLOHMANN_JSON)
    const nlohmann::json j = read_json(index, "safetensors index");
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
      throw InputError(index + ": no \"weight_map\" object (not a safetensors index)");
    }
    std::set<std::string> names;
    std::string dir = fs::path(index).parent_path().string();
    if (dir.empty()) dir = ".";
    index_path_ = index;
    for (const auto& [key, file] : j["weight_map"].items()) {
      const std::string f = file.is_string() ? file.get<std::string>() : "";
      // Shards sit beside the index: a name with a directory in it is not one of them.
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..") {
        throw InputError(index + ": weight_map[\"" + key + "\"] is not a file name beside the index");
      }
      names.insert(f);
      index_.emplace_back(key, dir + "/" + f);
    }
    std::vector<std::string> out;
    for (const auto& n : names) out.push_back(dir + "/" + n);
    return out;
#else
    throw InputError(index + ": this lamina was built without nlohmann-json, so it cannot read safetensors");
#endif
  }

  void read_config(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) return;
#if defined(LAMINA_HAVE_NLOHMANN_JSON)
    const nlohmann::json j = read_json(path, "model configuration");
    config_ = path;
    const auto bad = [&](const std::string& what) { return InputError(path + ": " + what); };
    if (!j.is_object()) throw bad("not a JSON object");
    if (j.contains("model_type") && j["model_type"] != "gpt2") {
      throw bad("model_type " + j["model_type"].dump() + ": lamina trains GPT-2 (\"gpt2\")");
    }
    const auto count = [&](const char* key, std::int64_t tensors) {
      if (!j.contains(key)) return;
      if (!j[key].is_number_integer() || j[key].get<std::int64_t>() != tensors) {
        throw bad(strprintf("%s = %s, but the tensors say %lld", key, j[key].dump().c_str(), static_cast<long long>(tensors)));
      }
    };
    count("n_layer", model_.layers);
    count("n_embd", model_.d_model);
    count("n_positions", model_.seq_len);
    count("vocab_size", model_.vocab_size);
    if (j.contains("n_head")) {
      if (!j["n_head"].is_number_integer() || j["n_head"].get<std::int64_t>() < 1 ||
          model_.d_model % j["n_head"].get<std::int64_t>() != 0) {
        throw bad("n_head = " + j["n_head"].dump() + " does not divide n_embd");
      }
      model_.heads = j["n_head"].get<std::int64_t>();
    }
    if (j.contains("activation_function") && j["activation_function"] != "gelu_new" &&
        j["activation_function"] != "gelu_pytorch_tanh") {
      throw bad("activation_function " + j["activation_function"].dump() +
                ": lamina's GPT-2 uses the tanh approximation of GELU (\"gelu_new\")");
    }
    if (j.contains("layer_norm_epsilon") &&
        (!j["layer_norm_epsilon"].is_number() || std::fabs(j["layer_norm_epsilon"].get<double>() - 1e-5) > 1e-12)) {
      throw bad("layer_norm_epsilon " + j["layer_norm_epsilon"].dump() + ": lamina's layer norms use 1e-5");
    }
    if (j.contains("tie_word_embeddings") && j["tie_word_embeddings"] == false) {
      throw bad("tie_word_embeddings = false: lamina's GPT-2 ties the output layer to wte");
    }
#endif
  }

  std::string path_, config_, dtype_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::string index_path_;                                  // the sharded index read, if any
  std::vector<std::pair<std::string, std::string>> index_;  // its weight_map: tensor, shard path
  std::map<std::string, std::pair<std::size_t, std::string>> where_;  // lamina name -> (shard, key)
  ModelConfig model_;
};

// ---------------------------------------------------------------------------------------
// Writing

std::string hf_config(const ModelConfig& m, StoredFloat type) {
  const char* dtype = type == StoredFloat::bf16 ? "bfloat16" : type == StoredFloat::f16 ? "float16" : "float32";
  std::string s = "{\n";
  s += "  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n";
  s += strprintf("  \"n_layer\": %lld,\n  \"n_head\": %lld,\n  \"n_embd\": %lld,\n  \"n_positions\": %lld,\n"
                 "  \"n_ctx\": %lld,\n  \"vocab_size\": %lld,\n",
                 static_cast<long long>(m.layers), static_cast<long long>(m.heads), static_cast<long long>(m.d_model),
                 static_cast<long long>(m.seq_len), static_cast<long long>(m.seq_len),
                 static_cast<long long>(m.vocab_size));
  // GPT-2's tokenizer ends documents with token 50256.
  if (m.vocab_size == 50257) s += "  \"bos_token_id\": 50256,\n  \"eos_token_id\": 50256,\n";
  s += "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n";
  s += strprintf("  \"initializer_range\": %.17g,\n", m.init_std);
  s += std::string("  \"tie_word_embeddings\": true,\n  \"torch_dtype\": \"") + dtype + "\"\n}\n";
  return s;
}

}  // namespace

const char* weights_format_name(WeightsFormat f) {
  switch (f) {
    case WeightsFormat::lamina: return "lamina checkpoint";
    case WeightsFormat::huggingface: return "HuggingFace safetensors";
    case WeightsFormat::llmc: return "llm.c model file";
  }
  return "?";
}

std::unique_ptr<WeightsSource> open_weights(const std::string& path) {
  std::error_code ec;
  if (!fs::exists(path, ec)) throw InputError(path + ": no such file or directory");
  if (fs::is_directory(path, ec)) return std::make_unique<SafetensorsSource>(path);
  std::uint8_t head[8] = {0};
  {
    const MappedFile f(path);
    if (f.size() >= 8) std::memcpy(head, f.data(), 8);
    if (f.size() >= 8 && std::memcmp(head, "\x89HDF\r\n\x1a\n", 8) == 0) {
      return std::make_unique<CheckpointSource>(path);
    }
    if (is_llmc_model_file(f.data(), f.size())) return std::make_unique<LlmcSource>(path);
  }
  return std::make_unique<SafetensorsSource>(path);
}

std::vector<float> fetch_tensor(const WeightsSource& source, const std::string& name,
                                const std::vector<std::int64_t>& shape) {
  WeightsTensor t = source.tensor(name);
  if (t.shape == shape) return std::move(t.values);
  if (name == "wpe" && t.shape.size() == 2 && shape.size() == 2 && t.shape[1] == shape[1] && t.shape[0] > shape[0]) {
    t.values.resize(static_cast<std::size_t>(shape[0] * shape[1]));
    return std::move(t.values);
  }
  throw InputError(source.path() + ": tensor '" + name + "' has shape " + shape_string(t.shape) + ", the model needs " +
                   shape_string(shape));
}

void check_weights_model(const WeightsSource& source, const ModelConfig& m) {
  // The rest (width, vocabulary, context) shows in the tensors' shapes, named as they are read.
  const ModelConfig& f = source.model();
  std::string diff;
  if (f.layers != m.layers) {
    diff = strprintf("model.layers %lld in the file (blocks h.0 to h.%lld), %lld in the deck",
                     static_cast<long long>(f.layers), static_cast<long long>(f.layers - 1), static_cast<long long>(m.layers));
  }
  if (f.heads != 0 && f.heads != m.heads) {
    diff += strprintf("%smodel.heads %lld in the file, %lld in the deck", diff.empty() ? "" : "; ",
                      static_cast<long long>(f.heads), static_cast<long long>(m.heads));
  }
  ModelConfig file = f;  // a file that does not say its heads has the deck's
  if (file.heads == 0) file.heads = m.heads;
  if (block_signature(file) != block_signature(m)) {
    diff += strprintf("%sthe block %s in the file, %s in the deck", diff.empty() ? "" : "; ",
                      block_signature(file).c_str(), block_signature(m).c_str());
  }
  if (!diff.empty()) throw InputError(source.path() + " (" + source.describe() + ") does not fit the deck's model: " + diff);
}

WeightsFormat weights_format_of(const std::string& out) {
  const auto ends = [&](const char* s) {
    const std::size_t n = std::strlen(s);
    return out.size() >= n && out.compare(out.size() - n, n, s) == 0;
  };
  if (ends(".h5")) return WeightsFormat::lamina;
  if (ends(".bin")) return WeightsFormat::llmc;
  return WeightsFormat::huggingface;
}

std::vector<std::string> write_weights(const std::string& out, const WeightsSource& source, const ModelConfig& m,
                                       const WeightsOutput& options) {
  check_weights_model(source, m);
  if (options.format != WeightsFormat::lamina && !gpt2_block(m)) {
    throw InputError(out + ": HuggingFace and llm.c files hold GPT-2's block here; this model's (" +
                     block_signature(m) + ") converts to a lamina checkpoint (.h5) only, for now");
  }
  const ParamLayout layout = ParamLayout::of(m);
  const auto get = [&](const TensorSpec& t) { return fetch_tensor(source, t.name, t.global_shape); };
  if (options.format == WeightsFormat::llmc) {
    std::map<std::string, const TensorSpec*> specs;
    for (const LayerSpec& l : layout.layers()) {
      for (const TensorSpec& t : l.tensors) specs[t.name] = &t;
    }
    write_llmc_model(out, m, options.type, [&](const std::string& name) { return get(*specs.at(name)); });
    return {out};
  }
  if (options.format == WeightsFormat::lamina) {
    if (options.type != StoredFloat::f32) throw InputError(out + ": lamina checkpoints hold float32 weights");
    CheckpointWriter writer(out, MPI_COMM_SELF);
    for (const char* prefix : {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"}) {
      for (const LayerSpec& l : layout.layers()) {
        for (const TensorSpec& t : l.tensors) {
          std::vector<float> values =
              prefix[0] == 'm' ? get(t) : std::vector<float>(static_cast<std::size_t>(t.numel()), 0.0f);
          TensorSlab slab;
          slab.name = prefix + t.name;
          slab.global_shape = t.global_shape;
          slab.local_shape = t.global_shape;
          slab.pieces.push_back({std::vector<std::int64_t>(t.global_shape.size(), 0), t.global_shape});
          slab.data = values.data();
          writer.write(slab);
        }
      }
    }
    CheckpointMeta meta;
    meta.deck = "# converted from " + source.path() + " (" + source.describe() + ") by lamina convert\n";
    meta.layout = "converted";
    meta.model = model_signature(m);
    if (!writer.first_nonfinite().empty()) {
      throw InputError(source.path() + ": tensor '" + writer.first_nonfinite() + "' holds values that are not finite");
    }
    writer.commit(meta, 1);
    return {out};
  }
  // HuggingFace: GPT2LMHeadModel's names, as save_pretrained writes them.
  const bool one_file = out.size() > 12 && out.compare(out.size() - 12, 12, ".safetensors") == 0;
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsEntry> entries;
  for (const LayerSpec& l : layout.layers()) {
    for (const TensorSpec& t : l.tensors) {
      values.push_back(get(t));
      const std::string key = t.name == "wte" || t.name == "wpe" ? t.name + ".weight" : t.name;
      entries.push_back({"transformer." + key, t.global_shape, nullptr});
    }
  }
  for (std::size_t i = 0; i < entries.size(); ++i) entries[i].values = values[i].data();
  const std::map<std::string, std::string> metadata = {{"format", "pt"}};
  if (one_file) {
    write_safetensors(out, entries, options.type, metadata);
    return {out};
  }
  std::error_code ec;
  fs::create_directories(out, ec);
  if (ec) throw RunError(out + ": cannot create the directory: " + ec.message());
  // Shards in tensor order, each up to max_shard_bytes (a bigger tensor alone).
  std::vector<std::vector<SafetensorsEntry>> shards(1);
  std::int64_t in_shard = 0, total = 0;
  for (const auto& e : entries) {
    const std::int64_t b = safetensors_bytes(e.shape, options.type);
    if (options.max_shard_bytes > 0 && in_shard > 0 && in_shard + b > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(e);
    in_shard += b;
    total += b;
  }
  std::vector<std::string> written;
  if (shards.size() == 1) {
    write_safetensors(out + "/model.safetensors", entries, options.type, metadata);
    written.push_back(out + "/model.safetensors");
    fs::remove(out + "/model.safetensors.index.json", ec);  // a stale index would shadow the new file
  } else {
    fs::remove(out + "/model.safetensors", ec);  // loaders would take it before the index
    std::string map;
    for (std::size_t s = 0; s < shards.size(); ++s) {
      const std::string name = strprintf("model-%05zu-of-%05zu.safetensors", s + 1, shards.size());
      write_safetensors(out + "/" + name, shards[s], options.type, metadata);
      written.push_back(out + "/" + name);
      for (const auto& e : shards[s]) map += strprintf("%s    \"%s\": \"%s\"", map.empty() ? "" : ",\n", e.name.c_str(), name.c_str());
    }
    const std::string index = out + "/model.safetensors.index.json";
    write_text_file(index, strprintf("{\n  \"metadata\": {\"total_size\": %lld},\n  \"weight_map\": {\n%s\n  }\n}\n",
                                     static_cast<long long>(total), map.c_str()));
    written.push_back(index);
  }
  write_text_file(out + "/config.json", hf_config(m, options.type));
  written.push_back(out + "/config.json");
  return written;
}

}  // namespace lamina
