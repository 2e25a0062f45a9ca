#include "lamina/parallel/executor.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "lamina/core/exec_instances.hpp"
#include "lamina/core/format.hpp"
#include "lamina/kernels/bf16.hpp"
#include "lamina/parallel/stage_streams.hpp"

namespace lamina {

namespace {

using Exec = Executor::Exec;

void copy(const Mat<Exec>& dst, const Mat<Exec>& src) { Kokkos::deep_copy(Exec(), dst, src); }

void copy(const Residual<Exec>& dst, const Residual<Exec>& src) {
  if (dst.bf16()) {
    Kokkos::deep_copy(Exec(), dst.b16, src.b16);
  } else {
    Kokkos::deep_copy(Exec(), dst.f32, src.f32);
  }
}

// How many tensor-parallel shares a pipeline message travels in: tp where both the
// activation (as stored) and the gradient cut into whole float words, else 1 (and under
// sequence parallelism, where each rank's rows are its own message).
int message_split(int tp, const Dims& d, bool bf16) {
  const ActivationSizes s = activation_sizes(d);
  const std::int64_t act = LayerRangeActs<Exec>::boundary_elements(s, bf16) / (bf16 ? 2 : 1);
  return tp > 1 && !d.sequence_parallel() && act % tp == 0 && s.boundary % tp == 0 ? tp : 1;
}

}  // namespace

Executor::Executor(MemoryTracker& tracker, RankState& state, const ProcessGrid& grid, const Schedule& schedule,
                   const Dims& dims, const ClockPrices& prices)
    : state_(state),
      grid_(grid),
      schedule_(schedule),
      dims_(dims),
      prices_(prices),
      final_(schedule.final_layer()),
      tp_(shard_combine(grid, schedule.spec().tp_sums, schedule.spec().layout.sequence_parallel)),
      ws_(tracker, dims),
      send_pool_(tracker, MemCategory::communication, "lamina::pipeline_sends"),
      messages_(transfer_instance<Exec>()),
      inner_size_(activation_sizes(dims).inner),
      split_(message_split(grid.tp_size(), dims, schedule.spec().precision == Precision::bf16)),
      bf16_(schedule.spec().precision == Precision::bf16),
      frames_(tracker, MemCategory::activations, "lamina::checkpoint_frames"),
      stream_words_(LayerRangeActs<Exec>::stream_words(activation_sizes(dims), bf16_)),
      losses_("lamina::losses", static_cast<std::size_t>(schedule.micro_batches())) {
  if (tp_.ring.pass) {  // the ring's passes, timed for the step's trace
    tp_.ring.pass = [this, pass = tp_.ring.pass](const float* send, float* recv, std::int64_t n, int tag) {
      ring_passes_.push_back({current_, tag, now(), -1.0, -1.0});
      pass(send, recv, n, tag);
    };
    tp_.ring.wait = [this, wait = tp_.ring.wait] {
      const double waited = now();
      wait();
      for (; ring_open_ < ring_passes_.size(); ++ring_open_) {
        ring_passes_[ring_open_].waited = waited;
        ring_passes_[ring_open_].done = now();
      }
    };
  }
  const Partition& part = schedule.partition();
  bool scratch = false, offload = false;  // what needs the scratch, the staging buffers
  for (int c : part.chunks_of(grid.pp_rank())) {
    const Chunk& k = part.chunk(c);
    Slots& s = slots_[c];
    std::vector<ActivationPolicy> policy;
    for (std::int64_t b = k.first_block; b < k.last_block; ++b) policy.push_back(this->policy(b));
    for (const auto p : policy) {
      scratch = scratch || recomputed(p);
      offload = offload || p == ActivationPolicy::offload;
    }
    // Depth-first, a chunk runs one micro-batch's backward at a time: one residual-gradient
    // buffer serves them all. Breadth-first keeps each micro-batch's until its turn.
    float* dres = nullptr;
    if (!schedule.spec().layout.layered) {
      s.dres = Buffer<float, Mem>(tracker, MemCategory::activations, "lamina::dres", activation_sizes(dims).boundary);
      dres = s.dres.data();
    }
    const int n = schedule.max_in_flight(c);
    for (int i = 0; i < n; ++i) {
      s.acts.push_back(std::make_unique<LayerRangeActs<Exec>>(tracker, dims, k.first_block, k.last_block, k.embedding,
                                                              k.head, policy, bf16_, dres));
      s.free.push_back(n - 1 - i);
    }
  }
  if (scratch && bf16_) {
    scratch16_ = Buffer<std::uint16_t, Mem>(tracker, MemCategory::activations, "lamina::acts_scratch", inner_size_);
  } else if (scratch) {
    scratch_ = Buffer<float, Mem>(tracker, MemCategory::activations, "lamina::acts_scratch", inner_size_);
  }
  for (int i = 0; i < 2 && offload; ++i) {
    if (bf16_) {
      staging16_[i] =
          Buffer<std::uint16_t, Mem>(tracker, MemCategory::activations, "lamina::offload_staging", inner_size_);
    } else {
      staging_[i] = Buffer<float, Mem>(tracker, MemCategory::activations, "lamina::offload_staging", inner_size_);
    }
  }
}

ActivationPolicy Executor::policy(std::int64_t block) const {
  return schedule_.spec().blocks[static_cast<std::size_t>(block)].activations;
}

int Executor::tag(int kind, int receiving_chunk, int mb, int part) const {
  return ((kind * schedule_.partition().num_chunks() + receiving_chunk) * schedule_.micro_batches() + mb) * 2 + part;
}

LayerRangeActs<Exec>& Executor::slot(int chunk, int mb) {
  const auto it = in_use_.find({chunk, mb});
  if (it == in_use_.end()) {
    throw std::logic_error(strprintf("chunk %d, micro-batch %d uses an activation slot it was not given", chunk, mb));
  }
  return *slots_.at(chunk).acts[static_cast<std::size_t>(it->second)];
}

void Executor::take(const PoolEvent& e) {
  const Held& h = e.held;
  if (h.pool == Pool::slots) {
    Slots& s = slots_.at(h.chunk);
    if (s.free.empty() || in_use_.count({h.chunk, h.micro_batch})) {
      throw std::logic_error(strprintf("no activation slot for chunk %d, micro-batch %d", h.chunk, h.micro_batch));
    }
    in_use_[{h.chunk, h.micro_batch}] = s.free.back();
    s.free.pop_back();
  } else if (h.pool == Pool::frames) {
    const std::int64_t n = h.frame == Frame::gradient ? dims_.rows() * dims_.C : stream_words_;
    float* p = frames_.acquire(n);
    framed_[{h.chunk, h.micro_batch, h.frame}] = p;
    LayerRangeActs<Exec>& a = slot(h.chunk, h.micro_batch);
    switch (h.frame) {
      case Frame::input: a.bind_input(p); break;
      case Frame::output: a.bind_output(p); break;
      case Frame::gradient: a.bind_dres(p); break;
    }
  }  // gathered parameters and full-size gradients: the store's and the reducer's pools
}

void Executor::give(const PoolEvent& e) {
  const Held& h = e.held;
  if (h.pool == Pool::slots) {
    const auto it = in_use_.find({h.chunk, h.micro_batch});
    if (it == in_use_.end()) {
      throw std::logic_error(strprintf("chunk %d, micro-batch %d gives back a slot it does not hold", h.chunk,
                                       h.micro_batch));
    }
    slots_.at(h.chunk).free.push_back(it->second);
    in_use_.erase(it);
  } else if (h.pool == Pool::frames) {
    const auto it = framed_.find({h.chunk, h.micro_batch, h.frame});
    if (it == framed_.end()) {
      throw std::logic_error(strprintf("chunk %d, micro-batch %d gives back a frame it does not hold", h.chunk,
                                       h.micro_batch));
    }
    frames_.release(it->second, h.frame == Frame::gradient ? dims_.rows() * dims_.C : stream_words_);
    framed_.erase(it);
  }
}

void Executor::forward(const Chunk& c, int layer, int mb, int buffer, const MicroBatchLoader& load,
                       float loss_scale) {
  const Exec exec;
  LayerRangeActs<Exec>& a = slot(c.index, mb);
  if (layer == first_layer(c)) {
    if (c.embedding || c.head) {
      // The micro-batch's whole sequences; under context parallelism this rank's rows of each.
      const ContextChunks& where = dims_.context;
      std::vector<std::int32_t> inputs(static_cast<std::size_t>(dims_.B * where.T)), targets(inputs.size());
      load(mb, inputs.data(), targets.data());
      if (dims_.context_parallel()) {
        for (std::int64_t b = 0; b < dims_.B; ++b) {
          for (std::int64_t t = 0; t < where.rows(); ++t) {
            const auto from = static_cast<std::size_t>(b * where.T + where.position(t));
            const auto to = static_cast<std::size_t>(b * where.rows() + t);
            inputs[to] = inputs[from];
            targets[to] = targets[from];
          }
        }
      }
      a.set_tokens(exec, inputs.data(), targets.data());
    }
    const Partition& part = schedule_.partition();
    if (!c.embedding && c.index > 0 && part.chunk(c.index - 1).stage == c.stage) {
      copy(a.input, slot(c.index - 1, mb).output());  // the previous chunk is on this stage
    }
  }
  const Workspace<Exec>& ws = ws_.ws;
  if (layer == 0) {
    range_embed_forward(exec, state_.embedding_weights(), a, ws, tp_);
  } else if (layer == final_) {
    range_head_forward(exec, head_embedding(), state_.final_weights(ws.vectors), a, ws, tp_, loss_scale);
    sum_losses(exec, a.head, Kokkos::subview(losses_, static_cast<std::size_t>(mb)));
  } else {
    // Inner activations, written as stored: into the slot (keep), a scratch (recompute:
    // dropped), or the staging buffer the instruction names, which the offload copies to the
    // host tier.
    const std::int64_t b = layer - 1;
    const ActivationPolicy policy = a.policy(b);
    const InnerActs inner = policy == ActivationPolicy::keep      ? a.kept_inner(b)
                            : policy == ActivationPolicy::offload ? staging(buffer)
                                                                  : scratch();
    range_block_forward(exec, state_.block_weights(b, ws.vectors), a, b, inner, true, ws, tp_);
  }
}

InnerActs Executor::scratch() const { return {scratch_.data(), scratch16_.data()}; }

InnerActs Executor::staging(int buffer) const {
  if (buffer < 0 || buffer > 1) throw std::logic_error(strprintf("no staging buffer %d", buffer));
  return {staging_[buffer].data(), staging16_[buffer].data()};
}

void Executor::recompute(const Chunk& c, int layer, int mb) {
  // Re-run the forward from the kept block input (Chen et al. 2016), into the scratch,
  // stored as kept ones are, so that every policy trains alike. The output is kept already.
  const Exec exec;
  const std::int64_t b = layer - 1;
  const Workspace<Exec>& ws = ws_.ws;
  range_block_forward(exec, state_.block_weights(b, ws.vectors), slot(c.index, mb), b, scratch(), false, ws, tp_);
}

InnerActs Executor::restored(const LayerRangeActs<Exec>& a, std::int64_t b, int buffer) const {
  switch (a.policy(b)) {
    case ActivationPolicy::keep: return a.kept_inner(b);
    case ActivationPolicy::recompute:
    case ActivationPolicy::offload_checkpoint: return scratch();
    case ActivationPolicy::offload: break;
  }
  if (buffer < 0) throw std::logic_error(strprintf("B(h.%lld): no staging buffer named", static_cast<long long>(b)));
  return staging(buffer);
}

EmbeddingWeights<Executor::Exec> Executor::head_embedding() const {
  return schedule_.spec().tied_embeddings ? state_.embedding_weights() : EmbeddingWeights<Exec>{};
}

void Executor::backward(const Chunk& c, int layer, int mb, int buffer, float loss_scale) {
  const Exec exec;
  LayerRangeActs<Exec>& a = slot(c.index, mb);
  GradientReducer& grads = state_.reducer();
  // Gradient accumulators start as each layer is reached (ZeRO-2/3 keep few at a time);
  // the tied embedding's collects from the head to the lookup.
  const Workspace<Exec>& ws = ws_.ws;
  if (layer == final_) {
    const bool tied = schedule_.spec().tied_embeddings;
    if (tied) grads.begin(0);
    grads.begin(final_);
    range_head_backward(exec, tied ? state_.embedding_grads() : EmbeddingTensors<Exec>{}, state_.final_grads(),
                        head_embedding(), state_.final_weights(ws.vectors), a, a.dres, ws, loss_scale, tp_);
  } else if (layer == 0) {
    grads.begin(0);
    range_embed_backward(exec, state_.embedding_grads(), a, ws, tp_);  // needs no parameters
  } else {
    const std::int64_t b = layer - 1;
    grads.begin(layer);
    range_block_backward(exec, state_.block_grads(b), state_.block_weights(b, ws.vectors), a, b, restored(a, b, buffer),
                         a.dres, ws, tp_);
  }
  const Partition& part = schedule_.partition();
  if (layer == first_layer(c) && c.index > 0 && part.chunk(c.index - 1).stage == c.stage) {
    copy(slot(c.index - 1, mb).dres, a.dres);  // the input gradient to the previous chunk
  }
}

Completion Executor::copy_activations(const Instruction& i) {
  // Offloaded blocks' inner activations through the staging buffer the instruction names,
  // and checkpoints between a frame and the host tier, on the rank's copy streams.
  StageStreams& streams = state_.streams();
  LayerRangeActs<Exec>& a = slot(i.chunk, i.micro_batch);
  const std::int64_t b = i.layer - 1;
  const bool out = i.op == Op::offload_activations || i.op == Op::offload_checkpoint;
  CopyStream& on = out ? streams.d2h : streams.h2d;
  const auto stage = as_vec<Exec>(i.buffer >= 0 && !bf16_ ? staging_[i.buffer].data() : nullptr, inner_size_);
  const auto frame = as_vec<Exec>(a.input.words(), stream_words_);
  switch (i.op) {
    case Op::offload_activations:
      if (bf16_) {
        on.copy(a.offloaded_bf16(b), staging16_[i.buffer].view());
      } else {
        on.copy(a.offloaded(b), stage);
      }
      break;
    case Op::prefetch_activations:
    case Op::reload_activations:
      if (bf16_) {
        on.copy(staging16_[i.buffer].view(), a.offloaded_bf16(b));
      } else {
        on.copy(stage, a.offloaded(b));
      }
      break;
    case Op::offload_checkpoint: on.copy(a.checkpoint(), frame); break;
    case Op::prefetch_checkpoint: on.copy(frame, a.checkpoint()); break;
    default: throw std::logic_error(std::string("copy_activations: ") + op_name(i.op));
  }
  Completion done;
  done.add(on.mark());
  return done;
}

Completion Executor::send(Op op, int chunk, int mb, int peer, int index) {
  const bool act = op == Op::send_activation;
  LayerRangeActs<Exec>& a = slot(chunk, mb);
  // Activations as stored (bf16 pairs in bf16 runs), gradients in fp32.
  float* data = act ? a.output().words() : a.dres.data();
  const std::int64_t words = act ? a.output().word_count() : static_cast<std::int64_t>(a.dres.size());
  const int to = act ? chunk + 1 : chunk - 1;
  const int kind = act ? 0 : 1;
  // Every tensor-parallel rank holds the whole residual stream: each sends its 1/tp share
  // and the receivers all-gather it over their tensor-parallel group (Megatron's
  // scatter/gather), so the pipeline link carries it once, not tp times. The share is
  // copied out at issue (the host waits for that copy alone), so that the buffer it came
  // from is free again as soon as the send is issued, whatever the receiver does.
  const std::int64_t n = words / split_;
  float* out = outgoing_buffer(n);
  Kokkos::deep_copy(messages_, as_vec<Exec>(out, n), as_vec<Exec>(data + grid_.tp_rank() % split_ * n, n));
  messages_.fence();
  Completion done;
  const ProcessGrid::Link link = grid_.link(act, grid_.pp_rank(), peer);
  done.add(link.comm->isend(out, n, link.peer, tag(kind, to, mb, 0)));
  outgoing_.push_back({out, n, index});
  // The sender's virtual time travels with the message, in host memory.
  stamps_.push_back(clock_ + prices_.p2p);
  stamp_sends_.push_back(grid_.pp_clock().isend_host(&stamps_.back(), 1, peer, tag(kind, to, mb, 1)));
  return done;
}

float* Executor::outgoing_buffer(std::int64_t n) {
  // Reuse the buffers of messages that have arrived meanwhile.
  for (auto it = outgoing_.begin(); it != outgoing_.end();) {
    if (waited_[static_cast<std::size_t>(it->index)] || completions_[static_cast<std::size_t>(it->index)].test()) {
      send_pool_.release(it->buffer, it->n);
      it = outgoing_.erase(it);
    } else {
      ++it;
    }
  }
  return send_pool_.acquire(n);
}

Completion Executor::recv(Op op, int chunk, int mb, int peer) {
  const bool act = op == Op::recv_activation;
  LayerRangeActs<Exec>& a = slot(chunk, mb);
  float* data = act ? a.input.words() : a.dres.data();
  const std::int64_t words = act ? a.input.word_count() : static_cast<std::int64_t>(a.dres.size());
  const int kind = act ? 0 : 1;
  Completion done;
  float* share = nullptr;
  const std::int64_t n = words / split_;
  const ProcessGrid::Link link = grid_.link(act, peer, grid_.pp_rank());
  if (split_ > 1) share = send_pool_.acquire(n);
  done.add(link.comm->irecv(share != nullptr ? share : data, n, link.peer, tag(kind, chunk, mb, 0)));
  stamps_.push_back(0.0);
  double* stamp = &stamps_.back();
  done.add(grid_.pp_clock().irecv_host(stamp, 1, peer, tag(kind, chunk, mb, 1)));
  done.then([this, share, n, out = data, stamp] {
    if (share != nullptr) {
      grid_.tp().all_gather(share, out, n);
      send_pool_.release(share, n);
    }
    clock_ = std::max(clock_, *stamp);
  });
  return done;
}

double Executor::now() const {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count() - start_;
}

void Executor::wait_for(int index) {
  // A stream completes its work in order: its earlier instructions first.
  const auto s = static_cast<std::size_t>(stream_index((*program_)[static_cast<std::size_t>(index)]));
  const std::vector<int>& on = on_stream_[s];
  std::size_t& w = waited_on_[s];
  auto finish = [this](int k) {
    const auto u = static_cast<std::size_t>(k);
    if (waited_[u]) return;
    waited_[u] = 1;
    completions_[u].wait();
    if ((*events_)[u].completed < 0.0) (*events_)[u].completed = now();
    in_flight_.erase(std::remove(in_flight_.begin(), in_flight_.end(), k), in_flight_.end());
  };
  while (w < on.size() && on[w] <= index) finish(on[w++]);
  finish(index);
}

void Executor::poll() {
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (completions_[static_cast<std::size_t>(*it)].test()) {
      (*events_)[static_cast<std::size_t>(*it)].completed = now();
      it = in_flight_.erase(it);
    } else {
      ++it;
    }
  }
}

template <class Execute>
void Executor::run_program(const std::vector<Instruction>& program, std::vector<InstructionEvent>& events,
                           Execute&& execute) {
  const std::size_t n = program.size();
  program_ = &program;
  events_ = &events;
  completions_.clear();
  completions_.resize(n);
  waited_.assign(n, 0);
  in_flight_.clear();
  on_stream_.assign(kStreams, {});
  waited_on_.assign(kStreams, 0);
  events.assign(n, InstructionEvent{});
  for (std::size_t k = 0; k < n; ++k) {
    const Instruction& i = program[k];
    InstructionEvent& e = events[k];
    e.index = static_cast<int>(k);
    e.reached = now();
    for (const int j : i.after) wait_for(j);
    e.issued = now();
    for (const PoolEvent& p : i.pool)
      if (p.acquire) take(p);
    current_ = static_cast<int>(k);
    completions_[k] = execute(i, static_cast<int>(k));
    if (i.stream == Stream::compute && compute_queued) completions_[k].add(StreamEvent::record(Exec()));
    for (const PoolEvent& p : i.pool) {
      if (p.acquire) continue;
      if (p.at_completion) {
        completions_[k].then([this, p] { give(p); });
      } else {
        give(p);
      }
    }
    e.returned = now();
    on_stream_[static_cast<std::size_t>(stream_index(i))].push_back(static_cast<int>(k));
    if (holds_host(i, compute_queued) || completions_[k].empty()) {
      e.completed = e.returned;
    } else {
      in_flight_.push_back(static_cast<int>(k));
    }
    poll();
  }
  // What nobody waited for (sends, flushes, the last reductions' follow-ups), in order.
  for (std::size_t k = 0; k < n; ++k) wait_for(static_cast<int>(k));
}

Completion Executor::execute(const Instruction& i, const MicroBatchLoader& load, float loss_scale, int index) {
  const Partition& part = schedule_.partition();
  ParameterStore& store = state_.store();
  Completion done;
  switch (i.op) {
    case Op::forward: forward(part.chunk(i.chunk), i.layer, i.micro_batch, i.buffer, load, loss_scale); break;
    case Op::backward: backward(part.chunk(i.chunk), i.layer, i.micro_batch, i.buffer, loss_scale); break;
    case Op::recompute: recompute(part.chunk(i.chunk), i.layer, i.micro_batch); break;
    case Op::send_activation:
    case Op::send_gradient: done = send(i.op, i.chunk, i.micro_batch, i.peer, index); break;
    case Op::recv_activation:
    case Op::recv_gradient: done = recv(i.op, i.chunk, i.micro_batch, i.peer); break;
    case Op::gather_params:
    case Op::prefetch_params: done = store.hold(i.layer); break;
    case Op::release_params: store.release(i.layer); break;
    case Op::offload_activations:
    case Op::prefetch_activations:
    case Op::reload_activations:
    case Op::offload_checkpoint:
    case Op::prefetch_checkpoint: done = copy_activations(i); break;
    case Op::reduce_grads: done = state_.reducer().reduce(i.layer); break;
    case Op::sync_grads: state_.reducer().sync_embedding(); break;
    case Op::flush_grads:
      state_.optimizer(i.layer).gradients_ready(state_.reducer().owned(i.layer), state_.streams().d2h);
      done.add(state_.streams().d2h.mark());
      break;
    case Op::optimizer_update:
    case Op::publish_params:
    case Op::share_params:
      throw std::logic_error(std::string("instruction ") + op_name(i.op) + " outside an optimizer program");
  }
  const double t = clock_price(i, prices_, final_);
  clock_ += t;
  busy_ += t;
  return done;
}

StageResult Executor::run(const MicroBatchLoader& load, float loss_scale) {
  clock_ = busy_ = 0.0;
  start_ = 0.0;
  start_ = now();
  state_.reducer().zero_grads();
  Kokkos::deep_copy(Exec(), losses_, 0.0);
  ring_passes_.clear();
  ring_open_ = 0;
  run_program(schedule_.program(grid_.pp_rank()), step_events_,
              [&](const Instruction& i, int k) { return execute(i, load, loss_scale, k); });
  for (auto& o : outgoing_) send_pool_.release(o.buffer, o.n);
  outgoing_.clear();
  for (auto& r : stamp_sends_) r.wait();
  stamp_sends_.clear();
  stamps_.clear();
  // The head's losses, read once the step is done (in micro-batch order: the same sum on every run).
  const auto losses = Kokkos::create_mirror_view(Kokkos::HostSpace(), losses_);
  Kokkos::deep_copy(Exec(), losses, losses_);
  Exec().fence();
  double loss_sum = 0.0;
  for (std::size_t m = 0; m < losses.extent(0); ++m) loss_sum += losses(m);
  return {loss_sum, clock_, busy_};
}

Completion Executor::execute_update(const Instruction& i, const AdamWStep& step) {
  ParameterStore& store = state_.store();
  Completion done;
  switch (i.op) {
    case Op::optimizer_update:
      state_.optimizer(i.layer).update(i.subgroup, i.site, step, state_.reducer().owned(i.layer), store);
      break;
    case Op::publish_params:
      state_.optimizer(i.layer).publish(store);
      if (i.stream == Stream::host_to_device) done.add(state_.streams().h2d.mark());
      break;
    case Op::share_params: store.share(i.layer); break;
    default: throw std::logic_error(std::string("instruction ") + op_name(i.op) + " in an optimizer program");
  }
  return done;
}

void Executor::update(const std::vector<Instruction>& program, const AdamWStep& step) {
  run_program(program, update_events_, [&](const Instruction& i, int) { return execute_update(i, step); });
}

}  // namespace lamina
