#pragma once
// A rank's copy streams (core/copy_stream.hpp), one per kind of copy an instruction can be
// (Stream in schedule.hpp): into the device (activations and checkpoints coming back,
// updated parameters published from the host), out of it (activations and checkpoints
// leaving, gradients flushed to host-updated layers) and parameter fetches (copies in from
// the host tier, ahead of their all-gathers). Compute runs on the default instance,
// reductions and gathers on their communicators, messages on their links.
#include "lamina/core/copy_stream.hpp"

namespace lamina {

struct StageStreams {
  explicit StageStreams(HostCopies mode) : h2d("h2d", mode), d2h("d2h", mode), fetch("fetch", mode) {}
  CopyStream h2d, d2h, fetch;
};

}  // namespace lamina
