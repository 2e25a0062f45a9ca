#include "lamina/io/metrics_writer.hpp"

#include <cstdlib>
#include <fstream>

namespace lamina {

MetricsWriter::MetricsWriter(const std::string& path, std::int64_t resume_step) {
  std::string keep;
  if (resume_step > 0) {
    std::ifstream in(path);
    std::string line;
    while (std::getline(in, line)) {
      const auto pos = line.find("\"step\": ");
      if (pos != std::string::npos && std::atoll(line.c_str() + pos + 8) <= resume_step) keep += line + '\n';
    }
  }
  out_ = OutputFile(path, resume_step < 0);
  if (resume_step >= 0) out_.write(keep);
}

void MetricsWriter::write(const JsonObject& line) { out_.write(line.str() + '\n'); }

}  // namespace lamina
