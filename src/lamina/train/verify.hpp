#pragma once
// `lamina verify`: one forward/backward and one AdamW step on a PyTorch reference file
// (docs/reference-format.md), compared tensor by tensor.
#include <optional>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"

namespace lamina {

struct VerifyItem {
  std::string what;  // "loss", "grad/<name>", "updated/<name>"
  double rel_error = 0.0;
};

struct VerifyReport {
  std::string path;
  double loss = 0.0, reference_loss = 0.0;
  std::vector<VerifyItem> items;
  double max_rel_error() const;
};

// Throws InputError for a missing or malformed file. attention: as model.attention (unset:
// the backend's default).
VerifyReport verify_reference(const std::string& path, std::optional<AttentionProducts> attention = std::nullopt);

}  // namespace lamina
