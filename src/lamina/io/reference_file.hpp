#pragma once
// PyTorch reference files (docs/reference-format.md): weights, one batch, the loss,
// every gradient, and the weights after one AdamW step, all from an independent
// float64 implementation. `lamina verify` and the model tests compare against them.
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"

namespace lamina {

struct ReferenceTensor {
  std::vector<std::int64_t> shape;
  std::vector<float> weight;    // initial value (float32 in the file)
  std::vector<double> grad;     // d loss / d weight
  std::vector<double> updated;  // after one AdamW step
};

struct ReferenceFile {
  std::string path;
  ModelConfig model;
  std::int64_t batch = 0;
  double lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  std::int64_t adam_step = 1;
  std::vector<std::int32_t> x, y;  // (batch, seq)
  double loss = 0;
  std::map<std::string, ReferenceTensor> tensors;
};

// Reads the configuration, batch and loss; then the named tensors, each checked against
// the expected shape. Anything missing or malformed is an InputError naming the file.
ReferenceFile read_reference_header(const std::string& path);
void read_reference_tensors(ReferenceFile& ref,
                            const std::vector<std::pair<std::string, std::vector<std::int64_t>>>& expected);

}  // namespace lamina
