#include "lamina/plan/machine.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>
#include <vector>

#include "lamina/core/deck.hpp"
#include "lamina/core/text_file.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

namespace {

enum class Kind { number, bytes, integer, boolean };

struct Key {
  const char* name;
  Kind kind;
  bool required;
  double MachineSpec::*real = nullptr;
  int MachineSpec::*whole = nullptr;
  bool MachineSpec::*flag = nullptr;
  double scale = 1.0;  // tflops -> flop/s
};

struct Table {
  const char* name;
  std::vector<Key> keys;
};

const std::vector<Table>& schema() {
  using M = MachineSpec;
  static const std::vector<Table> t = {
      {"device",
       {{"per_node", Kind::integer, true, nullptr, &M::devices_per_node},
        {"memory", Kind::bytes, true, &M::device_memory},
        {"peak_tflops_fp32", Kind::number, true, &M::peak_flops_fp32, nullptr, nullptr, 1e12},
        {"peak_tflops_bf16", Kind::number, false, &M::peak_flops_bf16, nullptr, nullptr, 1e12},
        {"memory_bandwidth", Kind::bytes, true, &M::memory_bandwidth},
        {"adamw_params_per_s", Kind::number, false, &M::device_adamw_rate},
        {"is_host", Kind::boolean, false, nullptr, nullptr, &M::device_is_host},
        {"cores", Kind::integer, false, nullptr, &M::cores_per_device}}},
      {"host",
       {{"memory", Kind::bytes, true, &M::host_memory},
        {"memory_bandwidth", Kind::bytes, true, &M::host_bandwidth},
        {"adamw_params_per_s", Kind::number, true, &M::host_adamw_rate}}},
      {"links", {{"h2d", Kind::bytes, true, &M::h2d}, {"d2h", Kind::bytes, true, &M::d2h}}},
      {"network",
       {{"intra_node_bandwidth", Kind::bytes, true, &M::intra_bandwidth},
        {"intra_node_latency", Kind::number, true, &M::intra_latency},
        {"inter_node_bandwidth", Kind::bytes, true, &M::inter_bandwidth},
        {"inter_node_latency", Kind::number, true, &M::inter_latency}}},
      {"efficiency",
       {{"gemm", Kind::number, false, &M::gemm_efficiency},
        {"attention", Kind::number, false, &M::attention_efficiency},
        {"elementwise", Kind::number, false, &M::elementwise_efficiency},
        {"adamw", Kind::number, false, &M::adamw_efficiency}}},
  };
  return t;
}

std::string at(const std::string& file, const toml::source_region& r) {
  return r.begin.line == 0 ? file : strprintf("%s:%u:%u", file.c_str(), r.begin.line, r.begin.column);
}

std::string hint(const std::string& word, const std::vector<std::string>& names) {
  std::string best;
  std::size_t d = std::numeric_limits<std::size_t>::max();
  for (const auto& n : names) {
    const std::size_t e = edit_distance(word, n);
    if (e < d) d = e, best = n;
  }
  return d <= std::max<std::size_t>(2, word.size() / 2) ? " (did you mean '" + best + "'?)" : "";
}

}  // namespace

MachineSpec parse_machine(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw InputError(strprintf("%s:%u:%u: TOML syntax error: %s", source.c_str(), e.source().begin.line,
                               e.source().begin.column, std::string(e.description()).c_str()));
  }
  std::vector<std::string> errors;
  MachineSpec m;
  m.source = source;
  std::vector<std::string> tables = {"name"};
  for (const auto& t : schema()) tables.push_back(t.name);
  for (auto&& [k, node] : root) {
    const std::string key(k.str());
    if (key == "name") {
      if (!node.is_string()) errors.push_back(at(source, node.source()) + ": name must be a string");
      continue;
    }
    bool known = false;
    for (const auto& t : schema()) known = known || key == t.name;
    if (!known) errors.push_back(at(source, k.source()) + ": unknown table '" + key + "'" + hint(key, tables));
  }
  m.name = root["name"].value_or(std::string("unnamed machine"));
  for (const auto& t : schema()) {
    const toml::table* tab = root[t.name].as_table();
    std::vector<std::string> names;
    for (const auto& key : t.keys) names.push_back(key.name);
    if (tab != nullptr) {
      for (auto&& [k, node] : *tab) {
        const std::string key(k.str());
        if (std::find(names.begin(), names.end(), key) == names.end()) {
          errors.push_back(at(source, k.source()) + ": unknown key '" + key + "' in " + t.name + hint(key, names));
        }
      }
    }
    for (const auto& key : t.keys) {
      const std::string path = std::string(t.name) + "." + key.name;
      const toml::node* n = tab == nullptr ? nullptr : tab->get(key.name);
      if (n == nullptr) {
        if (key.required) errors.push_back(source + ": missing " + path);
        continue;
      }
      const std::string where = at(source, n->source()) + ": " + path;
      switch (key.kind) {
        case Kind::number:
          if (!n->is_number() || !(*n->value<double>() >= 0.0)) {
            errors.push_back(where + " must be a number >= 0");
          } else {
            m.*key.real = *n->value<double>() * key.scale;
          }
          break;
        case Kind::bytes: {
          // Sizes and rates alike are > 0: a bandwidth of 0 would price communication as free.
          std::int64_t b = 0;
          if (n->is_integer() && *n->value<std::int64_t>() > 0) {
            m.*key.real = static_cast<double>(*n->value<std::int64_t>());
          } else if (n->is_floating_point() && *n->value<double>() > 0.0 && std::isfinite(*n->value<double>())) {
            m.*key.real = *n->value<double>();
          } else if (n->is_string() && parse_bytes(*n->value<std::string>(), b) && b > 0) {
            m.*key.real = static_cast<double>(b);
          } else {
            errors.push_back(where + " must be a byte count > 0 (a number or a string such as \"80GiB\" or \"25GB\")");
          }
          break;
        }
        case Kind::integer:
          if (!n->is_integer() || *n->value<std::int64_t>() < 1) {
            errors.push_back(where + " must be an integer >= 1");
          } else {
            m.*key.whole = static_cast<int>(*n->value<std::int64_t>());
          }
          break;
        case Kind::boolean:
          if (!n->is_boolean()) {
            errors.push_back(where + " must be true or false");
          } else {
            m.*key.flag = *n->value<bool>();
          }
          break;
      }
    }
  }
  for (const double e : {m.gemm_efficiency, m.attention_efficiency, m.elementwise_efficiency, m.adamw_efficiency}) {
    if (e <= 0.0 || e > 1.0) {
      errors.push_back(source + ": efficiency values must be in (0, 1]");
      break;
    }
  }
  if (!errors.empty()) {
    std::string msg = errors.size() == 1 ? "" : strprintf("%zu problems in the machine description:\n", errors.size());
    for (std::size_t i = 0; i < errors.size(); ++i) msg += (i ? "\n" : "") + errors[i];
    throw InputError(msg);
  }
  return m;
}

MachineSpec load_machine(const std::string& path) {
  return parse_machine(read_text_file(path, "machine description", std::int64_t{1} << 20), path);
}

std::string machine_toml(const MachineSpec& m) {
  std::ostringstream os;
  os << "name = \"" << m.name << "\"\n";
  for (const auto& t : schema()) {
    os << "\n[" << t.name << "]\n";
    for (const auto& key : t.keys) {
      switch (key.kind) {
        case Kind::number:
        case Kind::bytes: os << key.name << " = " << strprintf("%.6g", m.*key.real / key.scale) << "\n"; break;
        case Kind::integer:
          if (m.*key.whole > 0) os << key.name << " = " << m.*key.whole << "\n";
          break;
        case Kind::boolean: os << key.name << " = " << (m.*key.flag ? "true" : "false") << "\n"; break;
      }
    }
  }
  return os.str();
}

}  // namespace lamina
