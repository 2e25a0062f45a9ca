#pragma once
// Every tensor of a model checkpoint (parameters and both Adam moments), by dataset name,
// read with plain HDF5: tests compare two checkpoints bit for bit this way (attributes
// such as the resolved deck may differ).
#include <hdf5.h>

#include <map>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/model/param_layout.hpp"

namespace lamina::test {

inline std::map<std::string, std::vector<float>> checkpoint_tensors(const std::string& file, const ModelConfig& model) {
  std::map<std::string, std::vector<float>> out;
  const hid_t f = H5Fopen(file.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  if (f < 0) return out;
  const ParamLayout layout = ParamLayout::of(model);
  for (const auto& layer : layout.layers()) {
    for (const auto& t : layer.tensors) {
      for (const char* prefix : {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"}) {
        const std::string name = prefix + t.name;
        const hid_t d = H5Dopen2(f, name.c_str(), H5P_DEFAULT);
        if (d < 0) continue;
        std::vector<float> v(static_cast<std::size_t>(t.numel()));
        if (H5Dread(d, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, v.data()) >= 0) out[name] = std::move(v);
        H5Dclose(d);
      }
    }
  }
  H5Fclose(f);
  return out;
}

}  // namespace lamina::test
