#pragma once
// metrics.jsonl: one JSON object per logged step, flushed as it is written so that a
// crashed or running job can be inspected (and tailed) at any time.
#include <fstream>
#include <string>

#include "lamina/core/json.hpp"

namespace lamina {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // append: keep the lines of the run being resumed.
  MetricsWriter(const std::string& path, bool append);
  void write(const JsonObject& line);
  bool is_open() const { return out_.is_open(); }

 private:
  std::ofstream out_;
};

}  // namespace lamina
