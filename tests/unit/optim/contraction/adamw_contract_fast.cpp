// Compiled with -ffp-contract=fast (tests/CMakeLists.txt).
#include "adamw_step.hpp"
#include "adamw_step.inl"

void lamina::test::adamw_step_contract_fast(AdamWState& s) { adamw_step(s); }
