#pragma once
// A StepSpec for schedule and simulator tests: `layers` blocks of the given layout, every
// block on the default policies unless the test sets them.
#include "lamina/parallel/schedule.hpp"

namespace lamina::test {

inline StepSpec spec(std::int64_t layers, ScheduleKind kind, int pp, int M, int v = 1, bool layered = false,
                     int zero = 0) {
  StepSpec s;
  s.layers = layers;
  s.layout.schedule = kind;
  s.layout.pp = pp;
  s.layout.micro_batches = M;
  s.layout.virtual_stages = v;
  s.layout.layered = layered;
  s.layout.zero = zero;
  s.layout.dp = zero > 0 ? 2 : 1;
  s.blocks.assign(static_cast<std::size_t>(layers), LayerPolicy{});
  return s;
}

}  // namespace lamina::test
