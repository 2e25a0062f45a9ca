#include "lamina/io/model_weights.hpp"

#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <functional>
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
    slab.pieces.push_back({std::vector<std::int64_t>(t.shape.size(), 0), t.shape, {}});
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
    for (const auto& entry : index_) {  // not a structured binding: the lambda below captures it
      const std::string &key = entry.first, &file = entry.second;
      const auto shard = std::find_if(shards_.begin(), shards_.end(), [&](const auto& s) { return s->path() == file; });
      if (shard != shards_.end() && (*shard)->tensors().count(key) == 0) {
        throw InputError(index_path_ + ": weight_map[\"" + key + "\"] names " + fs::path(file).filename().string() +
                         ", which does not hold it (a stale or edited index?)");
      }
    }
    for (const auto& shard : shards_) {
      for (const auto& kv : shard->tensors()) llama_ = llama_ || kv.first.rfind("model.", 0) == 0;
    }
    if (llama_) {
      index_llama(path);
      read_llama_config(dir + "/config.json");
      return;
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
    if (llama_) return llama_tensor(name);
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

  // HuggingFace's Llama: where_ maps its own keys. Every key must be one of
  // LlamaForCausalLM's (the rotary inverse frequencies older files carry are left out).
  void index_llama(const std::string& path) {
    std::set<std::int64_t> blocks;
    static const char* const kBlock[] = {"input_layernorm.weight", "post_attention_layernorm.weight",
                                         "self_attn.q_proj.weight", "self_attn.k_proj.weight",
                                         "self_attn.v_proj.weight", "self_attn.o_proj.weight",
                                         "mlp.gate_proj.weight",   "mlp.up_proj.weight",
                                         "mlp.down_proj.weight"};
    for (std::size_t s = 0; s < shards_.size(); ++s) {
      for (const auto& [key, t] : shards_[s]->tensors()) {
        bool known = key == "model.embed_tokens.weight" || key == "model.norm.weight" || key == "lm_head.weight";
        if (key.rfind("model.layers.", 0) == 0) {
          const std::size_t dot = key.find('.', 13);
          const std::string index = key.substr(13, dot == std::string::npos ? 0 : dot - 13);
          const std::string rest = dot == std::string::npos ? "" : key.substr(dot + 1);
          if (rest == "self_attn.rotary_emb.inv_freq") continue;
          if (!index.empty() && index.find_first_not_of("0123456789") == std::string::npos && index.size() < 7) {
            for (const char* b : kBlock) known = known || rest == b;
            if (known) blocks.insert(std::atoll(index.c_str()));
          }
        }
        if (!known) {
          throw InputError(shards_[s]->path() + ": tensor '" + key + "' is not part of a Llama (LlamaForCausalLM" +
                           (key.find("bias") != std::string::npos ? " without biases" : "") + ")");
        }
        if (!where_.emplace(key, std::make_pair(s, key)).second) {
          throw InputError(path + ": tensor '" + key + "' is stored twice");
        }
      }
    }
    for (const char* needed : {"model.embed_tokens.weight", "model.norm.weight"}) {
      if (where_.count(needed) == 0) throw InputError(path + ": no tensor '" + needed + "' (is this a Llama?)");
    }
    const auto& embed = raw("model.embed_tokens.weight");
    if (embed.shape.size() != 2) throw InputError(path + ": model.embed_tokens.weight must be a matrix");
    model_.vocab_size = embed.shape[0];
    model_.d_model = embed.shape[1];
    model_.layers = static_cast<std::int64_t>(blocks.size());
    if (!blocks.empty() && (*blocks.begin() != 0 || *blocks.rbegin() != model_.layers - 1)) {
      throw InputError(path + ": the blocks model.layers.N are not numbered 0 to " + std::to_string(model_.layers - 1));
    }
    for (std::int64_t i = 0; i < model_.layers; ++i) {
      for (const char* b : kBlock) {
        const std::string key = "model.layers." + std::to_string(i) + "." + b;
        if (where_.count(key) == 0) throw InputError(path + ": no tensor '" + key + "'");
      }
    }
    if (model_.layers > 0) {
      const auto& gate = raw("model.layers.0.mlp.gate_proj.weight");
      if (gate.shape.size() == 2) model_.ffn_hidden = gate.shape[0];
    }
    model_.parts.norm = NormKind::rmsnorm;
    model_.parts.position = PositionKind::rotary;
    model_.parts.mlp = MlpKind::swiglu;
    model_.parts.bias = false;
    dtype_ = embed.dtype;
  }

  // LlamaForCausalLM's configuration: what the tensors cannot say (heads, key/value heads,
  // the norm's epsilon, the rotary base and scaling) is read from it, so it must be there.
  void read_llama_config(const std::string& path) {
    std::error_code ec;
    if (!fs::exists(path, ec)) {
      throw InputError(path_ + ": a Llama's safetensors need their config.json beside them (heads, key/value heads, "
                               "rms_norm_eps, rope_theta)");
    }
#if defined(LAMINA_HAVE_NLOHMANN_JSON)
    const nlohmann::json j = read_json(path, "model configuration");
    config_ = path;
    const auto bad = [&](const std::string& what) { return InputError(path + ": " + what); };
    if (!j.is_object()) throw bad("not a JSON object");
    if (j.contains("model_type") && j["model_type"] != "llama") {
      throw bad("model_type " + j["model_type"].dump() + " with Llama's tensor names: lamina reads \"llama\"");
    }
    const auto integer = [&](const char* key) {
      if (!j.contains(key) || !j[key].is_number_integer() || j[key].get<std::int64_t>() < 1) {
        throw bad(std::string("needs ") + key + ", a positive integer");
      }
      return j[key].get<std::int64_t>();
    };
    const auto number = [&](const nlohmann::json& o, const char* key, double def) {
      if (!o.contains(key)) return def;
      if (!o[key].is_number() || !(o[key].get<double>() > 0.0)) throw bad(std::string(key) + " must be a positive number");
      return o[key].get<double>();
    };
    const auto count = [&](const char* key, std::int64_t tensors) {
      if (j.contains(key) && (!j[key].is_number_integer() || j[key].get<std::int64_t>() != tensors)) {
        throw bad(strprintf("%s = %s, but the tensors say %lld", key, j[key].dump().c_str(), static_cast<long long>(tensors)));
      }
    };
    count("num_hidden_layers", model_.layers);
    count("hidden_size", model_.d_model);
    count("vocab_size", model_.vocab_size);
    count("intermediate_size", model_.ffn_hidden);
    model_.heads = integer("num_attention_heads");
    model_.kv_heads = j.contains("num_key_value_heads") ? integer("num_key_value_heads") : model_.heads;
    if (model_.d_model % model_.heads != 0 || model_.heads % model_.kv_heads != 0 ||
        (model_.d_model / model_.heads) % 2 != 0) {
      throw bad(strprintf("num_attention_heads = %lld and num_key_value_heads = %lld do not fit hidden_size = %lld "
                          "(whole heads of an even width, whole groups of query heads)",
                          static_cast<long long>(model_.heads), static_cast<long long>(model_.kv_heads),
                          static_cast<long long>(model_.d_model)));
    }
    if (j.contains("head_dim") && !j["head_dim"].is_null() && j["head_dim"] != model_.d_model / model_.heads) {
      throw bad("head_dim = " + j["head_dim"].dump() + ": lamina's heads are hidden_size / num_attention_heads wide");
    }
    model_.seq_len = j.contains("max_position_embeddings") ? integer("max_position_embeddings") : 2048;  // LlamaConfig's default
    if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
      throw bad("hidden_act " + j["hidden_act"].dump() + ": lamina's SwiGLU gates with SiLU (\"silu\")");
    }
    for (const char* key : {"attention_bias", "mlp_bias"}) {
      if (j.contains(key) && j[key] != false) throw bad(std::string(key) + " = true: lamina's Llama has no biases");
    }
    // LlamaConfig's default is untied; a file without lm_head.weight was saved tied.
    model_.tie_embeddings =
        j.contains("tie_word_embeddings") ? j["tie_word_embeddings"] == true : where_.count("lm_head.weight") == 0;
    if (!model_.tie_embeddings && where_.count("lm_head.weight") == 0) {
      throw bad("tie_word_embeddings = false, but the files hold no lm_head.weight for the untied output layer");
    }
    model_.parts.norm_eps = number(j, "rms_norm_eps", 1e-6);
    model_.parts.rope_theta = number(j, "rope_theta", 10000.0);
    if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
      const nlohmann::json& r = j["rope_scaling"];
      const nlohmann::json type = r.is_object() ? (r.contains("rope_type") ? r["rope_type"] : r.value("type", nlohmann::json())) : nlohmann::json();
      if (type != "llama3") {
        throw bad("rope_scaling " + r.dump() + ": lamina scales rotary frequencies as Llama 3 does (rope_type \"llama3\") only");
      }
      RotaryScaling& sc = model_.parts.rope_scaling;
      sc.factor = number(r, "factor", 0.0);
      sc.low_freq_factor = number(r, "low_freq_factor", 1.0);
      sc.high_freq_factor = number(r, "high_freq_factor", 4.0);
      sc.original_context = number(r, "original_max_position_embeddings", 8192.0);
      if (sc.factor <= 0.0 || sc.high_freq_factor <= sc.low_freq_factor) {
        throw bad("rope_scaling " + r.dump() + ": needs a factor and high_freq_factor > low_freq_factor");
      }
    }
#else
    throw InputError(path + ": this lamina was built without nlohmann-json, so it cannot read config.json");
#endif
  }

  // A HuggingFace tensor, (out, in) as nn.Linear stores it.
  WeightsTensor hf(const std::string& key) const {
    const auto it = where_.find(key);
    if (it == where_.end()) throw InputError(path_ + ": no tensor '" + key + "'");
    const SafetensorsFile& f = *shards_[it->second.first];
    return {f.tensor(key).shape, f.floats(key)};
  }

  // lamina's tensor of a Llama: matrices (in, out), c_attn = [q | k | v], c_fc = [gate | up].
  WeightsTensor llama_tensor(const std::string& name) const {
    if (name == "lm_head" && !model_.tie_embeddings) return hf("lm_head.weight");
    if (name == "wte") {
      WeightsTensor t = hf("model.embed_tokens.weight");
      if (model_.tie_embeddings && where_.count("lm_head.weight") != 0) {
        const WeightsTensor head = hf("lm_head.weight");
        if (head.shape != t.shape || std::memcmp(head.values.data(), t.values.data(), t.values.size() * 4) != 0) {
          throw InputError(path_ + ": lm_head.weight differs from model.embed_tokens.weight, but config.json says "
                                   "tie_word_embeddings = true");
        }
      }
      return t;
    }
    if (name == "ln_f.weight") return hf("model.norm.weight");
    const std::size_t dot = name.find('.', 2);
    if (name.rfind("h.", 0) != 0 || dot == std::string::npos) throw InputError(path_ + ": no tensor '" + name + "'");
    const std::string layer = "model.layers." + name.substr(2, dot - 2) + ".", part = name.substr(dot + 1);
    if (part == "ln_1.weight") return hf(layer + "input_layernorm.weight");
    if (part == "ln_2.weight") return hf(layer + "post_attention_layernorm.weight");
    // Columns of the (in, out) result, each matrix's rows after the previous one's.
    const auto transposed = [&](const std::vector<std::string>& keys) {
      std::vector<WeightsTensor> ts;
      std::int64_t in = -1, out = 0;
      for (const std::string& k : keys) {
        ts.push_back(hf(layer + k));
        const auto& sh = ts.back().shape;
        if (sh.size() != 2 || (in >= 0 && sh[1] != in)) {
          throw InputError(path_ + ": tensor '" + layer + k + "' has shape " + shape_string(sh) +
                           ", not (rows, " + std::to_string(in) + ")");
        }
        in = sh[1];
        out += sh[0];
      }
      WeightsTensor r{{in, out}, std::vector<float>(static_cast<std::size_t>(in * out))};
      std::int64_t col = 0;
      for (const WeightsTensor& t : ts) {
        const std::int64_t rows = t.shape[0];
        for (std::int64_t o = 0; o < rows; ++o) {
          for (std::int64_t i = 0; i < in; ++i) r.values[static_cast<std::size_t>(i * out + col + o)] = t.values[static_cast<std::size_t>(o * in + i)];
        }
        col += rows;
      }
      return r;
    };
    if (part == "attn.c_attn.weight") {
      return transposed({"self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight"});
    }
    if (part == "attn.c_proj.weight") return transposed({"self_attn.o_proj.weight"});
    if (part == "mlp.c_fc.weight") return transposed({"mlp.gate_proj.weight", "mlp.up_proj.weight"});
    if (part == "mlp.c_proj.weight") return transposed({"mlp.down_proj.weight"});
    throw InputError(path_ + ": a Llama has no tensor '" + name + "'");
  }

  bool llama_ = false;  // LlamaForCausalLM's names, not GPT-2's
  std::string path_, config_, dtype_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;
  std::string index_path_;                                  // the sharded index read, if any
  std::vector<std::pair<std::string, std::string>> index_;  // its weight_map: tensor, shard path
  std::map<std::string, std::pair<std::size_t, std::string>> where_;  // lamina name -> (shard, key)
  ModelConfig model_;
};

// ---------------------------------------------------------------------------------------
// Writing

// LlamaForCausalLM's tensors from lamina's: nn.Linear's (out, in) matrices, c_attn split
// into q, k and v, c_fc into gate and up, in the order of its state_dict; the head only
// where it is untied.
void llama_entries(const ParamLayout& layout, const std::function<std::vector<float>(const TensorSpec&)>& get,
                   std::vector<std::vector<float>>& values, std::vector<SafetensorsEntry>& entries) {
  // Columns [begin, begin + n) of an (in, out) matrix as an (n, in) one.
  const auto rows = [](const std::vector<float>& m, std::int64_t in, std::int64_t out, std::int64_t begin,
                       std::int64_t n) {
    std::vector<float> r(static_cast<std::size_t>(n * in));
    for (std::int64_t o = 0; o < n; ++o) {
      for (std::int64_t i = 0; i < in; ++i) r[static_cast<std::size_t>(o * in + i)] = m[static_cast<std::size_t>(i * out + begin + o)];
    }
    return r;
  };
  const auto add = [&](const std::string& key, std::vector<std::int64_t> shape, std::vector<float> v) {
    values.push_back(std::move(v));
    entries.push_back({key, std::move(shape), nullptr});
  };
  const auto spec = [&](const std::string& name) -> const TensorSpec& {
    int layer = 0;
    const TensorSpec* t = nullptr;
    if (!layout.find(name, layer, t)) throw std::logic_error("no tensor " + name);
    return *t;
  };
  const TensorSpec& wte = spec("wte");
  add("model.embed_tokens.weight", wte.global_shape, get(wte));
  const std::int64_t layers = layout.num_layers() - 2, C = wte.global_shape[1];
  for (std::int64_t i = 0; i < layers; ++i) {
    const std::string h = "h." + std::to_string(i) + ".", key = "model.layers." + std::to_string(i) + ".";
    const TensorSpec& qkv = spec(h + "attn.c_attn.weight");
    const std::vector<float> w = get(qkv);
    const std::int64_t Q = qkv.tp_blocks.at(0), KV = qkv.tp_blocks.at(1), W = qkv.global_shape[1];
    add(key + "self_attn.q_proj.weight", {Q, C}, rows(w, C, W, 0, Q));
    add(key + "self_attn.k_proj.weight", {KV, C}, rows(w, C, W, Q, KV));
    add(key + "self_attn.v_proj.weight", {KV, C}, rows(w, C, W, Q + KV, KV));
    const TensorSpec& proj = spec(h + "attn.c_proj.weight");
    add(key + "self_attn.o_proj.weight", {C, Q}, rows(get(proj), Q, C, 0, C));
    const TensorSpec& fc = spec(h + "mlp.c_fc.weight");
    const std::int64_t F = fc.global_shape[1] / 2;
    const std::vector<float> f = get(fc);
    add(key + "mlp.gate_proj.weight", {F, C}, rows(f, C, 2 * F, 0, F));
    add(key + "mlp.up_proj.weight", {F, C}, rows(f, C, 2 * F, F, F));
    add(key + "mlp.down_proj.weight", {C, F}, rows(get(spec(h + "mlp.c_proj.weight")), F, C, 0, C));
    add(key + "input_layernorm.weight", {C}, get(spec(h + "ln_1.weight")));
    add(key + "post_attention_layernorm.weight", {C}, get(spec(h + "ln_2.weight")));
  }
  add("model.norm.weight", {C}, get(spec("ln_f.weight")));
  int layer = 0;
  const TensorSpec* head = nullptr;
  if (layout.find("lm_head", layer, head)) add("lm_head.weight", head->global_shape, get(*head));
}

std::string llama_config(const ModelConfig& m, const char* dtype) {
  const BlockParts& p = m.parts;
  std::string s = "{\n  \"architectures\": [\"LlamaForCausalLM\"],\n  \"model_type\": \"llama\",\n";
  s += strprintf("  \"num_hidden_layers\": %lld,\n  \"hidden_size\": %lld,\n  \"intermediate_size\": %lld,\n"
                 "  \"num_attention_heads\": %lld,\n  \"num_key_value_heads\": %lld,\n"
                 "  \"max_position_embeddings\": %lld,\n  \"vocab_size\": %lld,\n",
                 static_cast<long long>(m.layers), static_cast<long long>(m.d_model),
                 static_cast<long long>(m.mlp_hidden()), static_cast<long long>(m.heads),
                 static_cast<long long>(m.key_value_heads()), static_cast<long long>(m.seq_len),
                 static_cast<long long>(m.vocab_size));
  s += strprintf("  \"hidden_act\": \"silu\",\n  \"rms_norm_eps\": %.17g,\n  \"rope_theta\": %.17g,\n", p.norm_eps,
                 p.rope_theta);
  if (p.rope_scaling.factor > 0.0) {
    const RotaryScaling& r = p.rope_scaling;
    s += strprintf("  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, "
                   "\"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %.17g},\n",
                   r.factor, r.low_freq_factor, r.high_freq_factor, r.original_context);
  }
  s += "  \"attention_bias\": false,\n  \"mlp_bias\": false,\n";
  s += strprintf("  \"initializer_range\": %.17g,\n", m.init_std);
  s += std::string("  \"tie_word_embeddings\": ") + (m.tie_embeddings ? "true" : "false") +
       ",\n  \"torch_dtype\": \"" + dtype + "\"\n}\n";
  return s;
}

std::string hf_config(const ModelConfig& m, StoredFloat type) {
  const char* dtype = type == StoredFloat::bf16 ? "bfloat16" : type == StoredFloat::f16 ? "float16" : "float32";
  if (llama_block(m)) return llama_config(m, dtype);
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
  if (options.format == WeightsFormat::llmc && !gpt2_block(m)) {
    throw InputError(out + ": llm.c model files hold GPT-2's block; this model's (" + block_signature(m) +
                     ") converts to a lamina checkpoint (.h5) or HuggingFace's Llama");
  }
  if (options.format == WeightsFormat::huggingface && !gpt2_block(m) && !llama_block(m)) {
    throw InputError(out + ": HuggingFace files hold GPT-2's block or Llama's; this model's (" + block_signature(m) +
                     ") converts to a lamina checkpoint (.h5)");
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
          slab.pieces.push_back({std::vector<std::int64_t>(t.global_shape.size(), 0), t.global_shape, {}});
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
  // HuggingFace: GPT2LMHeadModel's or LlamaForCausalLM's names, as save_pretrained writes them.
  const bool one_file = out.size() > 12 && out.compare(out.size() - 12, 12, ".safetensors") == 0;
  std::vector<std::vector<float>> values;
  std::vector<SafetensorsEntry> entries;
  if (llama_block(m)) {
    llama_entries(layout, get, values, entries);
  } else {
    for (const LayerSpec& l : layout.layers()) {
      for (const TensorSpec& t : l.tensors) {
        values.push_back(get(t));
        const std::string key = t.name == "wte" || t.name == "wpe" ? t.name + ".weight" : t.name;
        entries.push_back({"transformer." + key, t.global_shape, nullptr});
      }
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
