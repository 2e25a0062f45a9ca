#pragma once
// A trace of one step as the executor ran it, in the Trace Event Format that Perfetto
// (ui.perfetto.dev) and chrome://tracing open: one process per rank; on the "host" track
// what the host thread did with each instruction (its waits for the instructions `after`
// names, then issuing or running it), and on one track per stream each instruction that
// ran beside the host, from its issue to when its completion was first seen (a poll
// between instructions, or a wait). With context parallelism, the ring's passes on a "cp ring"
// track (started to over) and, beside each pass of keys and values, the attention the rank
// computed meanwhile on a "cp attention" track (on a device: the kernels queued meanwhile).
// Times are microseconds since the step began.
#include <string>
#include <vector>

#include "lamina/parallel/executor.hpp"
#include "lamina/parallel/schedule.hpp"

namespace lamina {

// The trace's JSON (an object with "traceEvents").
std::string step_trace_json(const std::vector<Instruction>& program, const std::vector<InstructionEvent>& events,
                            int final_layer, int rank, const std::vector<RingPass>& ring = {});

}  // namespace lamina
