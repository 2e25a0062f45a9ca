#pragma once
// Finite-difference check of an analytic gradient: samples coordinates of x and compares
// (f(x + h e_i) - f(x - h e_i)) / 2h with grad[i]. The kernels run in float, so h is
// large and the tolerance loose: this catches wrong formulas, the double-precision
// reference comparisons catch rounding-level errors.
#include <functional>

#include "test_util.hpp"

namespace lamina::test {

inline void expect_fd_matches(const std::function<double(const std::vector<double>&)>& f, const std::vector<double>& x,
                              const std::vector<double>& grad, const char* what, int samples = 12, double h = 1e-2) {
  ASSERT_EQ(x.size(), grad.size());
  const std::size_t stride = std::max<std::size_t>(1, x.size() / static_cast<std::size_t>(samples));
  for (std::size_t i = 0; i < x.size(); i += stride) {
    const double fd = finite_difference(f, x, i, h);
    EXPECT_NEAR(fd, grad[i], 2e-3 + 2e-2 * std::fabs(grad[i])) << what << " coordinate " << i;
  }
}

}  // namespace lamina::test
