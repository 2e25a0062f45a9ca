#include "lamina/optim/lr_schedule.hpp"

#include <algorithm>
#include <cmath>

namespace lamina {

double learning_rate(const OptimizerConfig& opt, std::int64_t step, std::int64_t total_steps) {
  if (opt.warmup_steps > 0 && step < opt.warmup_steps) {
    return opt.lr * static_cast<double>(step + 1) / static_cast<double>(opt.warmup_steps);
  }
  if (opt.schedule == LrSchedule::constant) return opt.lr;
  const std::int64_t decay = opt.decay_steps > 0 ? opt.decay_steps : std::max<std::int64_t>(1, total_steps - opt.warmup_steps);
  const double progress = std::min(1.0, static_cast<double>(step - opt.warmup_steps) / static_cast<double>(decay));
  return opt.min_lr + 0.5 * (1.0 + std::cos(3.141592653589793 * progress)) * (opt.lr - opt.min_lr);
}

}  // namespace lamina
