#include "lamina/parallel/executor.hpp"

#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "lamina/core/exec_instances.hpp"
#include "lamina/core/format.hpp"
#include "lamina/kernels/bf16.hpp"

namespace lamina {

namespace {

using Exec = Executor::Exec;

ShardCombine combine_over(const ProcessGrid& grid) {
  ShardCombine c;
  c.rank = grid.tp_rank();
  if (grid.tp_size() > 1) {
    Communicator* tp = &grid.tp();
    c.sum = [tp](float* data, std::int64_t n) { tp->allreduce(data, n, ReduceOp::sum); };
    c.max = [tp](float* data, std::int64_t n) { tp->allreduce(data, n, ReduceOp::max); };
  }
  return c;
}

void copy(const Mat<Exec>& dst, const Mat<Exec>& src) { Kokkos::deep_copy(Exec(), dst, src); }

// Parameters of some layers present for a scope (a no-op below ZeRO-3).
class Hold {
 public:
  Hold(ModelState& s, std::vector<int> layers) : s_(s), layers_(std::move(layers)) {
    for (int l : layers_) s_.gather(l);
  }
  ~Hold() {
    for (int l : layers_) s_.release(l);
  }
  Hold(const Hold&) = delete;
  Hold& operator=(const Hold&) = delete;

 private:
  ModelState& s_;
  std::vector<int> layers_;
};

}  // namespace

Executor::Executor(MemoryTracker& tracker, ModelState& state, const ProcessGrid& grid, const Schedule& schedule,
                   const Dims& dims, const CostModel& cost, const std::vector<ActivationPolicy>& activations,
                   Precision precision)
    : state_(state),
      grid_(grid),
      schedule_(schedule),
      dims_(dims),
      cost_(cost),
      tp_(combine_over(grid)),
      ws_(tracker, dims),
      send_pool_(tracker, MemCategory::communication, "lamina::pipeline_sends"),
      transfer_(transfer_instance<Exec>()),
      inner_size_(activation_sizes(dims).inner),
      bf16_(precision == Precision::bf16) {
  const Partition& part = schedule.partition();
  bool scratch = false, offload = false;  // what needs the scratch, the staging buffers
  for (int c : part.chunks_of(grid.pp_rank())) {
    const Chunk& k = part.chunk(c);
    Slots& s = slots_[c];
    const std::vector<ActivationPolicy> policy(activations.begin() + k.first_block,
                                               activations.begin() + k.last_block);
    for (const auto p : policy) {
      scratch = scratch || p == ActivationPolicy::recompute || (bf16_ && p != ActivationPolicy::recompute);
      offload = offload || p == ActivationPolicy::offload;
    }
    const int n = schedule.max_in_flight(c);
    for (int i = 0; i < n; ++i) {
      s.acts.push_back(std::make_unique<LayerRangeActs<Exec>>(tracker, dims, k.first_block, k.last_block, k.embedding,
                                                              k.head, policy, bf16_));
      s.free.push_back(n - 1 - i);
    }
    for (int l : state.layers_of(k)) ++users_[l];
  }
  if (scratch) scratch_ = Buffer<float, ModelState::Mem>(tracker, MemCategory::activations, "lamina::acts_scratch", inner_size_);
  for (int i = 0; i < 2 && offload; ++i) {
    if (bf16_) {
      staging16_[i] = Buffer<std::uint16_t, ModelState::Mem>(tracker, MemCategory::activations, "lamina::offload_staging",
                                                             inner_size_);
    } else {
      staging_[i] = Buffer<float, ModelState::Mem>(tracker, MemCategory::activations, "lamina::offload_staging", inner_size_);
    }
  }
}

int Executor::tag(int kind, int receiving_chunk, int mb, int part) const {
  return ((kind * schedule_.partition().num_chunks() + receiving_chunk) * schedule_.micro_batches() + mb) * 2 + part;
}

LayerRangeActs<Exec>& Executor::acquire(int chunk, int mb) {
  Slots& s = slots_.at(chunk);
  if (s.free.empty()) throw std::logic_error(strprintf("no free activation slot for chunk %d", chunk));
  const int i = s.free.back();
  s.free.pop_back();
  in_use_[{chunk, mb}] = i;
  return *s.acts[static_cast<std::size_t>(i)];
}

LayerRangeActs<Exec>& Executor::slot(int chunk, int mb) {
  return *slots_.at(chunk).acts[static_cast<std::size_t>(in_use_.at({chunk, mb}))];
}

void Executor::release(int chunk, int mb) {
  const auto it = in_use_.find({chunk, mb});
  slots_.at(chunk).free.push_back(it->second);
  in_use_.erase(it);
}

void Executor::forward(const Chunk& c, int mb, const MicroBatchLoader& load) {
  const Exec exec;
  // recv_activation, if any, acquired the slot already.
  LayerRangeActs<Exec>& a = in_use_.count({c.index, mb}) ? slot(c.index, mb) : acquire(c.index, mb);
  if (c.embedding || c.head) {
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(dims_.N())), targets(inputs.size());
    load(mb, inputs.data(), targets.data());
    using Host = Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
    Kokkos::deep_copy(exec, a.inputs, Host(inputs.data(), inputs.size()));
    Kokkos::deep_copy(exec, a.targets, Host(targets.data(), targets.size()));
  }
  // ZeRO-3: each layer's parameters are gathered just before it runs and dropped after
  // (a breadth-first run holds them across its micro-batches with gather_params).
  if (c.embedding) {
    Hold e(state_, {0});
    embed_forward(exec, state_.embedding_params(), a, tp_);
  } else if (c.index > 0 && schedule_.partition().chunk(c.index - 1).stage == c.stage) {
    copy(a.input, slot(c.index - 1, mb).output());  // the previous chunk is on this stage
  }
  for (std::int64_t b = c.first_block; b < c.last_block; ++b) {
    Hold h(state_, {state_.layout().block_layer(b)});
    if (b + 1 < c.last_block) state_.prefetch(state_.layout().block_layer(b + 1));  // one layer ahead
    const ActivationPolicy policy = a.policy(b);
    // Inner activations: into the slot (keep), a scratch (recompute: dropped), or the first
    // staging buffer, copied to the host tier on the transfer instance (offload). bf16 ones
    // are computed in the scratch and rounded into the slot or the staging buffer.
    const bool offload = policy == ActivationPolicy::offload;
    if (offload) transfer_.fence();  // the staging buffer's last copy out is done
    float* inner = policy == ActivationPolicy::keep && !bf16_ ? a.kept_inner(b)
                   : offload && !bf16_                        ? staging(0, nullptr, -1)
                                                              : scratch_.data();
    block_forward(exec, state_.block_params(b), a.block(b, inner), a.block_input(b), dims_.NH, ws_.ws, tp_);
    if (policy == ActivationPolicy::keep && bf16_) {
      to_bf16(exec, Bf16Vec<Exec>(a.kept_inner_bf16(b), inner_size_), as_vec<Exec>(inner, inner_size_));
    }
    if (offload && bf16_) {
      to_bf16(exec, staging16_[0].view(), as_vec<Exec>(inner, inner_size_));
      exec.fence();
      Kokkos::deep_copy(transfer_, a.offloaded_bf16(b), staging16_[0].view());
      staged_[0] = {&a, b};  // the staging buffer still holds it too
    } else if (offload) {
      exec.fence();
      Kokkos::deep_copy(transfer_, a.offloaded(b), as_vec<Exec>(inner, inner_size_));
      staged_[0] = {&a, b};
    }
  }
  if (c.head) {
    Hold h(state_, {0, state_.layout().final_layer()});
    head_forward(exec, state_.embedding_params(), state_.final_params(), a, tp_);
    loss_sum_ += sum_losses(exec, a);
  }
  exec.fence();
  const double t = compute_cost(c, Op::forward, cost_);
  clock_ += t;
  busy_ += t;
}

void Executor::backward(const Chunk& c, int mb, float loss_scale, bool reduce) {
  const Exec exec;
  LayerRangeActs<Exec>& a = slot(c.index, mb);
  const ParamLayout& layout = state_.layout();
  // Gradient accumulators start as each layer is reached (ZeRO-2/3 keep few at a time);
  // the tied embedding's collects from the head to the lookup.
  // When this backward completes the chunk's gradients, each layer's reduction starts as
  // soon as that layer is done, overlapping the backward of the layers before it.
  if (c.head) {
    {
      Hold h(state_, {0, layout.final_layer()});
      state_.begin_grads(0);
      state_.begin_grads(layout.final_layer());
      head_backward(exec, state_.embedding_grads(), state_.final_grads(), state_.embedding_params(),
                    state_.final_params(), a, ws_.ws, loss_scale, tp_);
    }
    if (reduce) reduce_layer(layout.final_layer(), mb);
  }
  for (std::int64_t b = c.last_block; b-- > c.first_block;) {
    {
      Hold h(state_, {layout.block_layer(b)});
      if (b > c.first_block) state_.prefetch(layout.block_layer(b - 1));  // one layer ahead
      state_.begin_grads(layout.block_layer(b));
      const BlockActs<Exec> s = restore(a, b);
      block_backward(exec, state_.block_grads(b), state_.block_params(b), s, a.block_input(b), a.dres, dims_.NH,
                     ws_.ws, tp_);
    }
    if (reduce) reduce_layer(layout.block_layer(b), mb);
  }
  if (c.embedding) {
    state_.begin_grads(0);
    embed_backward(exec, state_.embedding_grads(), a);  // needs no parameters
  }
  if (reduce && (c.embedding || c.head)) reduce_layer(0, mb);  // the tied embedding: lookup and head both done
  if (c.index > 0 && schedule_.partition().chunk(c.index - 1).stage == c.stage) {
    copy(slot(c.index - 1, mb).dres, a.dres);  // hand the input gradient to the previous chunk
  }
  exec.fence();
  const double t = compute_cost(c, Op::backward, cost_);
  clock_ += t;
  busy_ += t;
}

float* Executor::staging(int i, LayerRangeActs<Exec>* a, std::int64_t b) {
  staged_[i] = {a, b};
  return staging_[static_cast<std::size_t>(i)].data();
}

BlockActs<Exec> Executor::restore(LayerRangeActs<Exec>& a, std::int64_t b) {
  const Exec exec;
  switch (a.policy(b)) {
    case ActivationPolicy::keep:
      if (!bf16_) return a.block(b, a.kept_inner(b));
      from_bf16(exec, as_vec<Exec>(scratch_.data(), inner_size_), Bf16Vec<Exec>(a.kept_inner_bf16(b), inner_size_));
      return a.block(b, scratch_.data());
    case ActivationPolicy::recompute: {
      // Re-run the forward from the kept block input (Chen et al. 2016), into the scratch;
      // under bf16 rounded as stored ones are, so that every policy trains alike.
      const BlockActs<Exec> s = a.block(b, scratch_.data());
      block_forward(exec, state_.block_params(b), s, a.block_input(b), dims_.NH, ws_.ws, tp_);
      if (bf16_) round_to_bf16(exec, as_vec<Exec>(scratch_.data(), inner_size_));
      return s;
    }
    case ActivationPolicy::offload: break;
  }
  // Offloaded: in a staging buffer already (prefetched, or still there from forward), or
  // copied back now; then the previous offloaded block of the range is prefetched into
  // the other buffer while this one's backward runs.
  int i = staged_[0].first == &a && staged_[0].second == b ? 0 : staged_[1].first == &a && staged_[1].second == b ? 1 : -1;
  transfer_.fence();
  if (i < 0) {
    i = 0;
    staging(i, &a, b);
    copy_in(exec, i, a, b);
  }
  if (b > a.first_block() && a.policy(b - 1) == ActivationPolicy::offload) {
    exec.fence();  // the previous backward has done reading the buffer about to be overwritten
    staging(1 - i, &a, b - 1);
    copy_in(transfer_, 1 - i, a, b - 1);
  }
  if (bf16_) {
    from_bf16(exec, as_vec<Exec>(scratch_.data(), inner_size_), staging16_[i].view());
    return a.block(b, scratch_.data());
  }
  exec.fence();
  return a.block(b, staging_[static_cast<std::size_t>(i)].data());
}

void Executor::copy_in(const Exec& on, int i, LayerRangeActs<Exec>& a, std::int64_t b) {
  if (bf16_) {
    Kokkos::deep_copy(on, staging16_[i].view(), a.offloaded_bf16(b));
  } else {
    Kokkos::deep_copy(on, staging_[i].view(), a.offloaded(b));
  }
}

void Executor::send(Op op, int chunk, int mb, int peer) {
  const bool act = op == Op::send_activation;
  LayerRangeActs<Exec>& a = slot(chunk, mb);
  const Mat<Exec>& buf = act ? a.output() : a.dres;
  const int to = act ? chunk + 1 : chunk - 1;
  const int kind = act ? 0 : 1;
  const std::int64_t n = static_cast<std::int64_t>(buf.size());
  float* out = outgoing_buffer(n);
  Kokkos::deep_copy(Exec(), as_vec<Exec>(out, n), as_vec<Exec>(buf.data(), n));
  Exec().fence();
  outgoing_.push_back({out, n, grid_.pp().isend(out, n, peer, tag(kind, to, mb, 0))});
  // The sender's virtual time travels with the message, as the bits of a double.
  const double arrival = clock_ + cost_.p2p;
  stamps_.emplace_back(2);
  std::memcpy(stamps_.back().data(), &arrival, sizeof(arrival));
  stamp_sends_.push_back(grid_.pp_clock().isend(stamps_.back().data(), 2, peer, tag(kind, to, mb, 1)));
  if (!act) release(chunk, mb);  // the backward of this micro-batch is done here
}

float* Executor::outgoing_buffer(std::int64_t n) {
  // Reuse the buffers of messages that have arrived meanwhile.
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    if (it->request.test()) {
      send_pool_.release(it->buffer, it->n);
      it = outgoing_.erase(it);
    } else {
      ++it;
    }
  }
  return send_pool_.acquire(n);
}

void Executor::recv(Op op, int chunk, int mb, int peer) {
  const bool act = op == Op::recv_activation;
  LayerRangeActs<Exec>& a = act ? acquire(chunk, mb) : slot(chunk, mb);
  const Mat<Exec>& buf = act ? a.input : a.dres;
  const int kind = act ? 0 : 1;
  grid_.pp().recv(buf.data(), static_cast<std::int64_t>(buf.size()), peer, tag(kind, chunk, mb, 0));
  float stamp[2];
  grid_.pp_clock().recv(stamp, 2, peer, tag(kind, chunk, mb, 1));
  double arrival = 0.0;
  std::memcpy(&arrival, stamp, sizeof(arrival));
  clock_ = std::max(clock_, arrival);
}

void Executor::reduce_layer(int layer, int mb) {
  // A layer used by several local chunks (the tied embedding) is reduced after the last.
  if (++reduced_[layer] < users_[layer]) return;
  reduced_[layer] = 0;
  state_.reduce_grads(layer, mb == schedule_.micro_batches() - 1);
}

StageResult Executor::run(const MicroBatchLoader& load, float loss_scale) {
  clock_ = busy_ = loss_sum_ = 0.0;
  state_.zero_grads();
  const Partition& part = schedule_.partition();
  const auto& program = schedule_.program(grid_.pp_rank());
  for (std::size_t k = 0; k < program.size(); ++k) {
    const Instruction& i = program[k];
    switch (i.op) {
      case Op::forward: forward(part.chunk(i.chunk), i.micro_batch, load); break;
      case Op::backward: {
        // The schedule asks for this chunk's reduction right after this backward (past
        // the ZeRO-3 release of its parameters).
        std::size_t next = k + 1;
        while (next < program.size() && program[next].op == Op::release_params) ++next;
        const bool reduce = next < program.size() && program[next].op == Op::reduce_grads;
        backward(part.chunk(i.chunk), i.micro_batch, loss_scale, reduce);
        // The last chunk of a stage has no gradient to send; its slot is free now.
        if (i.chunk == 0 || part.chunk(i.chunk - 1).stage == part.chunk(i.chunk).stage) release(i.chunk, i.micro_batch);
        break;
      }
      case Op::send_activation:
      case Op::send_gradient: send(i.op, i.chunk, i.micro_batch, i.peer); break;
      case Op::recv_activation:
      case Op::recv_gradient: recv(i.op, i.chunk, i.micro_batch, i.peer); break;
      case Op::gather_params:
        for (int l : state_.layers_of(part.chunk(i.chunk))) state_.gather(l);
        break;
      case Op::release_params:
        for (int l : state_.layers_of(part.chunk(i.chunk))) state_.release(l);
        break;
      case Op::reduce_grads: break;  // started layer by layer inside the backward before it
      case Op::optimizer_step: break;  // the caller steps, once gradients are complete
    }
  }
  state_.finish_reductions();
  for (auto& o : outgoing_) {
    o.request.wait();
    send_pool_.release(o.buffer, o.n);
  }
  outgoing_.clear();
  for (auto& r : stamp_sends_) r.wait();
  stamp_sends_.clear();
  stamps_.clear();
  return {loss_sum_, clock_, busy_};
}

}  // namespace lamina
