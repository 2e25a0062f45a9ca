#pragma once
// One flat buffer per layer (parameters, or gradients, or an optimizer moment), laid out
// by a ParamLayout, with the named views of a GPT-2 bound on top.
#include <string>
#include <vector>

#include "lamina/core/buffer.hpp"
#include "lamina/model/gpt_tensors.hpp"
#include "lamina/model/param_layout.hpp"

namespace lamina {

template <class Exec>
class FlatStore {
 public:
  using Mem = typename Exec::memory_space;

  FlatStore(MemoryTracker& tracker, MemCategory category, const std::string& label, const ParamLayout& layout) {
    for (const auto& l : layout.layers()) {
      buffers_.emplace_back(tracker, category, "lamina::" + label + "_" + l.name, l.numel);
    }
  }

  int num_layers() const { return static_cast<int>(buffers_.size()); }
  Vec<Exec> layer(int i) const { return buffers_[i].view(); }
  std::vector<float*> bases() const {
    std::vector<float*> out;
    for (const auto& b : buffers_) out.push_back(b.data());
    return out;
  }
  void zero(const Exec& exec) const {
    for (const auto& b : buffers_) Kokkos::deep_copy(exec, b.view(), 0.0f);
  }

 private:
  std::vector<Buffer<float, Mem>> buffers_;
};

}  // namespace lamina
