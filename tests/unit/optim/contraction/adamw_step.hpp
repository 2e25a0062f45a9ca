#pragma once
// One AdamW step on the host, compiled twice (adamw_contract_fast.cpp, adamw_contract_off.cpp)
// with the compiler's floating-point contraction on and off: the kernel's bits must not
// depend on it.
#include <vector>

namespace lamina::test {

struct AdamWState {
  std::vector<float> params, m, v, grads;
};

void adamw_step_contract_fast(AdamWState& s);
void adamw_step_contract_off(AdamWState& s);

}  // namespace lamina::test
