#include "lamina/plan/simulator.hpp"

#include <algorithm>
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

// One stage's host thread and stream clocks.
struct StageClock {
  bool serial = false;  // one timeline for every stream
  double host = 0.0;
  std::map<Stream, double> stream;
  std::map<int, double> prefetched;                      // layer -> when its prefetch ends
  std::map<std::pair<int, int>, double> acts_prefetched;  // (layer, micro-batch) -> end
  std::map<int, double> reduced;                         // layer -> when its reduction ends
  double busy = 0.0;

  // Runs `cost` on stream s from no earlier than `ready`; returns its end.
  double run(Stream s, double ready, double cost) {
    double& c = stream[serial ? Stream::compute : s];
    const double start = std::max({host, c, ready});
    c = start + cost;
    return c;
  }
};

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
// instructions that drive them run.
class PoolReplay {
 public:
  explicit PoolReplay(const MemoryModel& m) : zero_(m.zero), bf16_(m.bf16), dos_stage_(m.dos_stage) {
    for (const auto& [l, x] : m.layers) {
      Layer y;
      y.shard = x.shard;
      y.resident = x.resident;
      y.tier = x.tier;
      y.dynamic = x.dynamic;
      layers_[l] = y;
    }
  }

  void step(const std::vector<Instruction>& program, int final_layer) {
    for (const Instruction& i : program) {
      switch (i.op) {
        case Op::gather_params: gather(i.layer); break;
        case Op::prefetch_params: prefetch(i.layer); break;
        case Op::release_params: release(i.layer); break;
        case Op::backward:
          if (i.layer == final_layer) begin(0);
          begin(i.layer);
          break;
        case Op::reduce_grads: reduce(i.layer); break;
        case Op::sync_grads:
          for (auto& p : pending_) complete(p);
          pending_.clear();
          break;
        case Op::flush_grads: wait(i.layer); break;
        default: break;
      }
    }
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

  PoolModel params, grads, staging, staging16, dos;

 private:
  struct Layer {
    LayerShard shard;
    bool resident = true, dynamic = false;
    MemTier tier = MemTier::device;
    int count = 0;
    bool prefetched = false, staged16 = false, full = false;
  };
  struct Pending {
    int layer;
    bool temp, full;
  };

  void fetch(Layer& x) {
    const LayerShard& s = x.shard;
    params.acquire(s.padded);
    if (bf16_) {
      if (zero_ < 3 && x.tier == MemTier::host) {
        staging16.acquire(s.padded);  // held until gathered
        x.staged16 = true;
      } else if (zero_ == 3) {
        staging16.acquire(s.padded);
        if (x.tier == MemTier::host) {
          staging16.acquire(s.shard);
          staging16.release(s.shard);
        }
        staging16.release(s.padded);
      }
    } else if (zero_ == 3 && x.tier == MemTier::host) {
      staging.acquire(s.shard);
      staging.release(s.shard);
    }
  }
  void drop_staged16(Layer& x) {
    if (x.staged16) staging16.release(x.shard.padded);
    x.staged16 = false;
  }
  void gather(int l) {
    Layer& x = layers_.at(l);
    if (x.resident) return;
    if (x.prefetched) {
      x.prefetched = false;
      drop_staged16(x);
      return;
    }
    if (x.count++ > 0) return;
    fetch(x);
    drop_staged16(x);
  }
  void prefetch(int l) {
    Layer& x = layers_.at(l);
    if (x.resident || x.prefetched || x.count > 0) return;
    fetch(x);
    ++x.count;
    x.prefetched = true;
  }
  void release(int l) {
    Layer& x = layers_.at(l);
    if (x.resident || --x.count > 0) return;
    params.release(x.shard.padded);
  }
  void begin(int l) {
    Layer& x = layers_.at(l);
    if (zero_ < 2 || x.full) return;
    grads.acquire(x.shard.padded);
    x.full = true;
  }
  void reduce(int l) {
    if (zero_ == 0) return;
    for (auto& p : pending_) complete(p);
    pending_.clear();
    Layer& x = layers_.at(l);
    staging.acquire(x.shard.shard);
    pending_.push_back({l, true, zero_ >= 2});
    if (zero_ >= 2) x.full = false;
  }
  void complete(const Pending& p) {
    const Layer& x = layers_.at(p.layer);
    if (p.temp) staging.release(x.shard.shard);
    if (p.full) grads.release(x.shard.padded);
  }
  void wait(int l) {
    auto last = std::find_if(pending_.rbegin(), pending_.rend(), [&](const Pending& p) { return p.layer == l; });
    if (last == pending_.rend()) return;
    const auto end = last.base();
    for (auto it = pending_.begin(); it != end; ++it) complete(*it);
    pending_.erase(pending_.begin(), end);
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
  std::int64_t dos_stage_;
  std::map<int, Layer> layers_;
  std::vector<Pending> pending_;
};

}  // namespace

PoolPeaks simulate_memory(const Schedule& schedule, int stage, const std::vector<Instruction>& update,
                          const MemoryModel& model) {
  PoolReplay r(model);
  r.step(schedule.program(stage), schedule.final_layer());
  r.update(update);
  if (model.checkpoint) r.checkpoint();
  PoolPeaks p;
  p.params = 4 * r.params.elements();
  p.grads = 4 * r.grads.elements();
  p.communication = 4 * r.staging.elements() + 2 * r.staging16.elements();
  p.dos = 4 * r.dos.elements();
  return p;
}

Timeline simulate(const Schedule& s, const Pricer& price, bool serial) {
  const int stages = s.stages();
  const bool one_in_flight = s.spec().layout.zero >= 1;  // reduce-scatters run one at a time
  std::map<std::tuple<int, int, int>, double> arrivals;  // (kind, receiving chunk, micro-batch)
  std::vector<std::size_t> ip(static_cast<std::size_t>(stages), 0);
  std::vector<StageClock> st(static_cast<std::size_t>(stages));
  for (StageClock& c : st) c.serial = serial;
  Timeline t;
  std::size_t remaining = 0;
  for (int k = 0; k < stages; ++k) remaining += s.program(k).size();
  while (remaining > 0) {
    bool progress = false;
    for (int k = 0; k < stages; ++k) {
      const auto& prog = s.program(k);
      auto& i = ip[static_cast<std::size_t>(k)];
      StageClock& c = st[static_cast<std::size_t>(k)];
      while (i < prog.size()) {
        const Instruction& ins = prog[i];
        const double cost = price(ins, k);
        switch (ins.op) {
          case Op::recv_activation:
          case Op::recv_gradient: {
            const auto key = std::make_tuple(ins.op == Op::recv_activation ? 0 : 1, ins.chunk, ins.micro_batch);
            const auto it = arrivals.find(key);
            if (it == arrivals.end()) goto blocked;  // not sent yet: this stage waits
            c.host = std::max(c.host, it->second);
            arrivals.erase(it);
            break;
          }
          case Op::send_activation:
            arrivals[std::make_tuple(0, ins.chunk + 1, ins.micro_batch)] = c.host + cost;
            break;
          case Op::send_gradient:
            arrivals[std::make_tuple(1, ins.chunk - 1, ins.micro_batch)] = c.host + cost;
            break;
          case Op::forward:
          case Op::backward:
          case Op::recompute: {
            double ready = 0.0;
            const bool block = ins.layer > 0 && ins.layer < s.final_layer();
            if (ins.op == Op::forward && block &&
                s.spec().blocks[static_cast<std::size_t>(ins.layer - 1)].activations == ActivationPolicy::offload) {
              ready = c.stream[Stream::device_to_host];  // the staging buffer's last copy out is done
            }
            c.host = c.run(Stream::compute, ready, cost);
            c.busy += cost;
            break;
          }
          case Op::gather_params: {
            const auto pf = c.prefetched.find(ins.layer);
            if (pf != c.prefetched.end()) {  // takes over the prefetch: waits for it
              c.host = std::max(c.host, pf->second);
              c.prefetched.erase(pf);
            } else {
              c.host = c.run(ins.stream, 0.0, cost);
            }
            break;
          }
          case Op::prefetch_params: c.prefetched[ins.layer] = c.run(ins.stream, 0.0, cost); break;
          case Op::release_params: break;
          case Op::offload_activations: c.run(ins.stream, c.stream[Stream::compute], cost); break;
          case Op::prefetch_activations:
            c.acts_prefetched[{ins.layer, ins.micro_batch}] = c.run(ins.stream, c.stream[Stream::compute], cost);
            break;
          case Op::reload_activations: {
            const auto pf = c.acts_prefetched.find({ins.layer, ins.micro_batch});
            if (pf != c.acts_prefetched.end()) {
              c.host = std::max(c.host, pf->second);
              c.acts_prefetched.erase(pf);
            } else {
              c.host = c.run(ins.stream, c.stream[Stream::device_to_host], cost);
            }
            break;
          }
          case Op::reduce_grads:
            if (one_in_flight) c.host = std::max(c.host, c.stream[Stream::collective]);
            c.reduced[ins.layer] = c.run(Stream::collective, c.stream[Stream::compute], cost);
            break;
          case Op::sync_grads:
            c.host = std::max(c.host, c.stream[Stream::collective]);
            c.host = c.run(Stream::collective, 0.0, cost);
            break;
          case Op::flush_grads: {
            const auto r = c.reduced.find(ins.layer);
            if (r != c.reduced.end()) c.host = std::max(c.host, r->second);
            c.run(ins.stream, 0.0, cost);
            break;
          }
          case Op::optimizer_update:
          case Op::publish_params:
          case Op::share_params:
            throw std::logic_error("the step program of stage " + std::to_string(k) + " holds an optimizer instruction");
        }
        t.stream_busy[ins.stream] += cost;
        ++i;
        --remaining;
        progress = true;
      }
    blocked:;
    }
    if (!progress) throw std::logic_error("schedule '" + s.name() + "' deadlocks in the simulator");
  }
  if (!arrivals.empty()) throw std::logic_error("schedule '" + s.name() + "' sends messages nobody receives");
  for (const StageClock& c : st) {
    double end = c.host;
    for (const auto& kv : c.stream) end = std::max(end, kv.second);
    t.finish.push_back(end);
    t.busy.push_back(c.busy);
  }
  t.makespan = *std::max_element(t.finish.begin(), t.finish.end());
  return t;
}

UpdateTimeline simulate_update(const std::vector<Instruction>& program, const Pricer& price,
                               const std::map<int, double>& flushed, bool serial) {
  StageClock c;
  c.serial = serial;
  UpdateTimeline u;
  int arrived = -1;  // the layer whose host updates have waited for its gradients
  for (const Instruction& ins : program) {
    const double cost = price(ins, 0);
    switch (ins.op) {
      case Op::optimizer_update:
        if (ins.site == UpdateSite::host && ins.layer != arrived) {  // the first host subgroup waits for the flush
          const auto f = flushed.find(ins.layer);
          if (f != flushed.end()) c.host = std::max(c.host, f->second);
          arrived = ins.layer;
        }
        if (ins.site == UpdateSite::device) {
          c.run(Stream::compute, 0.0, cost);  // queued: the host goes on
          u.device += cost;
        } else {
          c.host = c.run(Stream::host, 0.0, cost);
          u.host += cost;
        }
        break;
      case Op::publish_params:
        c.host = std::max({c.host, c.stream[Stream::compute], c.stream[Stream::host]});
        c.host = c.run(ins.stream, 0.0, cost);
        break;
      case Op::share_params: c.host = c.run(Stream::collective, 0.0, cost); break;
      default: throw std::logic_error(std::string("instruction ") + op_name(ins.op) + " in an optimizer program");
    }
  }
  u.seconds = c.host;
  for (const auto& kv : c.stream) u.seconds = std::max(u.seconds, kv.second);
  return u;
}

}  // namespace lamina
