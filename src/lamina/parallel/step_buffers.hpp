#pragma once
// What an instruction of a step touches (schedule.hpp): the buffers it reads and writes, and
// the pooled buffers it takes before it runs and gives back after it (or once it has
// completed). The executor binds pooled buffers by these events, the memory estimate replays
// them, and the hazard checker (hazards.hpp) proves from them, with the instructions' streams
// and waits, that no two instructions touch one buffer unordered.
#include <cstdint>
#include <string>
#include <tuple>

namespace lamina {

enum class Buf : std::uint8_t {
  // activations of one micro-batch of one chunk (micro_batch >= 0)
  input,       // the chunk's input: the embedding's output, or a received or copied activation
  output,      // block `block`'s output, the next block's input
  grad,        // the gradient of the chunk's residual stream (micro_batch -1: one buffer for all)
  offloaded,   // host-tier copy of block `block`'s inner activations (offload)
  checkpoint,  // host-tier copy of the chunk's input (offload_checkpoint)
  // the stage's
  staging,     // offload staging buffer `index` (0 or 1)
  // of layer `layer`
  params,      // parameters as stored: whole or shard, in the device or the host tier
  gathered,    // parameters made present for use (ZeRO-3 gathers, copies in from the host tier)
  grads,       // gradient accumulator (ZeRO-2/3: a full-size one from the pool until reduced)
  grad_shard,  // ZeRO-2/3: the reduced owned shard
  host_grads,  // the owned reduced gradients in host memory (host-updated layers)
  optimizer,   // subgroup `index`'s optimizer state and master weights
};
const char* buf_name(Buf b);

struct BufferRef {
  Buf kind = Buf::input;
  int chunk = -1, micro_batch = -1, block = -1, layer = -1, index = -1;
  auto key() const { return std::make_tuple(kind, chunk, micro_batch, block, layer, index); }
  bool operator<(const BufferRef& o) const { return key() < o.key(); }
  bool operator==(const BufferRef& o) const { return key() == o.key(); }
};
std::string describe(const BufferRef& b);

struct Access {
  BufferRef buffer;
  bool write = false;
  // Done with before the host goes on: a send copies its message out at issue and the host
  // waits for that copy (the network then reads the copy, not the buffer).
  bool at_issue = false;
};

// Pooled buffers: a chunk's activation slots (one per micro-batch in flight), the device
// frames of chunks whose checkpoints go to the host, gathered parameters, ZeRO-2/3's
// full-size gradient accumulators. A pool hands a given-back buffer to a later taker, so
// everything done to one holder must end before the next holder touches it.
enum class Pool : std::uint8_t { slots, frames, gathered, full_grads };
enum class Frame : std::uint8_t { input, output, gradient };
struct Held {
  Pool pool = Pool::slots;
  int chunk = -1, micro_batch = -1, layer = -1;
  Frame frame = Frame::input;  // frames
  auto key() const { return std::make_tuple(pool, chunk, micro_batch, layer, frame); }
  bool operator<(const Held& o) const { return key() < o.key(); }
  bool operator==(const Held& o) const { return key() == o.key(); }
};
std::string describe(const Held& h);

struct PoolEvent {
  bool acquire = true;  // taken before the instruction runs; else given back after it is issued
  Held held;
  bool at_completion = false;  // given back when the host has seen the instruction complete
};

}  // namespace lamina
