#pragma once
// A minimal JSON object writer for metrics.jsonl and benchmark summaries. Keys keep
// insertion order so that lines are easy to read and diff.
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lamina {

class JsonObject {
 public:
  JsonObject& add(const std::string& key, double value);
  JsonObject& add(const std::string& key, std::int64_t value);
  JsonObject& add(const std::string& key, int value) { return add(key, static_cast<std::int64_t>(value)); }
  JsonObject& add(const std::string& key, bool value);
  JsonObject& add(const std::string& key, const std::string& value);
  JsonObject& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonObject& add(const std::string& key, const JsonObject& value);
  JsonObject& add(const std::string& key, const std::map<std::string, std::int64_t>& value);
  JsonObject& add_raw(const std::string& key, const std::string& json);
  std::string str() const;
  bool empty() const { return fields_.empty(); }

 private:
  std::vector<std::pair<std::string, std::string>> fields_;
};

std::string json_escape(const std::string& s);

}  // namespace lamina
