#include "lamina/model/gpt_activations.hpp"

#include <algorithm>

namespace lamina {

ActivationSizes activation_sizes(const Dims& d) {
  const std::int64_t N = d.N(), C = d.C, att = d.B * d.NH * d.T * d.T;
  ActivationSizes s;
  s.embed = N * C;
  // ln1, q, k, v, atty, x2, ln2, out: 8 NC; fch, fch_gelu: 8 NC; 4 (mean, rstd) of N
  s.block = 16 * N * C + 4 * N + att;
  s.head = N * C + 2 * N + N * d.V + 2 * N;
  const std::int64_t forward = 6 * N * C;
  // dres, dln, datty, scratch: 4 NC; dfch 4 NC; dqkv 3 NC; dq, dk, dv, dy: 4 NC; 3C bias sums
  const std::int64_t backward = 15 * N * C + att + 3 * C;
  s.workspace = std::max(forward, backward);
  s.ones = N;
  s.tokens = 2 * N;
  return s;
}

}  // namespace lamina
