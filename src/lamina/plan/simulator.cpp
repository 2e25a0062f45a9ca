#include "lamina/plan/simulator.hpp"

#include <algorithm>
#include <array>
#include <stdexcept>
#include <tuple>

#include "lamina/core/format.hpp"

namespace lamina {

Pricer clock_pricer(const ClockPrices& prices, int final_layer) {
  return [prices, final_layer](const Instruction& i, int) {
    if (i.op == Op::send_activation || i.op == Op::send_gradient) return prices.p2p;
    return clock_price(i, prices, final_layer);
  };
}

double Timeline::bubble_fraction() const {
  if (makespan <= 0.0 || busy.empty()) return 0.0;
  double idle = 0.0;
  for (const double b : busy) idle += (makespan - b) / makespan;
  return idle / static_cast<double>(busy.size());
}

namespace {

// A BufferPool's size: per buffer size, the most buffers of it ever held at once.
class PoolModel {
 public:
  void acquire(std::int64_t n) {
    int& h = held_[n];
    peak_[n] = std::max(peak_[n], ++h);
  }
  void release(std::int64_t n) { --held_[n]; }
  std::int64_t elements() const {
    std::int64_t e = 0;
    for (const auto& [n, k] : peak_) e += n * k;
    return e;
  }

 private:
  std::map<std::int64_t, int> held_, peak_;
};

// What the parameter store, the gradient reducer and the optimizers take from the device
// pools (parallel/param_store.cpp, grad_reducer.cpp, memory/optimizer_updaters.cpp), as the
// instructions that drive them run. An asynchronous instruction gives its staging back when
// the first instruction that waits for it (`after`) is issued, as the executor completes it
// there, and the rest at the end of the program in order.
class PoolReplay {
 public:
  explicit PoolReplay(const MemoryModel& m)
      : zero_(m.zero), bf16_(m.bf16), dos_stage_(m.dos_stage), stream_frame_(m.stream_frame),
        gradient_frame_(m.gradient_frame) {
    for (const auto& [l, x] : m.layers) {
      Layer y;
      y.shard = x.shard;
      y.resident = x.resident;
      y.tier = x.tier;
      y.dynamic = x.dynamic;
      layers_[l] = y;
    }
  }

  void step(const Schedule& schedule, int stage) {
    const std::vector<Instruction>& program = schedule.program(stage);
    const int final_layer = schedule.final_layer();
    pending_.assign(program.size(), Done{});
    std::vector<std::vector<std::size_t>> on_stream(kStreams);
    std::vector<std::size_t> waited(kStreams, 0);
    // Waiting for an instruction completes the earlier ones of its stream first (Executor::wait_for).
    auto wait_for = [&](std::size_t j) {
      const auto s = static_cast<std::size_t>(stream_index(program[j]));
      while (waited[s] < on_stream[s].size() && on_stream[s][waited[s]] <= j) complete(on_stream[s][waited[s]++]);
      complete(j);
    };
    for (std::size_t k = 0; k < program.size(); ++k) {
      const Instruction& i = program[k];
      for (int j : i.after) wait_for(static_cast<std::size_t>(j));
      for (const PoolEvent& e : schedule.frame_events(i)) {
        if (e.acquire) {
          frames.acquire(frame_size(e));
        } else if (e.at_completion) {
          pending_[k].frames.push_back(frame_size(e));
        } else {
          frames.release(frame_size(e));
        }
      }
      on_stream[static_cast<std::size_t>(stream_index(i))].push_back(k);
      switch (i.op) {
        case Op::gather_params:
        case Op::prefetch_params: fetch(i.layer, k); break;
        case Op::release_params: release(i.layer); break;
        case Op::backward:
          if (i.layer == final_layer && schedule.spec().tied_embeddings) begin(0);  // as the executor
          begin(i.layer);
          break;
        case Op::reduce_grads: reduce(i.layer, k); break;
        default: break;
      }
    }
    for (std::size_t k = 0; k < program.size(); ++k) complete(k);
  }

  void update(const std::vector<Instruction>& program) {
    bool staged = false;
    for (const Instruction& i : program) {
      if (i.op == Op::optimizer_update && i.site == UpdateSite::device && layers_.at(i.layer).dynamic && !staged) {
        for (int k = 0; k < 3; ++k) dos.acquire(dos_stage_);
        staged = true;
      } else if (i.op == Op::publish_params && staged) {
        for (int k = 0; k < 3; ++k) dos.release(dos_stage_);
        staged = false;
      } else if (i.op == Op::share_params) {
        share(layers_.at(i.layer));
      }
    }
  }

  // A checkpoint assembles each layer's sharded parts on the device.
  void checkpoint() {
    for (const auto& [l, x] : layers_) {
      for (int part = 0; part < 3; ++part) {
        const bool sharded = part == 0 && !bf16_ ? zero_ == 3 : zero_ >= 1;
        if (!sharded) continue;
        staging.acquire(x.shard.shard);
        staging.acquire(x.shard.padded);
        staging.release(x.shard.padded);
        staging.release(x.shard.shard);
      }
    }
  }

  PoolModel params, params16, grads, staging, staging16, dos, frames;

 private:
  struct Layer {
    LayerShard shard;
    bool resident = true, dynamic = false;
    MemTier tier = MemTier::device;
    int count = 0;
    bool full = false;
  };
  // What an instruction's completion gives back (elements per pool).
  struct Done {
    std::vector<std::int64_t> staging, staging16, grads, frames;
  };
  std::int64_t frame_size(const PoolEvent& e) const {
    return e.held.frame == Frame::gradient ? gradient_frame_ : stream_frame_;
  }

  void complete(std::size_t k) {
    Done& d = pending_[k];
    for (const std::int64_t n : d.staging) staging.release(n);
    for (const std::int64_t n : d.staging16) staging16.release(n);
    for (const std::int64_t n : d.grads) grads.release(n);
    for (const std::int64_t n : d.frames) frames.release(n);
    d = Done{};
  }
  // ParameterStore::hold's first hold: the gathered buffer (in the stored format), and the
  // owned shard's staging from the host tier held until the all-gather is done.
  void fetch(int l, std::size_t k) {
    Layer& x = layers_.at(l);
    if (x.resident || x.count++ > 0) return;
    const LayerShard& s = x.shard;
    (bf16_ ? params16 : params).acquire(s.padded);
    if (zero_ == 3 && x.tier == MemTier::host) {
      (bf16_ ? staging16 : staging).acquire(s.shard);
      (bf16_ ? pending_[k].staging16 : pending_[k].staging).push_back(s.shard);
    }
  }
  void release(int l) {
    Layer& x = layers_.at(l);
    if (x.resident || --x.count > 0) return;
    (bf16_ ? params16 : params).release(x.shard.padded);
  }
  void begin(int l) {
    Layer& x = layers_.at(l);
    if (zero_ < 2 || x.full) return;
    grads.acquire(x.shard.padded);
    x.full = true;
  }
  void reduce(int l, std::size_t k) {
    if (zero_ == 0) return;
    Layer& x = layers_.at(l);
    staging.acquire(x.shard.shard);
    pending_[k].staging.push_back(x.shard.shard);
    if (zero_ >= 2) {
      pending_[k].grads.push_back(x.shard.padded);
      x.full = false;
    }
  }
  void share(const Layer& x) {
    const LayerShard& s = x.shard;
    PoolModel& pool = bf16_ ? staging16 : staging;
    pool.acquire(s.shard);
    if (x.tier == MemTier::host) {
      pool.acquire(s.padded);
      pool.release(s.padded);
    }
    pool.release(s.shard);
  }

  int zero_;
  bool bf16_;
  std::int64_t dos_stage_, stream_frame_, gradient_frame_;
  std::map<int, Layer> layers_;
  std::vector<Done> pending_;
};

}  // namespace

PoolPeaks simulate_memory(const Schedule& schedule, int stage, const std::vector<Instruction>& update,
                          const MemoryModel& model) {
  PoolReplay r(model);
  r.step(schedule, stage);
  r.update(update);
  if (model.checkpoint) r.checkpoint();
  PoolPeaks p;
  p.params = 4 * r.params.elements() + 2 * r.params16.elements();
  p.grads = 4 * r.grads.elements();
  p.communication = 4 * r.staging.elements() + 2 * r.staging16.elements();
  p.dos = 4 * r.dos.elements();
  p.frames = 4 * r.frames.elements();
  return p;
}

Timeline simulate(const Schedule& s, const Pricer& price, bool serial, bool compute_queued) {
  const int stages = s.stages();
  std::map<std::tuple<int, int, int>, double> arrivals;  // message_key -> when it has arrived
  struct Stage {
    std::size_t ip = 0;
    double host = 0.0;  // when the host issues the next instruction
    std::array<double, kStreams> free{};  // when each stream has done what it was given
    std::vector<double> end;  // per instruction
    double busy = 0.0;
  };
  std::vector<Stage> st(static_cast<std::size_t>(stages));
  Timeline t;
  std::size_t remaining = 0;
  for (int k = 0; k < stages; ++k) {
    remaining += s.program(k).size();
    st[static_cast<std::size_t>(k)].end.assign(s.program(k).size(), 0.0);
  }
  while (remaining > 0) {
    bool progress = false;
    for (int k = 0; k < stages; ++k) {
      const auto& prog = s.program(k);
      Stage& c = st[static_cast<std::size_t>(k)];
      while (c.ip < prog.size()) {
        const Instruction& ins = prog[c.ip];
        const bool recv = ins.op == Op::recv_activation || ins.op == Op::recv_gradient;
        const auto arrival = recv ? arrivals.find(message_key(ins)) : arrivals.end();
        if (recv && arrival == arrivals.end()) break;  // not sent yet: this stage waits for the other
        if (ins.op == Op::optimizer_update || ins.op == Op::publish_params || ins.op == Op::share_params)
          throw std::logic_error("the step program of stage " + std::to_string(k) + " holds an optimizer instruction");
        const double cost = price(ins, k);
        // The host waits for what the instruction needs before it issues it.
        for (int j : ins.after) c.host = std::max(c.host, c.end[static_cast<std::size_t>(j)]);
        // Its stream runs its work in order; on a host-only machine every stream shares the cores.
        double& free = c.free[static_cast<std::size_t>(serial ? 0 : stream_index(ins))];
        double end = std::max(c.host, free) + (recv ? 0.0 : cost);
        if (recv) {
          end = std::max(end, arrival->second);
          arrivals.erase(arrival);
        } else if (ins.op == Op::send_activation || ins.op == Op::send_gradient) {
          arrivals[message_key(ins)] = end;
        }
        free = end;
        if (holds_host(ins, compute_queued)) c.host = end;
        if (ins.op == Op::forward || ins.op == Op::backward || ins.op == Op::recompute) c.busy += cost;
        c.end[c.ip] = end;
        t.stream_busy[ins.stream] += cost;
        ++c.ip;
        --remaining;
        progress = true;
      }
    }
    if (!progress) throw std::logic_error("schedule '" + s.name() + "' deadlocks in the simulator");
  }
  if (!arrivals.empty()) throw std::logic_error("schedule '" + s.name() + "' sends messages nobody receives");
  for (const Stage& c : st) {
    double end = c.host;
    for (const double e : c.end) end = std::max(end, e);
    t.finish.push_back(end);
    t.busy.push_back(c.busy);
  }
  t.makespan = *std::max_element(t.finish.begin(), t.finish.end());
  return t;
}

UpdateTimeline simulate_update(const std::vector<Instruction>& program, const Pricer& price,
                               const std::map<int, double>& flushed, bool serial, bool compute_queued) {
  // The executor's rules (simulate's), and a host-updated layer's first host subgroup waits
  // for its gradients to arrive.
  UpdateTimeline u;
  double host = 0.0;
  std::array<double, kStreams> free{};
  std::vector<double> end(program.size(), 0.0);
  int arrived = -1;
  for (std::size_t k = 0; k < program.size(); ++k) {
    const Instruction& ins = program[k];
    if (ins.op != Op::optimizer_update && ins.op != Op::publish_params && ins.op != Op::share_params)
      throw std::logic_error(std::string("instruction ") + op_name(ins.op) + " in an optimizer program");
    const double cost = price(ins, 0);
    for (int j : ins.after) host = std::max(host, end[static_cast<std::size_t>(j)]);
    if (ins.op == Op::optimizer_update && ins.site == UpdateSite::host && ins.layer != arrived) {
      const auto f = flushed.find(ins.layer);
      if (f != flushed.end()) host = std::max(host, f->second);
      arrived = ins.layer;
    }
    double& f = free[static_cast<std::size_t>(serial ? 0 : stream_index(ins))];
    f = std::max(host, f) + cost;
    end[k] = f;
    if (holds_host(ins, compute_queued)) host = f;
    if (ins.op == Op::optimizer_update) (ins.site == UpdateSite::device ? u.device : u.host) += cost;
  }
  u.seconds = host;
  for (const double e : end) u.seconds = std::max(u.seconds, e);
  return u;
}

}  // namespace lamina
