#include "lamina/parallel/hazards.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <set>
#include <stdexcept>

#include "lamina/core/format.hpp"
#include "lamina/core/host_parallel.hpp"

namespace lamina {

namespace {

// Streams whose work starts only after the work queued ahead of it has ended: one device
// stream or one worker each. Fetches (an all-gather may follow a copy), collectives and
// messages (non-blocking MPI operations progress side by side) only complete in order.
bool starts_in_order(int stream) {
  return stream == static_cast<int>(Stream::compute) || stream == static_cast<int>(Stream::host_to_device) ||
         stream == static_cast<int>(Stream::device_to_host) || stream == static_cast<int>(Stream::host);
}

// For each stream, the last instruction (global index) known to have ended, and with it every
// earlier one of that stream.
struct Clock {
  std::array<int, kStreams> done;
  Clock() { done.fill(-1); }
  void merge(const Clock& o) {
    for (std::size_t s = 0; s < done.size(); ++s) done[s] = std::max(done[s], o.done[s]);
  }
  bool ended(int index, int stream) const { return done[static_cast<std::size_t>(stream)] >= index; }
};

class Checker {
 public:
  Checker(const Schedule& s, std::vector<const std::vector<Instruction>*> programs) : s_(s) {
    for (const auto* p : programs) {
      base_.push_back(static_cast<int>(all_.size()));
      for (const Instruction& i : *p) all_.push_back(&i);
    }
    base_.push_back(static_cast<int>(all_.size()));
    end_.resize(all_.size());
    stream_.resize(all_.size());
    for (std::size_t g = 0; g < all_.size(); ++g) stream_[g] = stream_index(*all_[g]);
  }

  std::vector<Hazard> run() {
    for (std::size_t p = 0; p + 1 < base_.size(); ++p) {
      phase_ = static_cast<int>(p);
      for (int g = base_[p]; g < base_[p + 1]; ++g) instruction(g);
      drain(base_[p + 1]);
    }
    for (const auto& [held, id] : current_) {
      (void)id;
      report(-1, base_.back() - 1, BufferRef{}, "the step ends with " + describe(held) + " still taken");
    }
    return std::move(hazards_);
  }

 private:
  // An access: its instruction, and whether the host waited for it before going on.
  struct Use {
    int at = 0;
    bool at_issue = false;
  };
  struct Holding {
    Held held;
    std::map<std::pair<Buf, int>, std::vector<Use>> before;  // per part: the previous holders' accesses
    std::set<BufferRef> touched;
  };
  struct Frontier {
    std::vector<Use> writes, reads;
  };
  using Class = std::pair<Pool, int>;
  using Part = std::pair<Buf, int>;

  void instruction(int g) {
    const Instruction& i = *all_[static_cast<std::size_t>(g)];
    const int base = base_[static_cast<std::size_t>(phase_)];
    for (const int j : i.after) {
      if (j < 0 || base + j >= g) {
        report(g, g, BufferRef{}, strprintf("waits for instruction %d, which is not before it", j));
        continue;
      }
      host_.merge(end_[static_cast<std::size_t>(base + j)]);
    }
    // Given back when seen complete: the executor runs those follow-ups as it waits.
    for (auto it = pending_.begin(); it != pending_.end();) {
      if (host_.ended(it->first, stream_[static_cast<std::size_t>(it->first)])) {
        give_back(it->second);
        it = pending_.erase(it);
      } else {
        ++it;
      }
    }
    Clock start = host_;
    const int s = stream_[static_cast<std::size_t>(g)];
    if (last_on_[static_cast<std::size_t>(s)] >= 0 && starts_in_order(s))
      start.merge(end_[static_cast<std::size_t>(last_on_[static_cast<std::size_t>(s)])]);
    start_ = &start;
    for (const PoolEvent& e : i.pool)
      if (e.acquire) take(g, e.held);
    for (const Access& a : i.access) touch(g, a);
    for (const PoolEvent& e : i.pool)
      if (!e.acquire) give(g, e.held, e.at_completion);
    Clock end = start;
    end.done[static_cast<std::size_t>(s)] = g;
    end_[static_cast<std::size_t>(g)] = end;
    last_on_[static_cast<std::size_t>(s)] = g;
    if (holds_host(i, true)) host_.merge(end);
  }

  void drain(int next) {
    for (int s = 0; s < kStreams; ++s) host_.done[static_cast<std::size_t>(s)] = next - 1;
    for (const auto& [g, id] : pending_) {
      (void)g;
      give_back(id);
    }
    pending_.clear();
  }

  // Where a buffer lives: a pooled holder, or nowhere pooled (-1).
  bool pooled_container(const BufferRef& b, Held& h) const {
    switch (b.kind) {
      case Buf::input:
      case Buf::output:
      case Buf::grad:
      case Buf::offloaded:
      case Buf::checkpoint: {
        if (b.micro_batch < 0) return false;  // the chunk's one shared residual gradient
        const bool frames = (b.kind == Buf::input || b.kind == Buf::output || b.kind == Buf::grad) &&
                            offloaded_checkpoint(s_.spec(), s_.partition().chunk(b.chunk));
        h = Held{};
        h.chunk = b.chunk;
        h.micro_batch = b.micro_batch;
        if (frames) {
          h.pool = Pool::frames;
          h.frame = b.kind == Buf::input ? Frame::input : b.kind == Buf::output ? Frame::output : Frame::gradient;
        } else {
          h.pool = Pool::slots;
        }
        return true;
      }
      case Buf::gathered:
        h = Held{};
        h.pool = Pool::gathered;
        h.layer = b.layer;
        return true;
      case Buf::grads:
        if (s_.spec().layout.zero < 2) return false;
        h = Held{};
        h.pool = Pool::full_grads;
        h.layer = b.layer;
        return true;
      default: return false;
    }
  }
  // Buffers a pool may hand from one holder to another: a chunk's slots, all frames (one size
  // in fp32 runs), gathered parameters and full-size gradients (conservatively, every layer's).
  static Class class_of(const Held& h) { return {h.pool, h.pool == Pool::slots ? h.chunk : -1}; }
  static Part part_of(const Held& h, const BufferRef& b) {
    return h.pool == Pool::slots ? Part{b.kind, b.block} : Part{Buf::input, -1};
  }

  void take(int g, const Held& h) {
    if (current_.count(h)) {
      report(g, g, BufferRef{}, describe(h) + " is taken again before it was given back");
      return;
    }
    if (h.pool == Pool::slots || h.pool == Pool::frames) {
      for (const auto& [k, id] : pending_) {
        if (holdings_[static_cast<std::size_t>(id)].held == h) {
          report(k, g, BufferRef{}, describe(h) + " is taken again before its earlier holder gave it back");
        }
      }
    }
    Holding x;
    x.held = h;
    // What earlier holders did that the host has not seen end could still touch this buffer.
    auto& released = released_[class_of(h)];
    for (auto& [part, accesses] : released) {
      accesses.erase(std::remove_if(accesses.begin(), accesses.end(),
                                    [&](const Use& a) {
                                      return a.at_issue || host_.ended(a.at, stream_[static_cast<std::size_t>(a.at)]);
                                    }),
                     accesses.end());
      if (!accesses.empty()) x.before[part] = accesses;
    }
    current_[h] = static_cast<int>(holdings_.size());
    holdings_.push_back(std::move(x));
  }

  void give(int g, const Held& h, bool at_completion) {
    const auto it = current_.find(h);
    if (it == current_.end()) {
      report(g, g, BufferRef{}, "gives back " + describe(h) + ", which it does not hold");
      return;
    }
    const int id = it->second;
    current_.erase(it);
    if (at_completion) {
      pending_.push_back({g, id});
    } else {
      give_back(id);
    }
  }

  // The memory goes back to its pool: what was done to it must end before a later taker's use.
  void give_back(int id) {
    Holding& x = holdings_[static_cast<std::size_t>(id)];
    auto& released = released_[class_of(x.held)];
    for (const BufferRef& b : x.touched) {
      const auto f = state_.find({b, id});
      auto& into = released[part_of(x.held, b)];
      into.insert(into.end(), f->second.writes.begin(), f->second.writes.end());
      into.insert(into.end(), f->second.reads.begin(), f->second.reads.end());
      state_.erase(f);
    }
    x.touched.clear();
  }

  void touch(int g, const Access& a) {
    Held h;
    int id = -1;
    if (pooled_container(a.buffer, h)) {
      const auto it = current_.find(h);
      if (it == current_.end()) {
        report(g, g, a.buffer, "touches " + describe(a.buffer) + " while " + describe(h) + " is not taken");
        return;
      }
      id = it->second;
      Holding& x = holdings_[static_cast<std::size_t>(id)];
      if (x.touched.insert(a.buffer).second) {
        const auto before = x.before.find(part_of(h, a.buffer));
        // An earlier holder's accesses count as writes: any use here conflicts with them.
        if (before != x.before.end()) state_[{a.buffer, id}].writes = before->second;
      }
    }
    Frontier& f = state_[{a.buffer, id}];
    for (const Use& w : f.writes) require(w, g, a.buffer);
    const Use use{g, a.at_issue};
    if (a.write) {
      for (const Use& r : f.reads) require(r, g, a.buffer);
      f.writes.assign(1, use);
      f.reads.clear();
    } else {
      // A read ordered after an earlier one stands for it: a later write ordered after this
      // read is ordered after that one too.
      f.reads.erase(std::remove_if(f.reads.begin(), f.reads.end(), [&](const Use& r) { return ordered(r, g); }),
                    f.reads.end());
      f.reads.push_back(use);
    }
  }

  bool ordered(const Use& u, int g) const {
    const int a = u.at;
    if (a == g || (u.at_issue && a < g)) return true;
    const int sa = stream_[static_cast<std::size_t>(a)], sg = stream_[static_cast<std::size_t>(g)];
    if (sa == sg && starts_in_order(sg)) return true;
    return start_->ended(a, sa);
  }

  void require(const Use& u, int g, const BufferRef& b) {
    if (ordered(u, g)) return;
    const int a = u.at;
    const Instruction& x = *all_[static_cast<std::size_t>(a)];
    const Instruction& y = *all_[static_cast<std::size_t>(g)];
    bool xw = false, yw = false;
    for (const Access& c : x.access)
      if (c.buffer == b) xw = xw || c.write;
    for (const Access& c : y.access)
      if (c.buffer == b) yw = yw || c.write;
    report(a, g, b,
           strprintf("%s [%s] %s %s, and %s [%s] %s it without waiting for it", name(a).c_str(),
                     stream_index_name(stream_[static_cast<std::size_t>(a)]), xw ? "writes" : "reads",
                     describe(b).c_str(), name(g).c_str(), stream_index_name(stream_[static_cast<std::size_t>(g)]),
                     yw ? "writes" : "reads"));
  }

  std::string name(int g) const {
    int p = 0;
    while (base_[static_cast<std::size_t>(p) + 1] <= g) ++p;
    static const char* const phases[] = {"", "update: ", "next step: "};
    return strprintf("%s#%d %s", phases[p], g - base_[static_cast<std::size_t>(p)],
                     describe({*all_[static_cast<std::size_t>(g)]}, s_.final_layer()).c_str());
  }

  void report(int a, int g, const BufferRef& b, const std::string& what) {
    Hazard h;
    int p = 0;
    while (base_[static_cast<std::size_t>(p) + 1] <= g) ++p;
    h.program = p;
    h.second = g - base_[static_cast<std::size_t>(p)];
    int q = 0;
    const int first = a < 0 ? g : a;
    while (base_[static_cast<std::size_t>(q) + 1] <= first) ++q;
    h.first_program = q;
    h.first = first - base_[static_cast<std::size_t>(q)];
    h.buffer = b;
    h.message = a < 0 || a == g ? name(g) + ": " + what : what;
    hazards_.push_back(std::move(h));
  }

  const Schedule& s_;
  std::vector<const Instruction*> all_;
  std::vector<int> base_, stream_;
  std::vector<Clock> end_;
  std::array<int, kStreams> last_on_ = [] {
    std::array<int, kStreams> a;
    a.fill(-1);
    return a;
  }();
  Clock host_;
  const Clock* start_ = nullptr;
  int phase_ = 0;
  std::map<std::pair<BufferRef, int>, Frontier> state_;  // (buffer, holding or -1)
  std::map<Held, int> current_;                          // taken now: its holding
  std::vector<Holding> holdings_;
  std::vector<std::pair<int, int>> pending_;             // (instruction, holding) given back at completion
  std::map<Class, std::map<Part, std::vector<Use>>> released_;
  std::vector<Hazard> hazards_;
};

}  // namespace

std::vector<Hazard> find_hazards(const Schedule& schedule, const std::vector<Instruction>& step,
                                 const std::vector<Instruction>& update) {
  return Checker(schedule, {&step, &update, &step}).run();
}

void check_hazards(const Schedule& schedule, const std::vector<std::vector<Instruction>>& updates) {
  static const std::vector<Instruction> none;
  // Stages are checked side by side; the first stage with hazards is the one reported.
  for_each_index(static_cast<std::size_t>(schedule.stages()), 0, [&](std::size_t st) {
    const auto& update = st < updates.size() ? updates[st] : none;
    const std::vector<Hazard> h = find_hazards(schedule, static_cast<int>(st), update);
    if (h.empty()) return;
    std::string msg = strprintf("schedule '%s', stage %zu: %zu hazard(s):", schedule.name().c_str(), st, h.size());
    for (std::size_t k = 0; k < h.size() && k < 5; ++k) msg += "\n  " + h[k].message;
    throw std::logic_error(msg);
  });
}

}  // namespace lamina
