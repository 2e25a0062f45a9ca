#include "lamina/core/json.hpp"

#include <cmath>
#include <cstdio>

#include "lamina/core/format.hpp"

namespace lamina {

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      case '\r': out += "\\r"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += strprintf("\\u%04x", static_cast<unsigned>(c));
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

JsonObject& JsonObject::add(const std::string& key, double value) {
  // JSON has no NaN/Inf; null keeps the line parseable and the field present.
  if (!std::isfinite(value)) return add_raw(key, "null");
  return add_raw(key, strprintf("%.9g", value));
}

JsonObject& JsonObject::add(const std::string& key, std::int64_t value) {
  return add_raw(key, strprintf("%lld", static_cast<long long>(value)));
}

JsonObject& JsonObject::add(const std::string& key, bool value) { return add_raw(key, value ? "true" : "false"); }

JsonObject& JsonObject::add(const std::string& key, const std::string& value) {
  return add_raw(key, json_escape(value));
}

JsonObject& JsonObject::add(const std::string& key, const JsonObject& value) { return add_raw(key, value.str()); }

JsonObject& JsonObject::add(const std::string& key, const std::map<std::string, std::int64_t>& value) {
  JsonObject o;
  for (const auto& kv : value) o.add(kv.first, kv.second);
  return add(key, o);
}

JsonObject& JsonObject::add_raw(const std::string& key, const std::string& json) {
  fields_.emplace_back(key, json);
  return *this;
}

std::string JsonObject::str() const {
  std::string out = "{";
  for (std::size_t i = 0; i < fields_.size(); ++i) {
    if (i) out += ", ";
    out += json_escape(fields_[i].first) + ": " + fields_[i].second;
  }
  return out + "}";
}

}  // namespace lamina
