#include "lamina/io/metrics_writer.hpp"

#include "lamina/core/error.hpp"

namespace lamina {

MetricsWriter::MetricsWriter(const std::string& path, bool append)
    : out_(path, append ? std::ios::app : std::ios::trunc) {
  if (!out_) throw RunError(path + ": cannot open for writing");
}

void MetricsWriter::write(const JsonObject& line) {
  out_ << line.str() << '\n';
  out_.flush();
}

}  // namespace lamina
