#include "lamina/core/deck.hpp"

#include <algorithm>
#include <cstdlib>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <toml++/toml.h>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/limits.hpp"
#include "lamina/core/text_file.hpp"

namespace lamina {

const std::vector<std::string>& planner_keys() {
  static const std::vector<std::string> keys = {
      "parallel.dp",          "parallel.cp",        "parallel.tp",       "parallel.pp",       "parallel.zero",
      "parallel.schedule",    "parallel.virtual_stages", "parallel.layered", "parallel.sequence_parallel",
      "data.micro_batch_size", "memory.activations", "memory.params",    "memory.optimizer"};
  return keys;
}

std::string Deck::where(const std::string& key) const {
  auto it = locations.find(key);
  if (it == locations.end()) it = locations.find(key.substr(0, key.find('.')));  // the key's table
  return it == locations.end() ? source : it->second;
}

const char* attention_products_name(AttentionProducts a) {
  switch (a) {
    case AttentionProducts::in_place: return "in_place";
    case AttentionProducts::staged: return "staged";
    case AttentionProducts::fused: return "fused";
  }
  return "?";
}

const char* data_format_name(DataFormat f) {
  switch (f) {
    case DataFormat::text: return "text";
    case DataFormat::megatron: return "megatron";
    case DataFormat::llmc: return "llmc";
    case DataFormat::synthetic: return "synthetic";
  }
  return "?";
}

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

bool parse_bytes(const std::string& text, std::int64_t& bytes) {
  std::string s;
  for (const char c : text) {
    if (!std::isspace(static_cast<unsigned char>(c))) s += c;
  }
  if (s.empty()) return false;
  std::size_t pos = 0;
  double value = 0;
  try {
    value = std::stod(s, &pos);
  } catch (...) {
    return false;
  }
  std::string unit = s.substr(pos);
  std::transform(unit.begin(), unit.end(), unit.begin(), [](unsigned char c) { return std::tolower(c); });
  static const std::map<std::string, double> units = {
      {"", 1.0},         {"b", 1.0},           {"k", 1e3},          {"kb", 1e3},  {"kib", 1024.0},
      {"m", 1e6},        {"mb", 1e6},          {"mib", 1048576.0},  {"g", 1e9},   {"gb", 1e9},
      {"gib", 1073741824.0}, {"t", 1e12},      {"tb", 1e12},        {"tib", 1099511627776.0}};
  const auto it = units.find(unit);
  if (it == units.end() || !(value >= 0) || !std::isfinite(value)) return false;
  const double b = value * it->second;
  if (b > 9.2e18) return false;
  bytes = static_cast<std::int64_t>(std::llround(b));
  return true;
}

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  std::string best;
  std::size_t best_d = std::numeric_limits<std::size_t>::max();
  for (const auto& c : candidates) {
    std::size_t d = edit_distance(word, c);
    // "lr_rate" -> "lr": a candidate that is a prefix or a part of the word is a strong hint.
    if (word.find(c) != std::string::npos || c.find(word) != std::string::npos) d = std::min<std::size_t>(d, 1);
    if (d < best_d) {
      best_d = d;
      best = c;
    }
  }
  const std::size_t limit = std::max<std::size_t>(2, word.size() / 2);
  return best_d <= limit ? best : std::string();
}

namespace {

std::string describe_node(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "a string (\"" + *n.value<std::string>() + "\")";
    case toml::node_type::integer: return "an integer (" + std::to_string(*n.value<std::int64_t>()) + ")";
    case toml::node_type::floating_point: return strprintf("a float (%g)", *n.value<double>());
    case toml::node_type::boolean: return std::string("a boolean (") + (*n.value<bool>() ? "true" : "false") + ")";
    case toml::node_type::array: return "an array";
    case toml::node_type::table: return "a table";
    default: return "a date/time";
  }
}

struct Section {
  std::string name;
  std::vector<std::string> keys;
};

// The schema: every section and key the deck accepts, for unknown-key suggestions.
const std::vector<Section>& schema() {
  static const std::vector<Section> s = {
      {"model",
       {"layers", "d_model", "heads", "seq_len", "vocab_size", "init_std", "attention", "init", "arch", "kv_heads",
        "ffn_hidden", "norm", "norm_eps", "position", "rope_theta", "rope_scaling", "rope_low_freq_factor",
        "rope_high_freq_factor", "rope_original_context", "mlp", "tie_embeddings", "loss_chunk"}},
      {"data", {"format", "path", "batch_size", "micro_batch_size", "shuffle", "eval_path"}},
      {"train", {"steps", "seed", "precision", "skip_nonfinite", "max_skipped", "eval_every", "eval_batches"}},
      {"optimizer",
       {"lr", "min_lr", "weight_decay", "beta1", "beta2", "eps", "grad_clip", "warmup_steps", "decay_steps",
        "schedule", "subgroup_size", "decay_biases_and_norms"}},
      {"parallel",
       {"dp", "cp", "tp", "pp", "zero", "schedule", "virtual_stages", "layered", "cost_forward", "cost_backward",
        "cost_p2p", "backend", "timeout", "host_copies", "mpi_device_buffers", "tp_sums", "sequence_parallel"}},
      {"memory",
       {"device_budget", "host_budget", "activations", "params", "optimizer", "dos_split", "dos_host_rate",
        "dos_device_rate", "dos_h2d", "dos_d2h"}},
      {"checkpoint", {"dir", "every", "keep", "resume", "save_final", "newer", "async"}},
      {"output", {"dir", "log_every", "peak_tflops", "sample_tokens", "sample_temperature", "trace_step"}},
  };
  return s;
}

std::vector<std::string> section_names() {
  std::vector<std::string> out;
  for (const auto& s : schema()) out.push_back(s.name);
  return out;
}

// Reads one deck: typed getters record the resolved value of every key and collect
// every problem (not just the first) as "file:line:col: message".
class DeckReader {
 public:
  DeckReader(toml::table& root, std::string file, std::map<std::string, std::string> set_origins)
      : root_(root), file_(std::move(file)), set_origins_(std::move(set_origins)) {}

  void check_structure() {
    for (auto&& [k, node] : root_) {
      const std::string key(k.str());
      const auto names = section_names();
      if (std::find(names.begin(), names.end(), key) == names.end()) {
        std::string hint = closest(key, names);
        error(where_key(k, key), "unknown section '" + key + "'" +
                                          (hint.empty() ? " (sections: " + join(names) + ")"
                                                        : " (did you mean '" + hint + "'?)"));
      } else if (!node.is_table()) {
        error(where_node(node, key), "'" + key + "' must be a table ([" + key + "]), got " + describe_node(node));
      }
    }
    for (const auto& sec : schema()) {
      const toml::table* t = root_[sec.name].as_table();
      if (t == nullptr) continue;
      for (auto&& [k, node] : *t) {
        const std::string key(k.str());
        if (std::find(sec.keys.begin(), sec.keys.end(), key) != sec.keys.end()) continue;
        std::string hint = closest(key, sec.keys);
        std::string other;
        for (const auto& s2 : schema()) {
          if (s2.name != sec.name && std::find(s2.keys.begin(), s2.keys.end(), key) != s2.keys.end()) other = s2.name;
        }
        std::string msg = "unknown key '" + key + "' in " + sec.name;
        if (!hint.empty()) {
          msg += " (did you mean '" + hint + "'?)";
        } else if (!other.empty()) {
          msg += " (it belongs in [" + other + "])";
        } else {
          msg += " (keys: " + join(sec.keys) + ")";
        }
        error(where_key(k, sec.name + "." + key), msg);
      }
    }
  }

  const toml::node* find(const std::string& sec, const std::string& key) const {
    const toml::table* t = root_[sec].as_table();
    return t == nullptr ? nullptr : t->get(key);
  }

  // Location of a key's value: the deck position, or the --set argument that gave it.
  std::string where(const std::string& sec, const std::string& key) const {
    const toml::node* n = find(sec, key);
    if (n != nullptr) return where_node(*n, sec + "." + key);
    const toml::table* t = root_[sec].as_table();
    if (t != nullptr && t->source().begin.line > 0) {
      return strprintf("%s:%u:%u", file_.c_str(), t->source().begin.line, t->source().begin.column);
    }
    return file_;
  }

  void error(const std::string& where, const std::string& msg) { errors_.push_back(where + ": " + msg); }
  void error_at(const std::string& sec, const std::string& key, const std::string& msg) {
    error(where(sec, key), sec + "." + key + ": " + msg);
  }
  const std::vector<std::string>& errors() const { return errors_; }

  std::int64_t integer(const std::string& sec, const std::string& key, std::int64_t def, std::int64_t lo,
                       std::int64_t hi, bool required = false) {
    const toml::node* n = find(sec, key);
    std::int64_t v = def;
    if (n == nullptr) {
      if (required) missing(sec, key, "an integer");
    } else if (!n->is_integer()) {
      wrong_type(sec, key, *n, "an integer");
    } else {
      v = *n->value<std::int64_t>();
      if (v < lo || v > hi) {
        std::string range = hi == std::numeric_limits<std::int64_t>::max()
                                ? strprintf("must be >= %lld", static_cast<long long>(lo))
                                : strprintf("must be in [%lld, %lld]", static_cast<long long>(lo), static_cast<long long>(hi));
        error_at(sec, key, strprintf("%lld is out of range: ", static_cast<long long>(v)) + range);
        v = def;
      }
    }
    resolved(sec).insert_or_assign(key, v);
    return v;
  }

  // A float in [lo, hi] (or (lo, hi] when lo_open). Integers are accepted.
  double real(const std::string& sec, const std::string& key, double def, double lo, double hi, bool lo_open = false,
              bool required = false, bool hi_open = false) {
    const toml::node* n = find(sec, key);
    double v = def;
    if (n == nullptr) {
      if (required) missing(sec, key, "a number");
    } else if (!n->is_number()) {
      wrong_type(sec, key, *n, "a number");
    } else {
      v = *n->value<double>();
      const bool ok = std::isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
      if (!ok) {
        std::string range = std::isinf(hi) ? strprintf("must be %s %g", lo_open ? ">" : ">=", lo)
                                           : strprintf("must be in %s%g, %g%s", lo_open ? "(" : "[", lo, hi,
                                                       hi_open ? ")" : "]");
        error_at(sec, key, strprintf("%g is out of range: ", v) + range);
        v = def;
      }
    }
    resolved(sec).insert_or_assign(key, v);
    return v;
  }

  bool boolean(const std::string& sec, const std::string& key, bool def) {
    const toml::node* n = find(sec, key);
    bool v = def;
    if (n != nullptr) {
      if (!n->is_boolean()) {
        wrong_type(sec, key, *n, "a boolean (true or false)");
      } else {
        v = *n->value<bool>();
      }
    }
    resolved(sec).insert_or_assign(key, v);
    return v;
  }

  std::string string(const std::string& sec, const std::string& key, const std::string& def) {
    const toml::node* n = find(sec, key);
    std::string v = def;
    if (n != nullptr) {
      if (!n->is_string()) {
        wrong_type(sec, key, *n, "a string");
      } else {
        v = *n->value<std::string>();
        if (v.empty() && !def.empty()) error_at(sec, key, "is empty; leave the key out for its default, " + def);
      }
    }
    resolved(sec).insert_or_assign(key, v);
    return v;
  }

  std::string choice(const std::string& sec, const std::string& key, const std::string& def,
                     const std::vector<std::string>& allowed) {
    std::string v = string(sec, key, def);
    if (std::find(allowed.begin(), allowed.end(), v) == allowed.end()) {
      std::string hint = closest(v, allowed);
      error_at(sec, key, "'" + v + "' is not one of " + join(allowed, true) +
                             (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
      v = def;
      resolved(sec).insert_or_assign(key, v);
    }
    return v;
  }

  // A string or an array of strings.
  std::vector<std::string> strings(const std::string& sec, const std::string& key, bool required) {
    const toml::node* n = find(sec, key);
    std::vector<std::string> v;
    if (n == nullptr) {
      if (required) missing(sec, key, "a string or an array of strings");
    } else if (n->is_string()) {
      v.push_back(*n->value<std::string>());
    } else if (const toml::array* a = n->as_array()) {
      for (const auto& e : *a) {
        if (!e.is_string()) {
          wrong_type(sec, key, e, "a string or an array of strings");
          return v;
        }
        v.push_back(*e.value<std::string>());
      }
      if (v.empty()) error_at(sec, key, "the array is empty");
    } else {
      wrong_type(sec, key, *n, "a string or an array of strings");
    }
    for (const auto& s : v) {
      if (s.empty()) error_at(sec, key, "holds an empty string");
    }
    // An absent optional list stays absent: an empty array would not read back.
    if (!v.empty()) {
      toml::array out;
      for (const auto& s : v) out.push_back(s);
      resolved(sec).insert_or_assign(key, std::move(out));
    }
    return v;
  }

  // One of `allowed`, or an array of n of them (one per transformer block).
  std::vector<std::string> per_layer(const std::string& sec, const std::string& key, const std::string& def,
                                     const std::vector<std::string>& allowed, std::int64_t n) {
    const toml::node* node = find(sec, key);
    std::vector<std::string> v(static_cast<std::size_t>(std::max<std::int64_t>(n, 0)), def);
    auto check = [&](const std::string& x) {
      if (std::find(allowed.begin(), allowed.end(), x) != allowed.end()) return true;
      const std::string hint = closest(x, allowed);
      error_at(sec, key, "'" + x + "' is not one of " + join(allowed, true) +
                             (hint.empty() ? "" : " (did you mean '" + hint + "'?)"));
      return false;
    };
    if (node == nullptr) {
    } else if (node->is_string()) {
      const std::string x = *node->value<std::string>();
      if (check(x)) std::fill(v.begin(), v.end(), x);
    } else if (const toml::array* a = node->as_array()) {
      if (static_cast<std::int64_t>(a->size()) != n) {
        error_at(sec, key, strprintf("the list has %zu entries, model.layers = %lld blocks need one each", a->size(),
                                     static_cast<long long>(n)));
      } else {
        for (std::size_t i = 0; i < a->size(); ++i) {
          if (!(*a)[i].is_string()) {
            wrong_type(sec, key, (*a)[i], "a string or an array of strings");
            break;
          }
          const std::string x = *(*a)[i].value<std::string>();
          if (check(x)) v[i] = x;
        }
      }
    } else {
      wrong_type(sec, key, *node, "a string or an array of strings (one per block)");
    }
    const bool uniform = std::all_of(v.begin(), v.end(), [&](const std::string& x) { return x == v.front(); });
    if (uniform && !v.empty()) {
      resolved(sec).insert_or_assign(key, v.front());
    } else {
      toml::array out;
      for (const auto& x : v) out.push_back(x);
      resolved(sec).insert_or_assign(key, std::move(out));
    }
    return v;
  }

  // Bytes: an integer or a string such as "12GiB".
  std::int64_t bytes(const std::string& sec, const std::string& key, std::int64_t def) {
    const toml::node* n = find(sec, key);
    std::int64_t v = def;
    if (n != nullptr) {
      if (n->is_integer() && *n->value<std::int64_t>() >= 0) {
        v = *n->value<std::int64_t>();
      } else if (n->is_string() && parse_bytes(*n->value<std::string>(), v)) {
      } else {
        wrong_type(sec, key, *n, "a byte count (an integer >= 0 or a string such as \"12GiB\")");
        v = def;
      }
    }
    resolved(sec).insert_or_assign(key, v);
    return v;
  }

  void set_resolved(const std::string& key, const std::string& value) {
    const auto dot = key.find('.');
    resolved(key.substr(0, dot)).insert_or_assign(key.substr(dot + 1), value);
  }

  // Where every key that was given came from.
  std::map<std::string, std::string> locations() const {
    std::map<std::string, std::string> out;
    for (const auto& sec : schema()) {
      const toml::table* t = root_[sec.name].as_table();
      if (t != nullptr && t->source().begin.line > 0) {
        out[sec.name] = strprintf("%s:%u:%u", file_.c_str(), t->source().begin.line, t->source().begin.column);
      }
      for (const auto& key : sec.keys)
        if (const toml::node* n = find(sec.name, key)) out[sec.name + "." + key] = where_node(*n, sec.name + "." + key);
    }
    return out;
  }

  std::string resolved_toml() {
    std::ostringstream os;
    for (const auto& sec : schema()) {
      auto it = resolved_.find(sec.name);
      if (it == resolved_.end()) continue;
      os << "[" << sec.name << "]\n";
      for (const auto& key : sec.keys) {
        const toml::node* n = it->second.get(key);
        if (n == nullptr) continue;
        toml::table one;
        one.insert(key, *n);
        os << toml::toml_formatter(one) << "\n";
      }
      os << "\n";
    }
    return os.str();
  }

 private:
  toml::table& resolved(const std::string& sec) { return resolved_[sec]; }

  std::string where_node(const toml::node& n, const std::string& keypath) const {
    const auto it = set_origins_.find(keypath);
    if (it != set_origins_.end()) return "--set " + it->second;
    const auto& src = n.source();
    if (src.begin.line == 0) return file_;
    return strprintf("%s:%u:%u", file_.c_str(), src.begin.line, src.begin.column);
  }

  // Position of a key itself (for unknown keys), or the --set argument that added it.
  std::string where_key(const toml::key& k, const std::string& keypath) const {
    const auto it = set_origins_.find(keypath);
    if (it != set_origins_.end()) return "--set " + it->second;
    if (k.source().begin.line == 0) return file_;
    return strprintf("%s:%u:%u", file_.c_str(), k.source().begin.line, k.source().begin.column);
  }

  void missing(const std::string& sec, const std::string& key, const std::string& what) {
    error(where(sec, key), "missing required key " + sec + "." + key + " (" + what + ")");
  }

  void wrong_type(const std::string& sec, const std::string& key, const toml::node& n, const std::string& want) {
    error(where_node(n, sec + "." + key), sec + "." + key + " must be " + want + ", got " + describe_node(n));
  }

  static std::string join(const std::vector<std::string>& v, bool quote = false) {
    std::string out;
    for (std::size_t i = 0; i < v.size(); ++i) {
      if (i) out += ", ";
      out += quote ? "'" + v[i] + "'" : v[i];
    }
    return out;
  }

  toml::table& root_;
  std::string file_;
  std::map<std::string, std::string> set_origins_;
  std::vector<std::string> errors_;
  std::map<std::string, toml::table> resolved_;
};

std::string trim(const std::string& s) {
  const auto b = s.find_first_not_of(" \t");
  const auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? std::string() : s.substr(b, e - b + 1);
}

// Applies "section.key=value" overrides. The value is read as a TOML value when it
// parses as one (numbers, booleans, quoted strings, arrays) and as a bare string otherwise.
std::map<std::string, std::string> apply_overrides(toml::table& root, const std::vector<std::string>& overrides,
                                                   std::vector<std::string>& errors) {
  std::map<std::string, std::string> origins;
  for (const auto& ov : overrides) {
    const auto eq = ov.find('=');
    const std::string path = trim(eq == std::string::npos ? ov : ov.substr(0, eq));
    const auto dot = path.find('.');
    if (eq == std::string::npos || dot == std::string::npos || path.find('.', dot + 1) != std::string::npos ||
        dot == 0 || dot + 1 == path.size()) {
      errors.push_back("--set " + ov + ": expected section.key=value (for example --set optimizer.lr=1e-3)");
      continue;
    }
    const std::string sec = path.substr(0, dot), key = path.substr(dot + 1);
    const std::string text = trim(ov.substr(eq + 1));
    // One --set is one key: a value over several lines would read as more keys (or lose them).
    if (text.find_first_of(std::string("\n\r\0", 3)) != std::string::npos) {
      errors.push_back("--set " + ov.substr(0, ov.find_first_of(std::string("\n\r\0", 3))) +
                       "...: the value spans several lines (or holds a NUL); give one key per --set");
      continue;
    }
    toml::table parsed;
    try {
      parsed = toml::parse("v = " + text);
    } catch (const toml::parse_error&) {
      parsed = toml::table{{"v", text}};
    }
    if (root[sec] && !root[sec].is_table()) {
      errors.push_back("--set " + ov + ": '" + sec + "' is not a table in the deck");
      continue;
    }
    if (!root[sec]) {
      root.insert(sec, toml::table{});
      origins[sec] = ov;  // a section the deck does not have: its errors name this --set
    }
    root[sec].as_table()->insert_or_assign(key, *parsed.get("v"));
    origins[path] = ov;
  }
  return origins;
}

Deck read(toml::table& root, const std::string& file, const std::vector<std::string>& overrides) {
  std::vector<std::string> override_errors;
  auto origins = apply_overrides(root, overrides, override_errors);
  DeckReader r(root, file, origins);
  r.check_structure();
  // Keys the planner may choose, given as "auto": read as unset here (their defaults) and
  // listed, so that the planner fills them in before a plan is made.
  std::set<std::string> automatic;
  std::map<std::string, std::string> auto_locations;
  for (const std::string& key : planner_keys()) {
    const auto dot = key.find('.');
    toml::table* t = root[key.substr(0, dot)].as_table();
    const toml::node* n = t == nullptr ? nullptr : t->get(key.substr(dot + 1));
    if (n != nullptr && n->is_string() && *n->value<std::string>() == "auto") {
      automatic.insert(key);
      auto_locations[key] = r.where(key.substr(0, dot), key.substr(dot + 1));
      t->erase(key.substr(dot + 1));
    }
  }
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  constexpr double kInf = std::numeric_limits<double>::infinity();
  Deck d;
  d.source = file;

  auto& m = d.model;
  m.layers = r.integer("model", "layers", 0, 1, 100000, true);
  m.d_model = r.integer("model", "d_model", 0, 1, 1 << 20, true);
  m.heads = r.integer("model", "heads", 0, 1, 1 << 16, true);
  m.seq_len = r.integer("model", "seq_len", 0, 1, 1 << 24, true);
  // The block's parts: a preset (GPT-2's or Llama's), each part overridable on its own.
  const bool llama = r.choice("model", "arch", "gpt2", {"gpt2", "llama"}) == "llama";
  BlockParts& parts = m.parts;
  parts.norm = r.choice("model", "norm", llama ? "rmsnorm" : "layernorm", {"layernorm", "rmsnorm"}) == "rmsnorm"
                   ? NormKind::rmsnorm
                   : NormKind::layernorm;
  parts.norm_eps = r.real("model", "norm_eps", 1e-5, 0.0, 1.0, true);
  parts.position = r.choice("model", "position", llama ? "rotary" : "learned", {"learned", "rotary"}) == "rotary"
                       ? PositionKind::rotary
                       : PositionKind::learned;
  parts.rope_theta = r.real("model", "rope_theta", 10000.0, 1.0, 1e12);
  // Llama 3's frequency scaling (HuggingFace's rope_scaling with rope_type "llama3"); 0: none.
  auto& scaling = parts.rope_scaling;
  scaling.factor = r.real("model", "rope_scaling", 0.0, 0.0, 1e6);
  scaling.low_freq_factor = r.real("model", "rope_low_freq_factor", 1.0, 0.0, 1e6, true);
  scaling.high_freq_factor = r.real("model", "rope_high_freq_factor", 4.0, 0.0, 1e6, true);
  scaling.original_context = r.real("model", "rope_original_context", 8192.0, 1.0, 1e9);
  parts.mlp = r.choice("model", "mlp", llama ? "swiglu" : "gelu", {"gelu", "swiglu"}) == "swiglu" ? MlpKind::swiglu
                                                                                               : MlpKind::gelu;
  // The projections' biases come with the MLP: GPT-2's GELU block has them, Llama's none.
  parts.bias = parts.mlp == MlpKind::gelu;
  m.tie_embeddings = r.boolean("model", "tie_embeddings", true);
  m.kv_heads = r.integer("model", "kv_heads", m.heads, 1, 1 << 16);
  m.ffn_hidden = r.integer("model", "ffn_hidden", default_ffn_hidden(m), 1, 1 << 24);

  auto& dc = d.data;
  const std::string fmt = r.choice("data", "format", "text", {"text", "megatron", "llmc", "synthetic"});
  dc.format = fmt == "megatron" ? DataFormat::megatron
              : fmt == "llmc"   ? DataFormat::llmc
              : fmt == "synthetic" ? DataFormat::synthetic
                                   : DataFormat::text;
  const bool byte_vocab = dc.format == DataFormat::text;
  m.vocab_size = r.integer("model", "vocab_size", byte_vocab ? 256 : 0, 2, 1 << 30, !byte_vocab);
  // GPT-2 uses 0.02; a standard deviation above 1 is a typo, not an initialisation.
  m.init_std = r.real("model", "init_std", 0.02, 0.0, 1.0, true);
  const std::string attention = r.choice("model", "attention", "auto", {"auto", "in_place", "staged", "fused"});
  for (const AttentionProducts a : {AttentionProducts::in_place, AttentionProducts::staged, AttentionProducts::fused}) {
    if (attention == attention_products_name(a)) m.attention = a;
  }
  m.init = r.string("model", "init", "");
  m.loss_chunk = r.integer("model", "loss_chunk", 0, 0, 1 << 30);
  dc.paths = r.strings("data", "path", dc.format != DataFormat::synthetic);
  dc.eval_paths = r.strings("data", "eval_path", false);
  auto& p = d.parallel;
  p.dp = r.integer("parallel", "dp", 1, 1, 1 << 20);
  p.cp = r.integer("parallel", "cp", 1, 1, 1 << 12);
  p.tp = r.integer("parallel", "tp", 1, 1, 1 << 12);
  p.pp = r.integer("parallel", "pp", 1, 1, 1 << 12);
  p.zero = r.integer("parallel", "zero", 0, 0, 3);
  p.schedule = r.choice("parallel", "schedule", "1f1b", {"gpipe", "1f1b", "interleaved", "modular"});
  p.virtual_stages = r.integer("parallel", "virtual_stages", 1, 1, 1 << 12);
  p.layered = r.boolean("parallel", "layered", false);
  p.sequence_parallel = r.boolean("parallel", "sequence_parallel", false);
  p.tp_sums = r.choice("parallel", "tp_sums", "fp32", {"fp32", "bf16"});
  p.cost_forward = r.real("parallel", "cost_forward", 1.0, 0.0, kInf, true);
  p.cost_backward = r.real("parallel", "cost_backward", 2.0, 0.0, kInf, true);
  p.cost_p2p = r.real("parallel", "cost_p2p", 0.0, 0.0, kInf);
  const std::string backend = r.choice("parallel", "backend", "auto", {"auto", "mpi", "nccl"});
  d.comm.backend = backend == "mpi" ? CommBackend::mpi : backend == "nccl" ? CommBackend::nccl : CommBackend::automatic;
  d.comm.timeout = r.real("parallel", "timeout", 600.0, 0.0, 1e9);
  // LAMINA_HOST_COPIES sets the default, so that a whole test suite can run either way.
  const char* copies = std::getenv("LAMINA_HOST_COPIES");
  const std::string copies_default = copies != nullptr && std::string(copies) == "threads" ? "threads" : "inline";
  d.comm.threaded_copies = r.choice("parallel", "host_copies", copies_default, {"inline", "threads"}) == "threads";
  const std::string buffers = r.choice("parallel", "mpi_device_buffers", "auto", {"auto", "direct", "staged"});
  d.comm.mpi_device_buffers = buffers == "direct"   ? MpiDeviceBuffers::direct
                              : buffers == "staged" ? MpiDeviceBuffers::staged
                                                    : MpiDeviceBuffers::automatic;

  // Bounds far above any real batch keep products of sizes inside 64 bits.
  dc.batch_size = r.integer("data", "batch_size", 0, 1, std::int64_t{1} << 40, true);
  // Default: one micro-batch per data-parallel rank (no gradient accumulation).
  dc.micro_batch_size =
      r.integer("data", "micro_batch_size", std::max<std::int64_t>(1, dc.batch_size / p.dp), 1, std::int64_t{1} << 31);
  dc.shuffle = r.boolean("data", "shuffle", true);

  auto& t = d.train;
  // 0: no step; the run writes the initial weights as the step-0 checkpoint and ends.
  t.steps = r.integer("train", "steps", 0, 0, kMaxSteps, true);
  // The samples and tokens the run counts must fit: steps x batch x (seq_len + 1) tokens.
  if (const std::int64_t per_step = dc.batch_size > kMaxTokens / (m.seq_len + 1) ? kMaxTokens
                                                                                 : dc.batch_size * (m.seq_len + 1);
      per_step > 0 && t.steps > kMaxTokens / per_step) {
    r.error_at("train", "steps",
               strprintf("%lld steps of %lld sequences of %lld tokens count past 2^62 tokens; at most %lld steps",
                         static_cast<long long>(t.steps), static_cast<long long>(dc.batch_size),
                         static_cast<long long>(m.seq_len), static_cast<long long>(kMaxTokens / per_step)));
  }
  t.seed = static_cast<std::uint64_t>(r.integer("train", "seed", 1234, 0, kMax));
  t.precision = r.choice("train", "precision", "fp32", {"fp32", "bf16"}) == "bf16" ? Precision::bf16 : Precision::fp32;
  t.skip_nonfinite = r.boolean("train", "skip_nonfinite", false);
  t.max_skipped = r.integer("train", "max_skipped", 10, 1, kMax);
  t.eval_every = r.integer("train", "eval_every", 0, 0, kMaxSteps);
  t.eval_batches = r.integer("train", "eval_batches", 0, 0, kMaxSteps);

  auto& o = d.optimizer;
  o.lr = r.real("optimizer", "lr", 3e-4, 0.0, kInf, true);
  o.min_lr = r.real("optimizer", "min_lr", 0.1 * o.lr, 0.0, kInf);
  o.weight_decay = r.real("optimizer", "weight_decay", 0.1, 0.0, kInf);
  // 1 is refused: AdamW's bias correction 1 - beta^t would divide by zero.
  o.beta1 = r.real("optimizer", "beta1", 0.9, 0.0, 1.0, false, false, true);
  o.beta2 = r.real("optimizer", "beta2", 0.95, 0.0, 1.0, false, false, true);
  o.eps = r.real("optimizer", "eps", 1e-8, 0.0, kInf, true);
  o.grad_clip = r.real("optimizer", "grad_clip", 1.0, 0.0, kInf);
  o.warmup_steps = r.integer("optimizer", "warmup_steps", 0, 0, kMaxSteps);
  o.decay_steps = r.integer("optimizer", "decay_steps", 0, 0, kMaxSteps);
  o.schedule = r.choice("optimizer", "schedule", "cosine", {"constant", "cosine"}) == "constant" ? LrSchedule::constant
                                                                                               : LrSchedule::cosine;
  o.subgroup_size = r.integer("optimizer", "subgroup_size", 1 << 22, 1, kMax);
  o.decay_biases_and_norms = r.boolean("optimizer", "decay_biases_and_norms", false);

  auto& mem = d.memory;
  mem.device_budget = r.bytes("memory", "device_budget", 0);
  mem.host_budget = r.bytes("memory", "host_budget", 0);
  mem.activations = r.per_layer("memory", "activations", "keep", {"keep", "recompute", "offload", "offload_checkpoint"},
                                m.layers);
  mem.params = r.per_layer("memory", "params", "device", {"device", "host"}, m.layers);
  mem.optimizer = r.per_layer("memory", "optimizer", "device", {"device", "host", "dynamic"}, m.layers);
  mem.dos_split = r.choice("memory", "dos_split", "model", {"model", "all_host", "all_device", "alternate"});
  mem.dos_host_rate = r.real("memory", "dos_host_rate", 0.0, 0.0, kInf);
  mem.dos_device_rate = r.real("memory", "dos_device_rate", 0.0, 0.0, kInf);
  mem.dos_h2d = r.real("memory", "dos_h2d", 0.0, 0.0, kInf);
  mem.dos_d2h = r.real("memory", "dos_d2h", 0.0, 0.0, kInf);

  auto& out = d.output;
  std::string stem = file;
  if (const auto slash = stem.find_last_of('/'); slash != std::string::npos) stem = stem.substr(slash + 1);
  if (const auto dot = stem.find_last_of('.'); dot != std::string::npos && dot > 0) stem = stem.substr(0, dot);
  if (stem.empty() || stem[0] == '<') stem = "run";
  out.dir = r.string("output", "dir", "runs/" + stem);
  out.log_every = r.integer("output", "log_every", 1, 1, kMax);
  out.peak_tflops = r.real("output", "peak_tflops", 0.0, 0.0, kInf);
  out.sample_tokens = r.integer("output", "sample_tokens", 0, 0, 1 << 20);
  out.sample_temperature = r.real("output", "sample_temperature", 0.8, 0.0, kInf, true);
  out.trace_step = r.integer("output", "trace_step", 0, 0, kMaxSteps);

  auto& c = d.checkpoint;
  c.dir = r.string("checkpoint", "dir", out.dir + "/checkpoints");
  c.every = r.integer("checkpoint", "every", 0, 0, kMax);
  c.keep = r.integer("checkpoint", "keep", 3, 1, kMax);
  c.resume = r.string("checkpoint", "resume", "");
  c.save_final = r.boolean("checkpoint", "save_final", true);
  c.async = r.boolean("checkpoint", "async", true);
  c.newer = r.choice("checkpoint", "newer", "refuse", {"refuse", "keep", "aside"});

  // Consistency between keys; each error points at the key most likely to be wrong.
  if (m.heads > 0 && m.d_model > 0 && m.d_model % m.heads != 0) {
    r.error_at("model", "heads", strprintf("d_model (%lld) must be divisible by heads (%lld); try heads = %lld",
                                           static_cast<long long>(m.d_model), static_cast<long long>(m.heads),
                                           static_cast<long long>(std::max<std::int64_t>(1, m.d_model / 64))));
  }
  if (m.heads > 0 && m.kv_heads > 0 && m.heads % m.kv_heads != 0) {
    r.error_at("model", "kv_heads",
               strprintf("heads (%lld) must be a multiple of kv_heads (%lld): each key/value head serves a group of "
                         "query heads",
                         static_cast<long long>(m.heads), static_cast<long long>(m.kv_heads)));
  }
  if (parts.position == PositionKind::rotary && m.heads > 0 && m.d_model % m.heads == 0 &&
      (m.d_model / m.heads) % 2 != 0) {
    r.error_at("model", "position",
               strprintf("rotary positions turn pairs of a head's features; the head width d_model / heads = %lld "
                         "is odd",
                         static_cast<long long>(m.d_model / m.heads)));
  }
  if (scaling.factor > 0.0 && scaling.high_freq_factor <= scaling.low_freq_factor) {
    r.error_at("model", "rope_high_freq_factor",
               strprintf("%g must exceed model.rope_low_freq_factor (%g)", scaling.high_freq_factor,
                         scaling.low_freq_factor));
  }
  if (byte_vocab && m.vocab_size > 0 && m.vocab_size < 256) {
    r.error_at("model", "vocab_size",
               strprintf("%lld is smaller than 256, the byte vocabulary of data.format = 'text'",
                         static_cast<long long>(m.vocab_size)));
  }
  if (out.sample_tokens > 0 && dc.format != DataFormat::text) {
    r.error_at("output", "sample_tokens", "samples are printed as text, which needs data.format = 'text' (bytes)");
  }
  if (o.min_lr > o.lr) {
    r.error_at("optimizer", "min_lr", strprintf("%g exceeds optimizer.lr (%g)", o.min_lr, o.lr));
  }
  if (out.trace_step > t.steps && t.steps > 0) {
    r.error_at("output", "trace_step",
               strprintf("step %lld is after the last one (train.steps = %lld); set output.trace_step <= %lld",
                         static_cast<long long>(out.trace_step), static_cast<long long>(t.steps),
                         static_cast<long long>(t.steps)));
  }
  if (o.warmup_steps > t.steps && t.steps > 0) {
    r.error_at("optimizer", "warmup_steps",
               strprintf("%lld exceeds train.steps (%lld); set optimizer.warmup_steps <= %lld or raise train.steps",
                         static_cast<long long>(o.warmup_steps), static_cast<long long>(t.steps),
                         static_cast<long long>(t.steps)));
  }
  if (!dc.eval_paths.empty() && dc.format == DataFormat::synthetic) {
    r.error_at("data", "eval_path", "held-out tokens are read from files; data.format = 'synthetic' reads none");
  }
  if (t.eval_every > 0 && dc.eval_paths.empty()) {
    r.error_at("train", "eval_every", "evaluates on held-out tokens: set data.eval_path too");
  }
  if (c.resume != "" && c.resume != "latest" && c.resume.size() < 4) {
    r.error_at("checkpoint", "resume", "'" + c.resume + "' must be \"latest\" or a checkpoint file path");
  }

  std::vector<std::string> errors = override_errors;
  errors.insert(errors.end(), r.errors().begin(), r.errors().end());
  if (!errors.empty()) {
    std::string msg = errors.size() == 1 ? "" : strprintf("%zu problems in the deck:\n", errors.size());
    for (std::size_t i = 0; i < errors.size(); ++i) msg += (i ? "\n" : "") + errors[i];
    throw InputError(msg);
  }
  for (const std::string& key : automatic) r.set_resolved(key, "auto");
  d.resolved_toml = r.resolved_toml();
  d.locations = r.locations();
  for (const auto& kv : auto_locations) d.locations[kv.first] = kv.second;
  d.automatic = automatic;
  return d;
}

}  // namespace

std::vector<std::string> deck_keys() {
  std::vector<std::string> out;
  for (const Section& s : schema()) {
    for (const std::string& k : s.keys) out.push_back(s.name + "." + k);
  }
  return out;
}

Deck parse_deck(const std::string& text, const std::string& source_name, const std::vector<std::string>& overrides) {
  toml::table root;
  try {
    root = toml::parse(text, source_name);
  } catch (const toml::parse_error& e) {
    const auto& src = e.source();
    throw InputError(strprintf("%s:%u:%u: TOML syntax error: %s", source_name.c_str(), src.begin.line,
                               src.begin.column, std::string(e.description()).c_str()));
  }
  return read(root, source_name, overrides);
}

Deck load_deck(const std::string& path, const std::vector<std::string>& overrides) {
  return parse_deck(read_text_file(path, "deck", kMaxDeckBytes), path, overrides);
}

}  // namespace lamina
