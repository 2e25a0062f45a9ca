#pragma once
// AdamW over a model's flat buffers, subgroup by subgroup (optimizer.subgroup_size):
// the unit that later moves between memory spaces (Deep Optimizer States).
#include <vector>

#include "lamina/core/deck.hpp"
#include "lamina/model/param_store.hpp"
#include "lamina/optim/adamw.hpp"
#include "lamina/optim/grad_norm.hpp"

namespace lamina {

template <class Exec>
class AdamW {
 public:
  AdamW(MemoryTracker& tracker, const ParamLayout& layout, const OptimizerConfig& cfg)
      : layout_(layout),
        cfg_(cfg),
        m_(tracker, MemCategory::optimizer_state, "exp_avg", layout),
        v_(tracker, MemCategory::optimizer_state, "exp_avg_sq", layout),
        subgroups_(layout.subgroups(cfg.subgroup_size)) {}

  // One update of every parameter with learning rate `lr` and gradients scaled by
  // `grad_scale` (clipping). Advances t.
  void step(const Exec& exec, const FlatStore<Exec>& params, const FlatStore<Exec>& grads, double lr,
            double grad_scale) {
    ++t_;
    const AdamWStep s = AdamWStep::make(lr, cfg_.beta1, cfg_.beta2, cfg_.eps, t_, grad_scale);
    for (const Subgroup& g : subgroups_) {
      adamw_update_range(exec, params.layer(g.layer), m_.layer(g.layer), v_.layer(g.layer), grads.layer(g.layer),
                         g.begin, g.end, layout_.layers()[g.layer].matrix_numel, s,
                         static_cast<float>(cfg_.weight_decay), cfg_.decay_biases_and_norms);
    }
  }

  std::int64_t t() const { return t_; }
  void set_t(std::int64_t t) { t_ = t; }
  const FlatStore<Exec>& exp_avg() const { return m_; }
  const FlatStore<Exec>& exp_avg_sq() const { return v_; }
  const std::vector<Subgroup>& subgroups() const { return subgroups_; }

 private:
  const ParamLayout& layout_;
  OptimizerConfig cfg_;
  FlatStore<Exec> m_, v_;
  std::vector<Subgroup> subgroups_;
  std::int64_t t_ = 0;
};

// Global L2 norm of all gradients (in double).
template <class Exec>
double global_grad_norm(const Exec& exec, const FlatStore<Exec>& grads) {
  double sq = 0.0;
  for (int i = 0; i < grads.num_layers(); ++i) sq += sum_of_squares(exec, ConstVec<Exec>(grads.layer(i)));
  return std::sqrt(sq);
}

}  // namespace lamina
