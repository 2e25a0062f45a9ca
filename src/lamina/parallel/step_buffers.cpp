#include "lamina/parallel/step_buffers.hpp"

#include "lamina/core/format.hpp"

namespace lamina {

const char* buf_name(Buf b) {
  switch (b) {
    case Buf::input: return "input";
    case Buf::output: return "output";
    case Buf::grad: return "residual gradient";
    case Buf::offloaded: return "offloaded activations";
    case Buf::checkpoint: return "host checkpoint";
    case Buf::staging: return "staging buffer";
    case Buf::params: return "parameters";
    case Buf::gathered: return "gathered parameters";
    case Buf::grads: return "gradients";
    case Buf::grad_shard: return "gradient shard";
    case Buf::host_grads: return "host gradients";
    case Buf::optimizer: return "optimizer state";
  }
  return "?";
}

std::string describe(const BufferRef& b) {
  std::string s = buf_name(b.kind);
  switch (b.kind) {
    case Buf::input:
    case Buf::output:
    case Buf::grad:
    case Buf::offloaded:
    case Buf::checkpoint:
      if (b.block >= 0) s += strprintf(" of h.%d", b.block);
      s += strprintf(" (chunk %d, %s)", b.chunk,
                     b.micro_batch >= 0 ? strprintf("micro-batch %d", b.micro_batch).c_str() : "every micro-batch");
      break;
    case Buf::staging: s += strprintf(" %d", b.index); break;
    case Buf::optimizer: s += strprintf(" of layer %d, subgroup %d", b.layer, b.index); break;
    default: s += strprintf(" of layer %d", b.layer); break;
  }
  return s;
}

std::string describe(const Held& h) {
  switch (h.pool) {
    case Pool::slots: return strprintf("the activation slot of chunk %d, micro-batch %d", h.chunk, h.micro_batch);
    case Pool::frames: {
      static const char* const names[] = {"input", "output", "gradient"};
      return strprintf("the %s frame of chunk %d, micro-batch %d", names[static_cast<int>(h.frame)], h.chunk,
                       h.micro_batch);
    }
    case Pool::gathered: return strprintf("the gathered parameters of layer %d", h.layer);
    case Pool::full_grads: return strprintf("the full-size gradients of layer %d", h.layer);
  }
  return "?";
}

}  // namespace lamina
