#pragma once
// metrics.jsonl: one JSON object per logged step, flushed as it is written so that a
// crashed or running job can be inspected (and tailed) at any time. A line that cannot
// be written is a RunError naming the file (io/output_file.hpp).
#include <cstdint>
#include <string>

#include "lamina/core/json.hpp"
#include "lamina/io/output_file.hpp"

namespace lamina {

class MetricsWriter {
 public:
  MetricsWriter() = default;
  // resume_step 0: a new file. Otherwise the run resumes after that step: the lines up
  // to it are kept, and what the interrupted run logged after it is dropped. Negative: the
  // lines are appended to whatever the file holds (`lamina eval`).
  MetricsWriter(const std::string& path, std::int64_t resume_step);
  void write(const JsonObject& line);
  void close() { out_.close(); }
  bool is_open() const { return out_.is_open(); }

 private:
  OutputFile out_;
};

}  // namespace lamina
