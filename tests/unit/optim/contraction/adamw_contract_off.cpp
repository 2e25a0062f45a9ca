// Compiled with -ffp-contract=off (tests/CMakeLists.txt).
#include "adamw_step.hpp"
#include "adamw_step.inl"

void lamina::test::adamw_step_contract_off(AdamWState& s) { adamw_step(s); }
