#pragma once
// The hazard checker: proves from a stage's instruction lists alone that no two instructions
// touch one buffer unordered, on any machine. A hazard is a pair of accesses to one buffer,
// at least one a write, by instructions of different streams (or of a stream whose work may
// start before the work queued ahead of it has ended), where the later does not provably
// start after the earlier has ended. What is provable follows the executor's rules
// (schedule.hpp): the host issues instructions in order; before one, it waits for those in
// its `after` (and with each, the earlier work of its stream); compute, copies and the
// host's own work run in order on their streams; compute holds the host only where kernels
// run in the host's thread, so the checker assumes they are queued (as on a device), which
// proves the host builds too.
//
// Pooled buffers (activation slots, frames, gathered parameters, full-size gradient
// accumulators) are checked whatever buffer the pool hands out: everything done to a buffer
// given back must end before a later taker of the same pool touches what it takes. Between
// the step's program and the optimizer's, and at the end of a step, the host has waited for
// everything (Executor::run, Executor::update); the checker runs the step, the update and
// the next step's program, so a buffer still held at the end of a step is found too.
#include <string>
#include <vector>

#include "lamina/parallel/schedule.hpp"

namespace lamina {

// The two instructions, each as (program: 0 the step, 1 the update, 2 the next step; index
// in it); where the list breaks a rule of its own (a wait on a later instruction, a pooled
// buffer used outside its hold), both name that instruction.
struct Hazard {
  int first_program = 0, first = 0;  // the earlier
  int program = 0, second = 0;       // the later
  BufferRef buffer;
  std::string message;  // readable: the two instructions, their streams, the buffer
};

// Checks one stage's step program (as the schedule builds it, or altered) and the rank's
// update program. An empty result is the proof.
std::vector<Hazard> find_hazards(const Schedule& schedule, const std::vector<Instruction>& step,
                                 const std::vector<Instruction>& update);
inline std::vector<Hazard> find_hazards(const Schedule& schedule, int stage, const std::vector<Instruction>& update) {
  return find_hazards(schedule, schedule.program(stage), update);
}

// Every stage of a schedule (with its update program, where given per stage): throws
// std::logic_error naming the first hazards found.
void check_hazards(const Schedule& schedule, const std::vector<std::vector<Instruction>>& updates = {});

}  // namespace lamina
