#include "lamina/parallel/schedule.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "F";
    case Op::backward: return "B";
    case Op::recompute: return "recompute";
    case Op::send_activation: return "send_act";
    case Op::recv_activation: return "recv_act";
    case Op::send_gradient: return "send_grad";
    case Op::recv_gradient: return "recv_grad";
    case Op::gather_params: return "gather";
    case Op::prefetch_params: return "prefetch";
    case Op::release_params: return "release";
    case Op::offload_activations: return "offload";
    case Op::prefetch_activations: return "prefetch_acts";
    case Op::reload_activations: return "reload";
    case Op::offload_checkpoint: return "offload_ckpt";
    case Op::prefetch_checkpoint: return "prefetch_ckpt";
    case Op::reduce_grads: return "reduce";
    case Op::sync_grads: return "sync_grads";
    case Op::flush_grads: return "flush";
    case Op::optimizer_update: return "update";
    case Op::publish_params: return "publish";
    case Op::share_params: return "share";
  }
  return "?";
}

const char* stream_name(Stream s) {
  switch (s) {
    case Stream::compute: return "compute";
    case Stream::host_to_device: return "h2d";
    case Stream::device_to_host: return "d2h";
    case Stream::fetch: return "fetch";
    case Stream::collective: return "collective";
    case Stream::link: return "link";
    case Stream::host: return "host";
  }
  return "?";
}

int stream_index(const Instruction& i) {
  if (i.stream != Stream::link) return static_cast<int>(i.stream);
  switch (i.op) {
    case Op::send_activation: return 6;
    case Op::recv_activation: return 7;
    case Op::send_gradient: return 8;
    default: return 9;
  }
}

const char* stream_index_name(int index) {
  static const char* const links[] = {"link act out", "link act in", "link grad out", "link grad in"};
  return index < 6 ? stream_name(static_cast<Stream>(index)) : links[index - 6];
}

bool holds_host(const Instruction& i, bool compute_queued) {
  if (i.op == Op::sync_grads || i.op == Op::share_params) return true;  // blocking collectives
  return i.stream == Stream::host || (i.stream == Stream::compute && !compute_queued);
}

std::tuple<int, int, int> message_key(const Instruction& i) {
  switch (i.op) {
    case Op::send_activation: return {0, i.chunk + 1, i.micro_batch};
    case Op::recv_activation: return {0, i.chunk, i.micro_batch};
    case Op::send_gradient: return {1, i.chunk - 1, i.micro_batch};
    default: return {1, i.chunk, i.micro_batch};
  }
}

bool offloaded_checkpoint(const StepSpec& spec, const Chunk& c) {
  return c.blocks() == 1 &&
         spec.blocks[static_cast<std::size_t>(c.first_block)].activations == ActivationPolicy::offload_checkpoint;
}

bool resident_params(const StepSpec& spec, int layer) {
  return policy_of_layer(spec.blocks, layer).params == MemTier::device && spec.layout.zero < 3;
}

std::vector<ScheduleProblem> schedule_problems(std::int64_t layers, const ParallelLayout& o) {
  std::vector<ScheduleProblem> out;
  const int pp = o.pp, M = o.micro_batches;
  auto add = [&](const char* key, std::string msg) { out.push_back({key, std::move(msg)}); };
  const long long L = static_cast<long long>(layers);
  if (o.layered && o.schedule == ScheduleKind::one_f_one_b && pp > 1) {
    add("parallel.layered", "layered gradient accumulation runs each layer over all micro-batches, which 1F1B's "
                            "alternation does not allow: use parallel.schedule = \"gpipe\" or \"modular\"");
  }
  if (o.layered && o.schedule == ScheduleKind::interleaved) {
    add("parallel.layered", "layered gradient accumulation with the interleaved schedule: use parallel.schedule = "
                            "\"modular\" (one layer per chunk, breadth-first)");
  }
  if (o.schedule == ScheduleKind::interleaved && o.virtual_stages < 2 && pp > 1) {
    add("parallel.virtual_stages", "the interleaved schedule needs virtual_stages >= 2");
  }
  if (pp > layers) {
    add("parallel.pp", strprintf("%d pipeline stages for model.layers = %lld: every stage needs at least one layer; "
                                 "use parallel.pp <= %lld",
                                 pp, L, L));
    return out;
  }
  switch (o.schedule) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b:
      if (layers % pp != 0) {
        add("parallel.pp", strprintf("model.layers = %lld cannot be cut into parallel.pp = %d equal stages; use a pp "
                                     "that divides the layers",
                                     L, pp));
      }
      break;
    case ScheduleKind::interleaved: {
      const int chunks = o.virtual_stages * pp;
      if (o.virtual_stages >= 2 && layers % chunks != 0) {
        add("parallel.virtual_stages",
            strprintf("model.layers = %lld cannot be cut into virtual_stages x pp = %d x %d = %d equal chunks; choose "
                      "virtual_stages so that it divides the layers per stage",
                      L, o.virtual_stages, pp, chunks));
      }
      if (!o.layered && M % pp != 0) {
        add("data.micro_batch_size",
            strprintf("the interleaved schedule needs the micro-batches per step (%d) to be a multiple of "
                      "parallel.pp = %d; change data.micro_batch_size or data.batch_size",
                      M, pp));
      }
      break;
    }
    case ScheduleKind::modular:
      if (layers % pp != 0) {
        add("parallel.pp", strprintf("the modular pipeline places layer l on stage l mod pp: model.layers = %lld must "
                                     "be a multiple of parallel.pp = %d",
                                     L, pp));
      } else if (!o.layered && M % pp != 0) {
        add("data.micro_batch_size",
            strprintf("the modular schedule without layered accumulation is interleaved 1F1B: the micro-batches per "
                      "step (%d) must be a multiple of parallel.pp = %d; change data.micro_batch_size or "
                      "data.batch_size, or set parallel.layered = true",
                      M, pp));
      }
      break;
  }
  return out;
}

namespace {

using Program = std::vector<Instruction>;

// A chunk-level step of the compute order: the forward or backward of a whole chunk.
struct ChunkStep {
  bool forward = true;
  int chunk = 0;
  int mb = 0;
};
using Order = std::vector<ChunkStep>;

ChunkStep F(int c, int m) { return {true, c, m}; }
ChunkStep B(int c, int m) { return {false, c, m}; }

// Forward and backward orders of one stage.
Order depth_first(const std::vector<int>& local, int M) {
  Order p;
  p.reserve(2 * local.size() * static_cast<std::size_t>(M));
  for (int m = 0; m < M; ++m)
    for (int c : local) p.push_back(F(c, m));
  for (int m = 0; m < M; ++m)
    for (auto it = local.rbegin(); it != local.rend(); ++it) p.push_back(B(*it, m));
  return p;
}

Order breadth_first(const std::vector<int>& local, int M) {
  Order p;
  p.reserve(2 * local.size() * static_cast<std::size_t>(M));
  for (int c : local)
    for (int m = 0; m < M; ++m) p.push_back(F(c, m));
  for (auto it = local.rbegin(); it != local.rend(); ++it)
    for (int m = 0; m < M; ++m) p.push_back(B(*it, m));
  return p;
}

// PipeDream-flush (Narayanan et al. 2021): pp - s - 1 warm-up forwards, then one forward
// and one backward alternately, then the remaining backwards.
Order one_f_one_b(int chunk, int stage, int stages, int M) {
  Order p;
  p.reserve(2 * static_cast<std::size_t>(M));
  const int warmup = std::min(stages - stage - 1, M);
  for (int m = 0; m < warmup; ++m) p.push_back(F(chunk, m));
  for (int i = 0; i < M - warmup; ++i) {
    p.push_back(F(chunk, warmup + i));
    p.push_back(B(chunk, i));
  }
  for (int m = M - warmup; m < M; ++m) p.push_back(B(chunk, m));
  return p;
}

// Forwards of Megatron's interleaved 1F1B before its first backward on `stage`.
int interleaved_warmup(int stage, int stages, int v, int M) {
  const int total = M * v;
  return M == stages ? total : std::min(total, (stages - stage - 1) * 2 + (v - 1) * stages);
}

// Megatron's interleaved 1F1B: micro-step k of a stage runs virtual chunk (k / pp) mod v
// (reversed in backward) on micro-batch (k / (pp v)) pp + k mod pp.
Order interleaved(int stage, int stages, int v, int M) {
  const int total = M * v;
  auto chunk_of = [&](int k, bool forward) {
    const int vi = (k / stages) % v;
    return (forward ? vi : v - 1 - vi) * stages + stage;
  };
  auto mb_of = [&](int k) { return (k / (stages * v)) * stages + k % stages; };
  const int warmup = interleaved_warmup(stage, stages, v, M);
  Order p;
  p.reserve(2 * static_cast<std::size_t>(total));
  for (int k = 0; k < warmup; ++k) p.push_back(F(chunk_of(k, true), mb_of(k)));
  for (int k = 0; k < total - warmup; ++k) {
    p.push_back(F(chunk_of(k + warmup, true), mb_of(k + warmup)));
    p.push_back(B(chunk_of(k, false), mb_of(k)));
  }
  for (int k = total - warmup; k < total; ++k) p.push_back(B(chunk_of(k, false), mb_of(k)));
  return p;
}

Instruction make(Op op, Stream stream, int chunk, int layer, int mb) {
  Instruction i;
  i.op = op;
  i.stream = stream;
  i.chunk = chunk;
  i.layer = layer;
  i.micro_batch = mb;
  return i;
}

// Turns one stage's chunk-level order into its instruction list, with the stream each
// instruction runs on, what it touches (annotate) and what it waits for (Instruction::after;
// the hazard checker, hazards.hpp, proves these enough):
//   compute      the fetch of every non-resident layer it reads; the message it consumes
//                (the chunk's input or its output's gradient); for an offloaded block's
//                forward, the previous copy out of the staging buffer it writes; for its
//                backward, the copy that brought its activations back
//   messages     a send, the compute that produced it (it copies its message out at
//                issue); a receive, the compute before it (its buffer may be the one a
//                micro-batch just finished with)
//   parameters   a release, the compute that read the gathered copy
//   activations  an offload, its block's forward; an offloaded block's forward, the offload
//                out of the staging buffer it writes (forwards take the two in turn, but
//                leave alone one prefetched for the next backward step); a prefetch (issued
//                a block, a forward step or in layered runs a backward step ahead) or a
//                reload into a staging buffer, the compute before it (the backward that last
//                read the buffer), the offload out of that buffer that may still be reading
//                it, and its own block's offload
//   checkpoints  an offload_checkpoint, its block's forward; the forward (or receive) that
//                takes an input frame, the stage's offload_checkpoint before the last (at most
//                three frames on their way out); a prefetch_checkpoint, its offload and the
//                compute before it (which may have given back the frame it fills), issued one
//                backward step ahead; a recomputation, its prefetch
//   gradients    a reduction, the layer's backward (and, ZeRO-2+, a block's also the
//                block reduction before it: one block's reduce-scatter holds a full-size
//                accumulator at a time; the embedding's and the final layer's only their
//                own before, beside the blocks'; ZeRO-1's read the stored gradients, and the
//                host does not wait for one to issue the next); a flush, the layer's final
//                reduction; sync_grads, every reduction
class StageBuilder {
 public:
  StageBuilder(const Schedule& s, const StepSpec& spec, int stage) : s_(s), spec_(spec), stage_(stage) {
    for (int c : s.partition().chunks_of(stage))
      for (int l : s.layers_of(s.partition().chunk(c))) ++users_[l];
  }

  Program build(const Order& order) {
    const Partition& part = s_.partition();
    const int last = part.num_chunks() - 1;
    const bool layered = spec_.layout.layered;
    // A breadth-first run: consecutive steps of the same pass over the same chunk; under
    // ZeRO-3 it holds the chunk's parameters from its first step to its last.
    auto same_run = [&](std::size_t a, std::size_t b) {
      return layered && order[a].chunk == order[b].chunk && order[a].forward == order[b].forward;
    };
    const bool hold_runs = layered && spec_.layout.zero == 3;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const ChunkStep& st = order[k];
      const Chunk& c = part.chunk(st.chunk);
      const bool run_start = !(k > 0 && same_run(k - 1, k));
      const bool run_end = !(k + 1 < order.size() && same_run(k, k + 1));
      // The layers a run reads: the embedding's backward needs no parameters, so a backward
      // run of the first chunk holds the embedding only where the chunk also has the head.
      auto read_of = [&](const ChunkStep& x) {
        const Chunk& xc = part.chunk(x.chunk);
        std::vector<int> ls = s_.layers_of(xc);
        if (!x.forward && xc.embedding && !(xc.head && spec_.tied_embeddings)) ls.erase(ls.begin());
        return ls;
      };
      // The first step of the run after this one (order.size(): none).
      auto next_run = [&] {
        std::size_t j = k;
        while (j + 1 < order.size() && same_run(j, j + 1)) ++j;
        return j + 1;
      };
      // Double-buffered (Lamy-Poirier's memory model): while a run computes, the next run's
      // parameters are gathered; layers both runs read stay held from one to the other.
      auto hold = [&] {
        if (!(hold_runs && run_start)) return;
        for (int l : read_of(st)) gather(l);
        held_ = true;
        const std::size_t next = next_run();
        if (next < order.size())
          for (int l : read_of(order[next])) prefetch(l);
      };
      auto unhold = [&] {
        if (!(hold_runs && run_end)) return;
        const std::size_t next = next_run();
        const std::vector<int> carried = next < order.size() ? read_of(order[next]) : std::vector<int>{};
        for (int l : read_of(st)) {
          if (std::find(carried.begin(), carried.end(), l) != carried.end() && holds_[l] == 1) {
            prefetched_.insert(l);  // the next run's gather takes over this hold
          } else {
            release(l);
          }
        }
        held_ = false;
      };
      // What the chunk's first compute needs comes in while the chunk waits for its input.
      auto prefetch_first = [&](bool forward) {
        if (hold_runs) return;  // a breadth-first run gathers and holds the chunk's parameters
        std::vector<int> first;
        if (forward) {
          first.push_back(c.embedding ? 0 : static_cast<int>(c.first_block) + 1);
        } else if (c.head) {
          if (spec_.tied_embeddings) first.push_back(0);
          first.push_back(s_.final_layer());
        } else {
          first.push_back(static_cast<int>(c.last_block));
        }
        for (int l : first) prefetch(l);
      };
      // Where the next step is a backward step whose chunk's last block is offloaded: that
      // block, which it restores first.
      auto next_restore = [&]() -> Staged {
        if (k + 1 == order.size() || order[k + 1].forward) return {-1, -1, -1};
        const Chunk& nc = part.chunk(order[k + 1].chunk);
        if (nc.blocks() == 0 || policy(nc.last_block - 1) != ActivationPolicy::offload) return {-1, -1, -1};
        return {nc.index, static_cast<int>(nc.last_block), order[k + 1].mb};
      };
      if (st.forward) {
        // Before a backward step of another micro-batch (1F1B's steady state) that step's
        // first offloaded block comes back during this forward, in the staging buffer that
        // this forward's own offloaded block (at most one) leaves alone.
        const Staged next = next_restore();
        const bool other = std::get<0>(next) >= 0 && !(order[k + 1].chunk == st.chunk && order[k + 1].mb == st.mb);
        if (other && offloaded_blocks(c) <= 1) {
          prefetch_acts(part.chunk(std::get<0>(next)), std::get<1>(next), std::get<2>(next));
          forward_buffer_ = 1 - staged_in(next);
        }
        prefetch_first(true);
        if (st.chunk > 0 && part.chunk(st.chunk - 1).stage != c.stage)
          receive(Op::recv_activation, st.chunk, st.mb, part.chunk(st.chunk - 1).stage);
        hold();
        forward(c, st.mb);
        unhold();
        if (st.chunk < last && part.chunk(st.chunk + 1).stage != c.stage)
          send(Op::send_activation, st.chunk, st.mb, part.chunk(st.chunk + 1).stage);
      } else {
        // Checkpoints come back one backward step ahead.
        if (offloaded_checkpoint(spec_, c)) prefetch_checkpoint(c, st.mb);
        if (k + 1 < order.size() && !order[k + 1].forward && offloaded_checkpoint(spec_, part.chunk(order[k + 1].chunk)))
          prefetch_checkpoint(part.chunk(order[k + 1].chunk), order[k + 1].mb);
        // The chunk's last block comes back first: its copy starts before the chunk's
        // backward (and the gradient it waits for), so that it is there when needed.
        if (c.blocks() > 0 && policy(c.last_block - 1) == ActivationPolicy::offload)
          prefetch_acts(c, static_cast<int>(c.last_block), st.mb);
        prefetch_first(false);
        if (st.chunk < last && part.chunk(st.chunk + 1).stage != c.stage)
          receive(Op::recv_gradient, st.chunk, st.mb, part.chunk(st.chunk + 1).stage);
        // A backward step that follows has its first offloaded block come back during this
        // step's last block (a chunk of one block would otherwise wait for each copy).
        next_restore_ = next_restore();
        hold();
        const int n = ++backwards_[st.chunk];
        const bool reduce = (spec_.layout.zero >= 2 && !layered) || n == spec_.layout.micro_batches;
        backward(c, st.mb, reduce);
        unhold();
        if (st.chunk > 0 && part.chunk(st.chunk - 1).stage != c.stage)
          send(Op::send_gradient, st.chunk, st.mb, part.chunk(st.chunk - 1).stage);
      }
    }
    Instruction sync = make(Op::sync_grads, Stream::collective, -1, -1, -1);
    sync.after = reductions_;
    emit(std::move(sync));
    for (int l : s_.layers_of_stage(stage_))
      if (host_updated(l) && !flushed_.count(l)) flush(l);
    for (const auto& [l, n] : holds_) {
      if (n != 0 || prefetched_.count(l)) {
        throw std::logic_error(strprintf("schedule '%s': stage %d leaves layer %d's parameters held",
                                         s_.name().c_str(), stage_, l));
      }
    }
    return p_;
  }

 private:
  bool resident(int l) const { return resident_params(spec_, l); }
  bool host_updated(int l) const { return policy_of_layer(spec_.blocks, l).optimizer != OptimizerPlacement::device; }
  ActivationPolicy policy(std::int64_t block) const {
    return spec_.blocks[static_cast<std::size_t>(block)].activations;
  }

  int emit(Instruction i) {
    annotate(i);
    p_.push_back(std::move(i));
    return static_cast<int>(p_.size()) - 1;
  }
  std::vector<int> after_last_compute() const {
    return last_compute_ >= 0 ? std::vector<int>{last_compute_} : std::vector<int>{};
  }

  // Parameters, counted as the parameter store counts holds: the first hold fetches (a
  // prefetch, or a gather where none is pending), the last release gives the copy back.
  void gather(int l) {
    if (resident(l)) return;
    if (prefetched_.erase(l)) return;  // the prefetch's hold becomes this use's
    if (holds_[l]++ > 0) return;
    fetch_[l] = emit(make(Op::gather_params, Stream::fetch, -1, l, -1));
    p_.back().pool.push_back({true, gathered(l), false});
  }
  void prefetch(int l) {
    if (resident(l) || holds_[l] > 0) return;
    holds_[l] = 1;
    prefetched_.insert(l);
    fetch_[l] = emit(make(Op::prefetch_params, Stream::fetch, -1, l, -1));
    p_.back().pool.push_back({true, gathered(l), false});
  }
  void release(int l) {
    if (resident(l) || --holds_[l] > 0) return;
    Instruction i = make(Op::release_params, Stream::host, -1, l, -1);
    i.after = after_last_compute();
    i.pool.push_back({false, gathered(l), false});
    emit(std::move(i));
  }
  // Per use, unless a breadth-first run holds the chunk's parameters.
  void use(int l) {
    if (!held_) gather(l);
  }
  void unuse(int l) {
    if (!held_) release(l);
  }

  void receive(Op op, int chunk, int mb, int peer) {
    Instruction i = make(op, Stream::link, chunk, -1, mb);
    i.peer = peer;
    i.after = after_last_compute();
    if (op == Op::recv_activation && offloaded_checkpoint(spec_, s_.partition().chunk(chunk))) wait_frame(i);
    received_ = emit(std::move(i));
  }
  // An instruction that takes an input frame in forward waits for the stage's offload
  // before the last one, which gives its frame back.
  void wait_frame(Instruction& i) const {
    if (checkpoint_offloads_.size() >= 2) i.after.push_back(checkpoint_offloads_[checkpoint_offloads_.size() - 2]);
  }
  void send(Op op, int chunk, int mb, int peer) {
    Instruction i = make(op, Stream::link, chunk, -1, mb);
    i.peer = peer;
    i.after = after_last_compute();
    emit(std::move(i));
  }

  // A compute instruction of chunk c on layer l, after what it reads.
  void compute(Op op, const Chunk& c, int l, int mb) {
    Instruction i = make(op, Stream::compute, c.index, l, mb);
    const int head = s_.final_layer();
    const bool reads_params = !(op == Op::backward && l == 0);
    auto needs = [&](int layer) {
      if (reads_params && !resident(layer)) i.after.push_back(fetch_.at(layer));
    };
    if (l == head) {
      if (spec_.tied_embeddings) needs(0);
      needs(head);
    } else {
      needs(l);
    }
    if (received_ >= 0) {  // the chunk's first compute of this step consumes its message
      i.after.push_back(received_);
      received_ = -1;
    }
    const bool block = l > 0 && l < head;
    if (offloaded_checkpoint(spec_, c)) {
      const bool first = l == (c.embedding ? 0 : static_cast<int>(c.first_block) + 1);
      if (op == Op::forward && first) wait_frame(i);
      if (op == Op::recompute) i.after.push_back(checkpoint_prefetches_.at({c.index, mb}));
    }
    if (block && policy(l - 1) == ActivationPolicy::offload) {
      i.buffer = op == Op::forward ? forward_buffer_ : reloaded_;  // where its activations pass
      if (op == Op::forward && offloading_[i.buffer] >= 0) i.after.push_back(offloading_[i.buffer]);
      if (op == Op::backward) {
        const auto it = restored_.find({c.index, l, mb});
        if (it != restored_.end() && it->second >= 0) i.after.push_back(it->second);
      }
    }
    last_compute_ = emit(std::move(i));
  }

  int offloaded_blocks(const Chunk& c) const {
    int n = 0;
    for (std::int64_t b = c.first_block; b < c.last_block; ++b) n += policy(b) == ActivationPolicy::offload;
    return n;
  }

  // The staging buffers of offloaded blocks, as the executor fills them: forwards take them
  // in turn (a block stays there until overwritten), so that one block's copy out runs
  // beside the next block's forward; a prefetch goes into the buffer the last restored block
  // does not occupy, a copy made on the spot into buffer 0.
  using Staged = std::tuple<int, int, int>;  // (chunk, layer, micro-batch)
  int staged_in(const Staged& b) const {
    for (int k = 0; k < 2; ++k)
      if (staged_[k] == b) return k;
    return -1;
  }
  void prefetch_acts(const Chunk& c, int l, int mb) {
    const Staged b{c.index, l, mb};
    if (staged_in(b) >= 0) return;  // still there from its forward, or prefetched
    Instruction i = make(Op::prefetch_activations, Stream::host_to_device, c.index, l, mb);
    i.buffer = 1 - reloaded_;
    i.after = after_last_compute();
    into_staging(i, b);
    staged_[i.buffer] = b;
    restored_[b] = emit(std::move(i));
  }
  // A copy back into a staging buffer starts once its block's copy out has ended, and once
  // the copy out of that staging buffer still reading it has too.
  void into_staging(Instruction& i, const Staged& b) const {
    const auto own = offloads_.find(b);
    if (own != offloads_.end()) i.after.push_back(own->second);
    if (offloading_[i.buffer] >= 0) i.after.push_back(offloading_[i.buffer]);
  }
  // A checkpoint back into a device frame (once: the step before may have asked for it).
  void prefetch_checkpoint(const Chunk& c, int mb) {
    if (checkpoint_prefetches_.count({c.index, mb})) return;
    Instruction i = make(Op::prefetch_checkpoint, Stream::host_to_device, c.index, static_cast<int>(c.first_block) + 1, mb);
    i.after = after_last_compute();
    i.after.push_back(checkpoint_offloaded_.at({c.index, mb}));
    checkpoint_prefetches_[{c.index, mb}] = emit(std::move(i));
  }
  // Before an offloaded block's backward: its activations in a staging buffer.
  void restore(const Chunk& c, int l, int mb) {
    const Staged b{c.index, l, mb};
    int k = staged_in(b);
    if (k < 0) {
      Instruction i = make(Op::reload_activations, Stream::host_to_device, c.index, l, mb);
      i.buffer = 0;
      i.after = after_last_compute();
      into_staging(i, b);
      k = 0;
      staged_[0] = b;
      restored_[b] = emit(std::move(i));
    } else if (!restored_.count(b)) {
      restored_[b] = -1;  // still in its staging buffer from its forward
    }
    reloaded_ = k;
  }

  void forward(const Chunk& c, int mb) {
    const int head = s_.final_layer();
    const bool tied = spec_.tied_embeddings;
    if (c.embedding) {
      use(0);
      compute(Op::forward, c, 0, mb);
      unuse(0);
    }
    for (std::int64_t b = c.first_block; b < c.last_block; ++b) {
      const int l = static_cast<int>(b) + 1;
      use(l);
      if (b + 1 < c.last_block && !held_) prefetch(l + 1);  // one layer ahead
      compute(Op::forward, c, l, mb);
      if (policy(b) == ActivationPolicy::offload_checkpoint) {
        Instruction i = make(Op::offload_checkpoint, Stream::device_to_host, c.index, l, mb);
        i.after = after_last_compute();
        checkpoint_offloads_.push_back(emit(std::move(i)));
        checkpoint_offloaded_[{c.index, mb}] = checkpoint_offloads_.back();
      }
      if (policy(b) == ActivationPolicy::offload) {
        Instruction i = make(Op::offload_activations, Stream::device_to_host, c.index, l, mb);
        i.buffer = forward_buffer_;
        i.after = after_last_compute();
        offloading_[forward_buffer_] = emit(std::move(i));
        offloads_[{c.index, l, mb}] = offloading_[forward_buffer_];
        staged_[forward_buffer_] = {c.index, l, mb};
        forward_buffer_ = 1 - forward_buffer_;
      }
      unuse(l);
    }
    if (c.head) {
      if (tied) use(0);
      use(head);
      compute(Op::forward, c, head, mb);
      if (tied) unuse(0);
      unuse(head);
    }
  }

  void backward(const Chunk& c, int mb, bool reduce) {
    const int head = s_.final_layer();
    const bool tied = spec_.tied_embeddings;
    const bool final = mb == spec_.layout.micro_batches - 1;
    if (c.head) {
      if (tied) use(0);
      use(head);
      compute(Op::backward, c, head, mb);
      if (tied) unuse(0);
      unuse(head);
      if (reduce) reduce_layer(head, final);
    }
    for (std::int64_t b = c.last_block; b-- > c.first_block;) {
      const int l = static_cast<int>(b) + 1;
      use(l);
      if (b > c.first_block && !held_) prefetch(l - 1);  // one layer ahead
      if (recomputed(policy(b))) compute(Op::recompute, c, l, mb);
      if (policy(b) == ActivationPolicy::offload) {
        restore(c, l, mb);
        // The previous block's come back into the other staging buffer meanwhile (the next
        // step's first, after the chunk's first).
        if (b > c.first_block && policy(b - 1) == ActivationPolicy::offload) {
          prefetch_acts(c, l - 1, mb);
        } else if (b == c.first_block && std::get<0>(next_restore_) >= 0) {
          const auto& [chunk, layer, micro_batch] = next_restore_;
          prefetch_acts(s_.partition().chunk(chunk), layer, micro_batch);
        }
      }
      compute(Op::backward, c, l, mb);
      unuse(l);
      if (reduce) reduce_layer(l, final);
    }
    if (c.embedding) compute(Op::backward, c, 0, mb);  // needs no parameters
    if (reduce && (c.embedding || (c.head && tied))) reduce_layer(0, final);
  }

  // Whether the pipeline's two ends add their halves of the tied embedding's gradient.
  bool synced_embedding() const { return spec_.layout.pp > 1 && spec_.tied_embeddings; }

  // A layer used by several local chunks (the tied embedding) is reduced after the last.
  void reduce_layer(int l, bool final) {
    if (++requested_[l] < users_[l]) return;
    requested_[l] = 0;
    Instruction i = make(Op::reduce_grads, Stream::collective, -1, l, -1);
    i.final = final;
    i.after = after_last_compute();
    // ZeRO-2/3: a block's reduce-scatter waits for the block's before it, so that the blocks
    // hold at most two full-size accumulators (one reduced, one summed into). The embedding's
    // and the final layer's wait only for their own before (which adds into the same shard)
    // and go beside the blocks': waiting for a block's (the head's pipeline end reduces them
    // with its last block) held the host, and the next chunk's backward, for both.
    const bool block = l > 0 && l < s_.final_layer();
    const int before = block ? last_block_reduction_ : (reduced_.count(l) ? reduced_[l] : -1);
    if (spec_.layout.zero >= 2 && before >= 0) i.after.push_back(before);
    reduced_[l] = emit(std::move(i));
    reductions_.push_back(reduced_[l]);
    if (block) last_block_reduction_ = reduced_[l];
    // Those that completed a host-updated layer's gradients start their copies to the
    // host, overlapping the rest of the backward pass. The tied embedding waits for the
    // other pipeline end's part (sync_grads).
    for (int f : final_) flush(f);
    final_.clear();
    if (final && host_updated(l) && !(l == 0 && synced_embedding())) final_.push_back(l);
  }
  void flush(int l) {
    Instruction i = make(Op::flush_grads, Stream::device_to_host, -1, l, -1);
    const auto r = reduced_.find(l);
    if (r != reduced_.end()) i.after.push_back(r->second);
    emit(std::move(i));
    flushed_.insert(l);
  }

  // What an instruction touches and the pooled buffers it takes and gives back, as the
  // executor runs it (executor.cpp).
  int first_layer(const Chunk& c) const { return c.embedding ? 0 : static_cast<int>(c.first_block) + 1; }
  bool previous_here(const Chunk& c) const {
    return c.index > 0 && s_.partition().chunk(c.index - 1).stage == c.stage;
  }
  static BufferRef acts(Buf kind, int chunk, int mb, int block = -1) {
    BufferRef b;
    b.kind = kind;
    b.chunk = chunk;
    b.micro_batch = mb;
    b.block = block;
    return b;
  }
  static BufferRef of_layer(Buf kind, int layer, int index = -1) {
    BufferRef b;
    b.kind = kind;
    b.layer = layer;
    b.index = index;
    return b;
  }
  // What the compute reads of a layer's parameters.
  BufferRef param(int l) const { return of_layer(resident(l) ? Buf::params : Buf::gathered, l); }
  // A chunk's output: its last block's, or (no blocks) its input.
  BufferRef chunk_output(const Chunk& c, int mb) const {
    return c.blocks() > 0 ? acts(Buf::output, c.index, mb, static_cast<int>(c.last_block) - 1)
                          : acts(Buf::input, c.index, mb);
  }
  BufferRef block_input(const Chunk& c, int mb, int b) const {
    return b == c.first_block ? acts(Buf::input, c.index, mb) : acts(Buf::output, c.index, mb, b - 1);
  }
  // Depth-first, a chunk's micro-batches share one residual-gradient buffer.
  BufferRef grad(const Chunk& c, int mb) const {
    return acts(Buf::grad, c.index, spec_.layout.layered ? mb : -1);
  }
  BufferRef owned_grads(int l) const { return of_layer(spec_.layout.zero >= 2 ? Buf::grad_shard : Buf::grads, l); }
  static Held slot(int chunk, int mb) {
    Held h;
    h.pool = Pool::slots;
    h.chunk = chunk;
    h.micro_batch = mb;
    return h;
  }
  static Held gathered(int l) {
    Held h;
    h.pool = Pool::gathered;
    h.layer = l;
    return h;
  }
  static Held full_grads(int l) {
    Held h;
    h.pool = Pool::full_grads;
    h.layer = l;
    return h;
  }

  void annotate(Instruction& i) {
    const Partition& part = s_.partition();
    const int head = s_.final_layer();
    auto read = [&](const BufferRef& b) { i.access.push_back({b, false}); };
    auto write = [&](const BufferRef& b) { i.access.push_back({b, true}); };
    const int mb = i.micro_batch, l = i.layer, b = l - 1;
    const Chunk* c = i.chunk >= 0 ? &part.chunk(i.chunk) : nullptr;
    // A micro-batch's slot opens with its chunk's first forward or its receive; frames bind into it.
    const bool opens = (i.op == Op::forward && l == first_layer(*c)) || i.op == Op::recv_activation;
    if (opens && open_.insert({c->index, mb}).second) i.pool.push_back({true, slot(c->index, mb), false});
    switch (i.op) {
      case Op::forward:
        if (l == first_layer(*c) && previous_here(*c)) {
          read(chunk_output(part.chunk(c->index - 1), mb));
          write(acts(Buf::input, c->index, mb));
        }
        if (l == 0) {
          read(param(0));
          write(acts(Buf::input, c->index, mb));
        } else if (l == head) {
          if (spec_.tied_embeddings) read(param(0));
          read(param(head));
          read(chunk_output(*c, mb));
        } else {
          read(param(l));
          read(block_input(*c, mb, b));
          write(acts(Buf::output, c->index, mb, b));
          if (i.buffer >= 0) write(of_layer(Buf::staging, -1, i.buffer));
        }
        break;
      case Op::recompute:  // its output, the next block's input, is kept: recomputed into the workspace
        read(param(l));
        read(block_input(*c, mb, b));
        break;
      case Op::backward:
        if (l == head) {
          if (spec_.tied_embeddings) read(param(0));
          read(param(head));
          read(chunk_output(*c, mb));
          if (spec_.tied_embeddings) begin(i, 0);
          begin(i, head);
          write(grad(*c, mb));
        } else if (l == 0) {
          read(grad(*c, mb));
          begin(i, 0);
        } else {
          read(param(l));
          read(block_input(*c, mb, b));
          if (i.buffer >= 0) read(of_layer(Buf::staging, -1, i.buffer));
          write(grad(*c, mb));
          begin(i, l);
        }
        if (l == first_layer(*c)) {
          if (previous_here(*c)) write(grad(part.chunk(c->index - 1), mb));
          // Without a gradient to send, the micro-batch is done here.
          if (c->index == 0 || previous_here(*c)) close(i, *c, mb);
        }
        break;
      case Op::offload_activations:
        read(of_layer(Buf::staging, -1, i.buffer));
        write(acts(Buf::offloaded, c->index, mb, b));
        break;
      case Op::prefetch_activations:
      case Op::reload_activations:
        read(acts(Buf::offloaded, c->index, mb, b));
        write(of_layer(Buf::staging, -1, i.buffer));
        break;
      case Op::offload_checkpoint:
        read(acts(Buf::input, c->index, mb));
        write(acts(Buf::checkpoint, c->index, mb));
        break;
      case Op::prefetch_checkpoint:
        read(acts(Buf::checkpoint, c->index, mb));
        write(acts(Buf::input, c->index, mb));
        break;
      case Op::send_activation: i.access.push_back({chunk_output(*c, mb), false, true}); break;
      case Op::recv_activation: write(acts(Buf::input, c->index, mb)); break;
      case Op::send_gradient:
        i.access.push_back({grad(*c, mb), false, true});
        close(i, *c, mb);
        break;
      case Op::recv_gradient: write(grad(*c, mb)); break;
      case Op::gather_params:
      case Op::prefetch_params:
        read(of_layer(Buf::params, l));
        write(of_layer(Buf::gathered, l));
        break;
      case Op::reduce_grads:
        if (spec_.layout.zero >= 2) {
          read(of_layer(Buf::grads, l));
          write(of_layer(Buf::grad_shard, l));
          i.pool.push_back({false, full_grads(l), true});  // the reduce-scatter reads it until done
          accumulating_.erase(l);
        } else {
          write(of_layer(Buf::grads, l));
        }
        break;
      case Op::sync_grads:
        if (synced_embedding() && users_.count(0)) write(owned_grads(0));
        break;
      case Op::flush_grads:
        read(owned_grads(l));
        write(of_layer(Buf::host_grads, l));
        break;
      default: break;
    }
    for (const PoolEvent& e : s_.frame_events(i)) i.pool.push_back(e);
  }
  // A backward starts layer l's gradient accumulator (ZeRO-2/3: a full-size one from the pool).
  void begin(Instruction& i, int l) {
    if (spec_.layout.zero >= 2 && accumulating_.insert(l).second) i.pool.push_back({true, full_grads(l), false});
    i.access.push_back({of_layer(Buf::grads, l), true});
  }
  void close(Instruction& i, const Chunk& c, int mb) {
    open_.erase({c.index, mb});
    i.pool.push_back({false, slot(c.index, mb), false});
  }

  const Schedule& s_;
  const StepSpec& spec_;
  int stage_;
  Program p_;
  bool held_ = false;
  std::map<int, int> users_, requested_, backwards_;
  std::map<int, int> holds_, fetch_;  // per layer: holds, the instruction that fetched it
  std::set<int> prefetched_;          // fetched ahead, not yet used
  int last_compute_ = -1, received_ = -1;
  int offloading_[2] = {-1, -1};  // the last copy out of each staging buffer
  int forward_buffer_ = 0;        // where the next offloaded block's forward writes
  std::map<Staged, int> offloads_, restored_;
  std::vector<int> checkpoint_offloads_;                 // in program order
  std::map<std::pair<int, int>, int> checkpoint_offloaded_, checkpoint_prefetches_;  // (chunk, micro-batch)
  Staged staged_[2] = {{-1, -1, -1}, {-1, -1, -1}};
  Staged next_restore_ = {-1, -1, -1};  // the next backward step's first offloaded block
  int reloaded_ = 0;
  std::map<int, int> reduced_;  // layer -> its last reduction
  std::vector<int> reductions_;
  int last_block_reduction_ = -1;
  std::vector<int> final_;
  std::set<int> flushed_;
  std::set<std::pair<int, int>> open_;  // (chunk, micro-batch) whose slot is taken
  std::set<int> accumulating_;          // ZeRO-2/3: layers holding a full-size accumulator
};

// Every receive has its send and no stage waits forever: runs the message dependencies.
void check_messages(const std::string& name, const std::vector<Program>& programs) {
  const int stages = static_cast<int>(programs.size());
  std::set<std::tuple<int, int, int>> sent;  // (kind, receiving chunk, micro-batch)
  std::vector<std::size_t> ip(static_cast<std::size_t>(stages), 0);
  std::size_t remaining = 0;
  for (const auto& p : programs) remaining += p.size();
  while (remaining > 0) {
    bool progress = false;
    for (int st = 0; st < stages; ++st) {
      const auto& prog = programs[static_cast<std::size_t>(st)];
      auto& i = ip[static_cast<std::size_t>(st)];
      while (i < prog.size()) {
        const Instruction& ins = prog[i];
        if (ins.op == Op::recv_activation || ins.op == Op::recv_gradient) {
          if (!sent.erase(message_key(ins))) break;  // not sent yet: this stage waits
        } else if (ins.op == Op::send_activation || ins.op == Op::send_gradient) {
          sent.insert(message_key(ins));
        }
        ++i;
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      std::string where;
      for (int st = 0; st < stages; ++st) {
        const auto& prog = programs[static_cast<std::size_t>(st)];
        const auto i = ip[static_cast<std::size_t>(st)];
        if (i < prog.size()) {
          where += strprintf(" stage %d at %s(chunk %d, micro-batch %d);", st, op_name(prog[i].op), prog[i].chunk,
                             prog[i].micro_batch);
        }
      }
      throw std::logic_error("schedule '" + name + "' deadlocks:" + where);
    }
  }
  if (!sent.empty()) throw std::logic_error("schedule '" + name + "' sends messages nobody receives");
}

// NCCL matches the messages of one communicator by their order alone, and lamina gives
// each direction between two neighbouring stages a communicator of its own (for
// activations and for gradients: ProcessGrid::link). So on every such channel the sender
// must issue its sends in the order the receiver issues its receives.
void check_message_order(const std::string& name, const std::vector<Program>& programs) {
  // (activation?, from stage, to stage) -> the messages in the order each side issues them
  std::map<std::tuple<bool, int, int>, std::vector<std::tuple<int, int, int>>> sent, received;
  for (int s = 0; s < static_cast<int>(programs.size()); ++s) {
    for (const Instruction& i : programs[static_cast<std::size_t>(s)]) {
      const bool activation = i.op == Op::send_activation || i.op == Op::recv_activation;
      if (i.op == Op::send_activation || i.op == Op::send_gradient) {
        sent[{activation, s, i.peer}].push_back(message_key(i));
      } else if (i.op == Op::recv_activation || i.op == Op::recv_gradient) {
        received[{activation, i.peer, s}].push_back(message_key(i));
      }
    }
  }
  for (const auto& [channel, order] : sent) {
    if (received[channel] != order) {
      throw std::logic_error(strprintf("schedule '%s': stage %d sends its %s to stage %d in another order than "
                                       "that stage receives them",
                                       name.c_str(), std::get<1>(channel), std::get<0>(channel) ? "activations" : "gradients",
                                       std::get<2>(channel)));
    }
  }
}

std::string layer_name(int layer, int final_layer, bool compute) {
  if (layer == 0) return "embedding";
  if (layer == final_layer) return compute ? "head" : "ln_f";
  return strprintf("h.%d", layer - 1);
}

}  // namespace

std::vector<int> Schedule::layers_of(const Chunk& c) const {
  std::vector<int> out;
  if (c.embedding || (c.head && spec_.tied_embeddings)) out.push_back(0);
  for (std::int64_t b = c.first_block; b < c.last_block; ++b) out.push_back(static_cast<int>(b) + 1);
  if (c.head) out.push_back(final_layer());
  return out;
}

std::vector<int> Schedule::layers_of_stage(int stage) const {
  std::set<int> held;
  for (int c : partition_.chunks_of(stage))
    for (int l : layers_of(partition_.chunk(c))) held.insert(l);
  return {held.begin(), held.end()};
}

namespace {

// The partition, a name and every stage's chunk-level order of a layout.
struct Orders {
  Partition partition;
  std::string name;
  std::vector<Order> order;
};

// The chunks of a layout (throws InputError for layouts schedule_problems() rejects).
// gpipe and 1F1B: one chunk per stage, or (layered) one block per chunk, consecutive
// blocks on each stage; interleaved and modular: v chunks per stage, round robin.
Partition partition_of(std::int64_t layers, const ParallelLayout& o) {
  const auto problems = schedule_problems(layers, o);
  if (!problems.empty()) throw InputError(problems.front().key + ": " + problems.front().message);
  if (o.schedule == ScheduleKind::gpipe || o.schedule == ScheduleKind::one_f_one_b) {
    return Partition::make(layers, o.pp, o.layered ? static_cast<int>(layers) : o.pp, false);
  }
  const int v = o.schedule == ScheduleKind::modular ? static_cast<int>(layers / o.pp) : o.virtual_stages;
  return Partition::make(layers, o.pp, v * o.pp, true);
}

Orders orders(std::int64_t layers, const ParallelLayout& o) {
  const int pp = o.pp, M = o.micro_batches;
  Orders r;
  r.partition = partition_of(layers, o);
  r.order.resize(static_cast<std::size_t>(pp));
  switch (o.schedule) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: {
      const bool gpipe = o.schedule == ScheduleKind::gpipe || o.layered;
      r.name = o.layered ? "gpipe, layer by layer" : gpipe ? "gpipe" : "1f1b";
      for (int st = 0; st < pp; ++st) {
        const auto local = r.partition.chunks_of(st);
        r.order[st] = o.layered ? breadth_first(local, M) : gpipe ? depth_first(local, M)
                                                                  : one_f_one_b(local.front(), st, pp, M);
      }
      break;
    }
    case ScheduleKind::interleaved:
    case ScheduleKind::modular: {
      const bool modular = o.schedule == ScheduleKind::modular;
      const int v = modular ? static_cast<int>(layers / pp) : o.virtual_stages;
      if (o.layered) {
        r.name = "modular, layer by layer";
        for (int st = 0; st < pp; ++st) r.order[st] = breadth_first(r.partition.chunks_of(st), M);
      } else {
        r.name = modular ? "modular (interleaved 1F1B, one layer per chunk)"
                         : strprintf("interleaved 1F1B, %d chunks per stage", v);
        for (int st = 0; st < pp; ++st) r.order[st] = interleaved(st, pp, v, M);
      }
      break;
    }
  }
  return r;
}

}  // namespace

ScheduleShape schedule_shape(std::int64_t layers, const ParallelLayout& layout) {
  ScheduleShape s;
  const int M = layout.micro_batches;
  // The planner asks this of thousands of layouts: where the orders have a closed form, no
  // order is built. Whole-batch orders (gpipe, layer by layer) run every micro-batch's
  // forward before the backwards; 1F1B's stage s holds pp - s (its warm-up and one more).
  if (layout.layered || layout.schedule == ScheduleKind::gpipe || layout.schedule == ScheduleKind::one_f_one_b) {
    s.partition = partition_of(layers, layout);
    s.in_flight.resize(static_cast<std::size_t>(s.partition.num_chunks()));
    for (int c = 0; c < s.partition.num_chunks(); ++c) {
      const bool whole_batch = layout.layered || layout.schedule == ScheduleKind::gpipe;
      s.in_flight[static_cast<std::size_t>(c)] = whole_batch ? M : std::min(layout.pp - s.partition.chunk(c).stage, M);
    }
    return s;
  }
  // Interleaved orders (modular: one block per chunk): micro-step k of a stage runs chunk
  // (k / pp) mod v, so the first n micro-steps hold `count(n, vi)` steps of chunk vi, and a
  // forward's chunk vi meets backwards of chunk vi at vi' = v - 1 - vi. After the warm-up W,
  // steady step i issues forward W + i before backward i: the chunk then holds
  // count(W + i + 1, vi) - count(i, v - 1 - vi), which repeats with period pp v in i.
  const int pp = layout.pp;
  const int v = layout.schedule == ScheduleKind::modular ? static_cast<int>(layers / pp) : layout.virtual_stages;
  s.partition = partition_of(layers, layout);
  s.in_flight.assign(static_cast<std::size_t>(s.partition.num_chunks()), 0);
  const std::int64_t period = static_cast<std::int64_t>(pp) * v, total = static_cast<std::int64_t>(M) * v;
  auto count = [&](std::int64_t n, int vi) {
    return n / period * pp + std::clamp<std::int64_t>(n % period - static_cast<std::int64_t>(vi) * pp, 0, pp);
  };
  for (int st = 0; st < pp; ++st) {
    const std::int64_t warmup = interleaved_warmup(st, pp, v, M);
    for (int vi = 0; vi < v; ++vi) {
      std::int64_t most = count(warmup, vi);
      for (std::int64_t i = 0; i < std::min(total - warmup, period); ++i) {
        most = std::max(most, count(warmup + i + 1, vi) - count(i, v - 1 - vi));
      }
      s.in_flight[static_cast<std::size_t>(vi * pp + st)] = static_cast<int>(most);
    }
  }
  return s;
}

Schedule Schedule::build(const StepSpec& spec) {
  Orders o = orders(spec.layers, spec.layout);
  Schedule s;
  s.spec_ = spec;
  s.partition_ = o.partition;
  s.name_ = o.name;
  for (int st = 0; st < spec.layout.pp; ++st) s.programs_.push_back(StageBuilder(s, spec, st).build(o.order[st]));
  check_messages(s.name_, s.programs_);
  check_message_order(s.name_, s.programs_);
  return s;
}

int Schedule::max_in_flight(int chunk) const {
  const Chunk& c = partition_.chunk(chunk);
  const int first_layer = c.embedding ? 0 : static_cast<int>(c.first_block) + 1;
  std::set<int> open;  // micro-batches whose activations the chunk holds
  std::size_t peak = 0;
  for (const Instruction& i : program(c.stage)) {
    if (i.chunk != chunk) continue;
    if (i.op == Op::recv_activation || i.op == Op::forward) open.insert(i.micro_batch);
    if (i.op == Op::backward && i.layer == first_layer) open.erase(i.micro_batch);
    peak = std::max(peak, open.size());
  }
  return static_cast<int>(peak);
}

std::string Schedule::describe(int stage) const { return lamina::describe(program(stage), final_layer()); }

std::vector<PoolEvent> Schedule::frame_events(const Instruction& i) const {
  std::vector<PoolEvent> e;
  if (i.chunk < 0) return e;
  const Chunk& c = partition_.chunk(i.chunk);
  auto pooled = [&](int k) { return offloaded_checkpoint(spec_, partition_.chunk(k)); };
  // The chunk before is on this stage: it hands its output and takes its gradient here.
  const bool previous_here = c.index > 0 && partition_.chunk(c.index - 1).stage == c.stage;
  const bool messages_in = c.index > 0 && !previous_here;  // its input and its gradient travel
  const int first = c.embedding ? 0 : static_cast<int>(c.first_block) + 1;
  const bool block = i.layer > 0 && i.layer < final_layer();
  auto frame = [&](Frame f, int k) {
    Held h;
    h.pool = Pool::frames;
    h.chunk = k;
    h.micro_batch = i.micro_batch;
    h.frame = f;
    return h;
  };
  auto take = [&](Frame f, int k) { e.push_back({true, frame(f, k), false}); };
  auto give = [&](Frame f, int k, bool at_completion = false) { e.push_back({false, frame(f, k), at_completion}); };
  const bool own = pooled(c.index);
  switch (i.op) {
    case Op::recv_activation:
      if (own) take(Frame::input, c.index);
      break;
    case Op::forward:
      if (i.layer == first && own && !messages_in) take(Frame::input, c.index);
      if (block && own) take(Frame::output, c.index);
      if (i.layer == first && previous_here && pooled(c.index - 1)) give(Frame::output, c.index - 1);
      break;
    case Op::send_activation:
      if (own) give(Frame::output, c.index);
      break;
    case Op::offload_checkpoint: give(Frame::input, c.index, true); break;
    case Op::prefetch_checkpoint: take(Frame::input, c.index); break;
    case Op::backward:
      if (i.layer == final_layer() && own) take(Frame::gradient, c.index);
      if (i.layer == first && previous_here && pooled(c.index - 1)) take(Frame::gradient, c.index - 1);
      if (i.layer == final_layer() && own) give(Frame::output, c.index);
      if (block && own) give(Frame::input, c.index);
      if (i.layer == first && own && !messages_in) give(Frame::gradient, c.index);
      break;
    case Op::recv_gradient:
      if (own) take(Frame::gradient, c.index);
      break;
    case Op::send_gradient:
      if (own) give(Frame::gradient, c.index);
      break;
    default: break;
  }
  return e;
}

std::vector<Instruction> update_program(const std::vector<LayerUpdate>& layers, int zero) {
  std::vector<Instruction> p;
  auto of_layer = [](Buf kind, int layer, int index = -1) {
    BufferRef b;
    b.kind = kind;
    b.layer = layer;
    b.index = index;
    return b;
  };
  std::map<int, std::vector<int>> published;  // what a layer's share waits for
  for (const LayerUpdate& u : layers) {
    if (u.sites.empty()) continue;
    // State on the device: each update writes its part of the stored parameters as it
    // computes it (fp32 in place, bf16 rounded), and nothing is left to publish.
    const bool in_place = u.placement == OptimizerPlacement::device;
    std::vector<int> updates;
    // Device subgroups first: their copies and kernels are queued on the device and run
    // while the host updates the others.
    for (const UpdateSite pass : {UpdateSite::device, UpdateSite::host}) {
      for (std::size_t g = 0; g < u.sites.size(); ++g) {
        if (u.sites[g] != pass) continue;
        const bool device = pass == UpdateSite::device;
        Instruction i = make(Op::optimizer_update, device ? Stream::compute : Stream::host, -1, u.layer, -1);
        i.subgroup = static_cast<int>(g);
        i.site = pass;
        i.access.push_back({of_layer(device ? (zero >= 2 ? Buf::grad_shard : Buf::grads) : Buf::host_grads, u.layer),
                            false});
        i.access.push_back({of_layer(Buf::optimizer, u.layer, static_cast<int>(g)), true});
        if (in_place) i.access.push_back({of_layer(Buf::params, u.layer), true});
        updates.push_back(static_cast<int>(p.size()));
        p.push_back(i);
      }
    }
    if (in_place) {
      published[u.layer] = updates;
      continue;
    }
    // The updated master weights (in host memory) reach the stored parameters.
    Instruction i = make(Op::publish_params, Stream::host_to_device, -1, u.layer, -1);
    i.after = updates;
    for (std::size_t g = 0; g < u.sites.size(); ++g)
      i.access.push_back({of_layer(Buf::optimizer, u.layer, static_cast<int>(g)), false});
    i.access.push_back({of_layer(Buf::params, u.layer), true});
    published[u.layer] = {static_cast<int>(p.size())};
    p.push_back(i);
  }
  if (zero == 1 || zero == 2) {
    for (const LayerUpdate& u : layers) {
      Instruction i = make(Op::share_params, Stream::collective, -1, u.layer, -1);
      const auto it = published.find(u.layer);
      if (it != published.end()) i.after = it->second;
      i.access.push_back({of_layer(Buf::params, u.layer), true});
      p.push_back(i);
    }
  }
  return p;
}

std::string describe(const std::vector<Instruction>& program, int final_layer) {
  std::string out;
  for (const Instruction& i : program) {
    if (!out.empty()) out += ' ';
    out += op_name(i.op);
    const bool compute = i.op == Op::forward || i.op == Op::backward || i.op == Op::recompute;
    std::string args;
    if (i.layer >= 0) args += layer_name(i.layer, final_layer, compute);
    if (i.op == Op::send_activation || i.op == Op::recv_activation || i.op == Op::send_gradient ||
        i.op == Op::recv_gradient) {
      args += strprintf("c%d,%s%d", i.chunk, i.op == Op::send_activation || i.op == Op::send_gradient ? "to " : "from ",
                        i.peer);
    }
    if (i.micro_batch >= 0) args += strprintf("%sm%d", args.empty() ? "" : ",", i.micro_batch);
    if (i.op == Op::optimizer_update) args += strprintf(",g%d,%s", i.subgroup, i.site == UpdateSite::device ? "device" : "host");
    if (i.op == Op::reduce_grads && i.final) args += ",final";
    if (!args.empty()) out += "(" + args + ")";
  }
  return out;
}

double fill_and_drain_blocks(const ParallelLayout& layout, double blocks) {
  const double pp = layout.pp, M = layout.micro_batches;
  switch (layout.schedule) {
    case ScheduleKind::interleaved: return (pp - 1.0) * blocks / layout.virtual_stages;
    case ScheduleKind::modular: return (pp - 1.0) + (blocks - 1.0) * std::max(0.0, pp - M);
    default:
      // Layered, a stage passes a micro-batch on after its last block: after the first
      // (blocks - 1) blocks have taken every micro-batch.
      return layout.layered ? (pp - 1.0) * ((blocks - 1.0) * M + 1.0) : (pp - 1.0) * blocks;
  }
}

double clock_price(const Instruction& i, const ClockPrices& prices, int final_layer) {
  const bool block = i.layer > 0 && i.layer < final_layer;
  switch (i.op) {
    case Op::forward:
      return block ? prices.forward_block : i.layer == 0 ? prices.embedding : prices.head;
    case Op::recompute: return prices.forward_block;
    case Op::backward:
      return block ? prices.backward_block : i.layer == 0 ? prices.embedding : 2.0 * prices.head;
    default: return 0.0;
  }
}

}  // namespace lamina
