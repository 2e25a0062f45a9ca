// The body both translation units compile (included by each, under its own flags). The
// kernel is instantiated on an execution-space type of the translation unit's own, so that
// the linker cannot merge the two instantiations into one: each runs the code its flags made.
#include "lamina/optim/adamw.hpp"

namespace lamina::test {
namespace {

struct ThisUnit : Kokkos::DefaultHostExecutionSpace {};

void adamw_step(AdamWState& s) {
  const std::int64_t n = static_cast<std::int64_t>(s.params.size());
  const AdamWStep step = AdamWStep::make(3e-3, 0.9, 0.95, 1e-8, 3, 0.7);
  const auto update = detail::adamw_functor<ThisUnit>(Vec<ThisUnit>(s.params.data(), n), Vec<ThisUnit>(s.m.data(), n),
                                                      Vec<ThisUnit>(s.v.data(), n), ConstVec<ThisUnit>(s.grads.data(), n),
                                                      step, n / 2, 0.1f, 0.0f);
  for (std::int64_t i = 0; i < n; ++i) update(i);
}

}  // namespace
}  // namespace lamina::test
