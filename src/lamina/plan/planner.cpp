#include "lamina/plan/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <tuple>

#include "lamina/core/error.hpp"
#include "lamina/plan/race_check.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/host_parallel.hpp"
#include "lamina/model/gpt_activations.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/parallel/grad_reducer.hpp"
#include "lamina/parallel/param_store.hpp"
#include "lamina/parallel/shard.hpp"
#include "lamina/plan/optimizer_plan.hpp"
#include "lamina/plan/simulator.hpp"

namespace lamina {

const char* solver_name(Solver s) {
  switch (s) {
    case Solver::dp: return "dp";
    case Solver::greedy: return "greedy";
    case Solver::brute: return "brute";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------
// The per-stage solvers

namespace {

bool fits(const StageProblem& p, double dev, double host) {
  return (p.device_budget <= 0 || dev <= p.device_budget) && (p.host_budget <= 0 || host <= p.host_budget);
}

StageSolution evaluate(const StageProblem& p, const std::vector<int>& choice) {
  StageSolution s;
  s.choice = choice;
  for (std::size_t b = 0; b < choice.size(); ++b) {
    const BlockChoice& c = p.blocks[b][static_cast<std::size_t>(choice[b])];
    s.seconds += c.seconds;
    s.device_bytes += c.device_bytes;
    s.host_bytes += c.host_bytes;
  }
  s.feasible = fits(p, s.device_bytes, s.host_bytes);
  return s;
}

}  // namespace

StageSolution solve_dp(const StageProblem& problem, std::size_t max_frontier) {
  // Choices no block would take (another is no slower and needs no more of either memory)
  // are dropped first; `index` maps back to the problem's choice numbers.
  StageProblem p;
  p.device_budget = problem.device_budget;
  p.host_budget = problem.host_budget;
  p.blocks.resize(problem.blocks.size());
  std::vector<std::vector<int>> index(p.blocks.size());
  // A memory no combination can overflow does not constrain the search: left out of the
  // frontier (the solution's totals are summed from the choices at the end).
  double most_dev = 0.0, most_host = 0.0;
  for (const auto& cs : problem.blocks) {
    double d = 0.0, h = 0.0;
    for (const BlockChoice& x : cs) d = std::max(d, x.device_bytes), h = std::max(h, x.host_bytes);
    most_dev += d;
    most_host += h;
  }
  const bool dev_binds = p.device_budget > 0 && most_dev > p.device_budget;
  const bool host_binds = p.host_budget > 0 && most_host > p.host_budget;
  for (std::size_t b = 0; b < p.blocks.size(); ++b) {
    std::vector<BlockChoice>& kept = p.blocks[b];
    const auto& cs = problem.blocks[b];
    for (std::size_t c = 0; c < cs.size(); ++c) {
      bool dominated = false;
      for (std::size_t d = 0; d < cs.size() && !dominated; ++d) {
        const bool no_worse = cs[d].seconds <= cs[c].seconds && cs[d].device_bytes <= cs[c].device_bytes &&
                              cs[d].host_bytes <= cs[c].host_bytes;
        const bool better = cs[d].seconds < cs[c].seconds || cs[d].device_bytes < cs[c].device_bytes ||
                            cs[d].host_bytes < cs[c].host_bytes;
        dominated = d != c && no_worse && (better || d < c);
      }
      if (!dominated) {
        kept.push_back(cs[c]);
        if (!dev_binds) kept.back().device_bytes = 0.0;
        if (!host_binds) kept.back().host_bytes = 0.0;
        index[b].push_back(static_cast<int>(c));
      }
    }
  }
  // Sums in whole bytes and picoseconds: exact, so that choices taken in another order
  // give the same point (one of them dominated by the other) instead of a near copy.
  const auto q_bytes = [](double b) { return static_cast<std::int64_t>(std::llround(b)); };
  const auto q_time = [](double t) { return static_cast<std::int64_t>(std::llround(t * 1e12)); };
  struct Point {
    std::int64_t dev, host, time;
    int parent, choice;
  };
  const std::int64_t dev_cap = p.device_budget > 0 ? q_bytes(p.device_budget) : 0;
  const std::int64_t host_cap = p.host_budget > 0 ? q_bytes(p.host_budget) : 0;
  const std::size_t n = p.blocks.size();
  // What no completion of a prefix can beat: the least time, device and host bytes the
  // remaining blocks add (each least on its own), and the greedy plan, which the optimum is
  // no slower than (its time summed in another order: a picosecond per block of slack).
  std::vector<std::int64_t> rest_dev(n + 1, 0), rest_host(n + 1, 0), rest_time(n + 1, 0);
  for (std::size_t b = n; b-- > 0;) {
    std::int64_t d = std::numeric_limits<std::int64_t>::max(), h = d, t = d;
    for (const BlockChoice& x : p.blocks[b]) {
      d = std::min(d, q_bytes(x.device_bytes));
      h = std::min(h, q_bytes(x.host_bytes));
      t = std::min(t, q_time(x.seconds));
    }
    rest_dev[b] = rest_dev[b + 1] + d;
    rest_host[b] = rest_host[b + 1] + h;
    rest_time[b] = rest_time[b + 1] + t;
  }
  const StageSolution greedy = solve_greedy(problem);
  const std::int64_t bound = greedy.feasible ? q_time(greedy.seconds) + static_cast<std::int64_t>(n) + 1
                                             : std::numeric_limits<std::int64_t>::max();
  std::vector<std::vector<Point>> levels(n + 1);
  levels[0].push_back({0, 0, 0, -1, -1});
  const auto earlier = [](const Point& a, const Point& b) {
    return a.time != b.time ? a.time < b.time : a.dev != b.dev ? a.dev < b.dev : a.host < b.host;
  };
  // The candidates of a level, the merges' other buffer and the frontier kept (each level's
  // copied out at its size: the buffers grow once, not at every level).
  std::vector<Point> next, other, kept;
  std::vector<std::size_t> runs, merged;
  std::vector<std::pair<std::int64_t, std::int64_t>> stairs;
  std::vector<char> taken;  // memory buckets that have their fastest point
  for (std::size_t b = 0; b < n; ++b) {
    next.clear();
    const auto& prev = levels[b];
    // One run per choice: the previous frontier is in (time, device, host) order, and adding
    // one choice's (exact) costs to every point keeps that order, so the runs are merged
    // rather than sorted.
    runs.assign(1, 0);
    for (std::size_t c = 0; c < p.blocks[b].size(); ++c) {
      const BlockChoice& x = p.blocks[b][c];
      const std::int64_t dx = q_bytes(x.device_bytes), hx = q_bytes(x.host_bytes), tx = q_time(x.seconds);
      for (std::size_t i = 0; i < prev.size(); ++i) {
        // Fields written one by one: a Point built whole on the stack and copied in was read
        // back before its parts had reached memory (a third of the solver's time stalled).
        const std::int64_t dev = prev[i].dev + dx, host = prev[i].host + hx, time = prev[i].time + tx;
        const bool can_finish = (dev_cap <= 0 || dev + rest_dev[b + 1] <= dev_cap) &&
                                (host_cap <= 0 || host + rest_host[b + 1] <= host_cap) &&
                                time + rest_time[b + 1] <= bound;
        if (!can_finish) continue;
        Point& q = next.emplace_back();
        q.dev = dev;
        q.host = host;
        q.time = time;
        q.parent = static_cast<int>(i);
        q.choice = static_cast<int>(c);
      }
      runs.push_back(next.size());
    }
    // Pareto frontier: keep a point only if no faster-or-equal point uses no more of
    // either memory. In time order, the kept points form a staircase (device bytes up,
    // host bytes down) that answers "is there one with no more of both" in log time.
    const auto at = [](std::vector<Point>& v, std::size_t i) { return v.begin() + static_cast<std::ptrdiff_t>(i); };
    while (runs.size() > 2) {
      merged.assign(1, 0);
      other.resize(next.size());
      std::size_t r = 0;
      for (; r + 2 < runs.size(); r += 2) {
        std::merge(at(next, runs[r]), at(next, runs[r + 1]), at(next, runs[r + 1]), at(next, runs[r + 2]),
                   at(other, runs[r]), earlier);
        merged.push_back(runs[r + 2]);
      }
      if (r + 1 < runs.size()) {  // an odd run out
        std::copy(at(next, runs[r]), at(next, runs[r + 1]), at(other, runs[r]));
        merged.push_back(runs[r + 1]);
      }
      next.swap(other);
      runs.swap(merged);
    }
    kept.clear();
    // (device bytes, least host bytes of a kept point with no more device bytes), by
    // device bytes; host bytes fall along it.
    stairs.clear();
    for (const Point& q : next) {
      auto it = std::partition_point(stairs.begin(), stairs.end(), [&](const auto& e) { return e.first <= q.dev; });
      if (it != stairs.begin() && std::prev(it)->second <= q.host) continue;  // dominated
      kept.push_back(q);
      // q now bounds every point with more device bytes and no less host memory.
      auto end = it;
      while (end != stairs.end() && end->second >= q.host) ++end;
      it = stairs.erase(it, end);
      if (it != stairs.begin() && std::prev(it)->first == q.dev) {
        std::prev(it)->second = q.host;
      } else {
        stairs.insert(it, {q.dev, q.host});
      }
    }
    if (kept.size() > max_frontier) {
      // H3T's buckets: memory rounded up to 1/128 of the budget (or of the largest use),
      // the fastest point of each bucket kept.
      double dmax = p.device_budget > 0 ? p.device_budget : 0.0, hmax = p.host_budget > 0 ? p.host_budget : 0.0;
      for (const Point& q : kept) {
        dmax = std::max(dmax, static_cast<double>(q.dev));
        hmax = std::max(hmax, static_cast<double>(q.host));
      }
      // The frontier is in time order: a bucket's first point is its fastest, and the points
      // kept stay in order for the next level's runs.
      constexpr int kCells = 129;  // 0 ... 128 per memory
      taken.assign(kCells * kCells, 0);
      std::size_t out = 0;
      for (const Point& q : kept) {
        const int dc = dmax > 0 ? static_cast<int>(std::ceil(128.0 * q.dev / dmax)) : 0;
        const int hc = hmax > 0 ? static_cast<int>(std::ceil(128.0 * q.host / hmax)) : 0;
        char& cell = taken[static_cast<std::size_t>(dc * kCells + hc)];
        if (cell) continue;
        cell = 1;
        kept[out++] = q;
      }
      kept.resize(out);
    }
    levels[b + 1].assign(kept.begin(), kept.end());
  }
  const auto& last = levels[n];
  if (last.empty()) return StageSolution{};
  std::size_t best = 0;
  for (std::size_t i = 1; i < last.size(); ++i)
    if (last[i].time < last[best].time) best = i;
  std::vector<int> chosen(n, 0);
  int at = static_cast<int>(best);
  for (std::size_t b = n; b-- > 0;) {
    const Point& q = levels[b + 1][static_cast<std::size_t>(at)];
    chosen[b] = index[b][static_cast<std::size_t>(q.choice)];
    at = q.parent;
  }
  return evaluate(problem, chosen);
}

StageSolution solve_greedy(const StageProblem& p) {
  const std::size_t n = p.blocks.size();
  // Start from the most memory-saving choice of every block (least device memory, then
  // least host memory); then, for every choice and every count k, put that choice on every
  // (n/k)-th block and keep the fastest plan within budget (H3T's greedy_scheduling).
  std::vector<int> saving(n, 0);
  for (std::size_t b = 0; b < n; ++b) {
    for (std::size_t c = 1; c < p.blocks[b].size(); ++c) {
      const BlockChoice& x = p.blocks[b][c];
      const BlockChoice& y = p.blocks[b][static_cast<std::size_t>(saving[b])];
      if (x.device_bytes < y.device_bytes || (x.device_bytes == y.device_bytes && x.host_bytes < y.host_bytes))
        saving[b] = static_cast<int>(c);
    }
  }
  StageSolution best = evaluate(p, saving);
  if (!best.feasible) return best;
  std::size_t choices = 0;
  for (const auto& b : p.blocks) choices = std::max(choices, b.size());
  for (std::size_t c = 0; c < choices; ++c) {
    for (std::size_t k = 1; k <= n; ++k) {
      std::vector<int> x = saving;
      for (std::size_t i = 0; i < k; ++i) {
        const std::size_t b = i * n / k;
        if (c < p.blocks[b].size()) x[b] = static_cast<int>(c);
      }
      const StageSolution s = evaluate(p, x);
      if (s.feasible && s.seconds < best.seconds) best = s;
    }
  }
  return best;
}

StageSolution solve_brute(const StageProblem& p) {
  const std::size_t n = p.blocks.size();
  std::vector<int> x(n, 0);
  StageSolution best;
  for (;;) {
    const StageSolution s = evaluate(p, x);
    if (s.feasible && (!best.feasible || s.seconds < best.seconds)) best = s;
    std::size_t b = 0;
    while (b < n && ++x[b] == static_cast<int>(p.blocks[b].size())) x[b++] = 0;
    if (b == n) break;
  }
  return best;
}

// ---------------------------------------------------------------------------------------
// The search

// The linear relaxation of the stage's knapsack: each block's choices as their lower convex
// hull in (bytes, seconds), every block at its hull's least bytes, then the steps along the
// hulls that save the most seconds per byte first, the last one in part. Infinite where the
// least bytes do not fit.
double stage_lower_bound(const StageProblem& p) {
  double seconds = 0.0, bytes = 0.0;
  std::vector<std::pair<double, double>> steps;  // (seconds saved per byte, bytes)
  std::vector<std::pair<double, double>> points, hull;  // (bytes, seconds)
  for (const auto& cs : p.blocks) {
    points.clear();
    for (const BlockChoice& x : cs) points.emplace_back(x.device_bytes, x.seconds);
    std::sort(points.begin(), points.end());
    hull.clear();
    for (const auto& c : points) {
      if (!hull.empty() && c.second >= hull.back().second) continue;  // no faster than one with fewer bytes
      while (hull.size() >= 2) {  // drop the last point where it lies on or above the chord
        const auto &a = hull[hull.size() - 2], &b = hull.back();
        if ((b.second - a.second) * (c.first - b.first) < (c.second - b.second) * (b.first - a.first)) break;
        hull.pop_back();
      }
      hull.push_back(c);
    }
    if (hull.empty()) return std::numeric_limits<double>::infinity();
    bytes += hull.front().first;
    seconds += hull.front().second;
    for (std::size_t i = 1; i < hull.size(); ++i) {
      const double db = hull[i].first - hull[i - 1].first;
      steps.emplace_back((hull[i - 1].second - hull[i].second) / db, db);
    }
  }
  const double budget = p.device_budget > 0 ? p.device_budget : std::numeric_limits<double>::infinity();
  if (bytes > budget) return std::numeric_limits<double>::infinity();
  std::sort(steps.begin(), steps.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [rate, db] : steps) {
    const double take = std::min(db, budget - bytes);
    seconds -= rate * take;
    bytes += take;
    if (take < db) break;
  }
  return seconds;
}

namespace {

using Clock = std::chrono::steady_clock;
using Acts = LayerRangeActs<Kokkos::DefaultExecutionSpace>;

std::vector<int> divisors(std::int64_t n, std::int64_t limit = std::numeric_limits<std::int64_t>::max()) {
  std::vector<int> out;
  for (std::int64_t d = 1; d <= n && d <= limit; ++d)
    if (n % d == 0) out.push_back(static_cast<int>(d));
  return out;
}

const std::vector<LayerPolicy>& all_policies() {
  static const std::vector<LayerPolicy> all = [] {
    std::vector<LayerPolicy> v;
    for (const auto a : {ActivationPolicy::keep, ActivationPolicy::recompute, ActivationPolicy::offload,
                         ActivationPolicy::offload_checkpoint})
      for (const auto t : {MemTier::device, MemTier::host})
        for (const auto o : {OptimizerPlacement::device, OptimizerPlacement::host, OptimizerPlacement::dynamic}) {
          if (t == MemTier::host && o == OptimizerPlacement::device) continue;  // the master weights live on the host
          v.push_back({a, t, o});
        }
    return v;
  }();
  return all;
}

// What the search may choose and what the deck fixes.
struct Freedom {
  std::set<std::string> keys;
  bool has(const std::string& k) const { return keys.count(k) != 0; }
};

// Per-rank capacity the plans must fit: the machine's memory, or the deck's budgets.
struct Capacity {
  double device = 0.0, host = 0.0;
  bool shared = false;  // a host-only machine: both tiers are the same memory
};

Capacity capacity(const Deck& deck, const MachineSpec& m) {
  Capacity c;
  const double per_rank_host = m.host_memory / std::max(1, m.devices_per_node);
  c.shared = m.device_is_host;
  c.device = m.device_is_host ? per_rank_host : m.device_memory;
  c.host = per_rank_host;
  if (deck.memory.device_budget > 0) c.device = std::min(c.device, static_cast<double>(deck.memory.device_budget));
  if (deck.memory.host_budget > 0) c.host = std::min(c.host, static_cast<double>(deck.memory.host_budget));
  return c;
}

ScheduleKind kind_of(const std::string& s) {
  return s == "gpipe"         ? ScheduleKind::gpipe
         : s == "interleaved" ? ScheduleKind::interleaved
         : s == "modular"     ? ScheduleKind::modular
                              : ScheduleKind::one_f_one_b;
}

}  // namespace

bool searched_context_parallel(const ModelConfig& m, int cp) {
  if (cp == 1) return true;
  const bool ring_attention = m.attention != AttentionProducts::in_place;
  return ring_attention && m.seq_len % (2 * cp) == 0 && m.seq_len / (2 * cp) >= detail::kFlashBlock;
}

namespace {

// Every layout the deck leaves open, within what the runtime supports.
std::vector<ParallelLayout> layouts(const Deck& deck, int ranks, const Freedom& f, const MachineSpec& machine,
                                    const PlannerOptions& options) {
  const ModelConfig& m = deck.model;
  const ParallelSection& p = deck.parallel;
  std::vector<ParallelLayout> out;
  const std::vector<int> tps = f.has("parallel.tp") ? divisors(ranks, machine.devices_per_node) : std::vector<int>{static_cast<int>(p.tp)};
  for (const int tp : tps) {
    if (!m.splits_over(tp) || ranks % tp != 0) continue;
    std::vector<int> cps{static_cast<int>(p.cp)};
    if (f.has("parallel.cp")) {
      cps.clear();
      for (const int c : divisors(ranks / tp)) {
        if (searched_context_parallel(m, c)) cps.push_back(c);
      }
    }
    for (const int cp : cps) {
      if ((ranks / tp) % cp != 0) continue;
      const std::vector<int> pps =
          f.has("parallel.pp") ? divisors(ranks / tp / cp, m.layers) : std::vector<int>{static_cast<int>(p.pp)};
      for (const int pp : pps) {
        if ((ranks / tp / cp) % pp != 0) continue;
        const int dp = ranks / tp / cp / pp;
        if (!f.has("parallel.dp") && dp != p.dp) continue;
        const std::int64_t batch = options.batch_cap > 0 ? options.batch_cap / dp * dp : deck.data.batch_size;
        if (batch < dp || batch % dp != 0) continue;
        std::vector<std::int64_t> mbss;
        if (f.has("data.micro_batch_size")) {
          for (const int d : divisors(batch / dp, 64)) mbss.push_back(d);
        } else {
          mbss.push_back(deck.data.micro_batch_size);
        }
        const std::vector<int> zeros = f.has("parallel.zero") ? (dp > 1 ? std::vector<int>{0, 1, 2, 3} : std::vector<int>{0})
                                                              : std::vector<int>{static_cast<int>(p.zero)};
        for (const std::int64_t mbs : mbss) {
          if (batch % (mbs * dp) != 0) continue;
          const int M = static_cast<int>(batch / (mbs * dp));
          for (const int zero : zeros) {
            // Schedules: (kind, virtual stages, layered).
            std::vector<std::tuple<ScheduleKind, int, bool>> kinds;
            const bool any_kind = f.has("parallel.schedule");
            const bool any_layered = f.has("parallel.layered");
            std::vector<ScheduleKind> ks;
            if (any_kind) {
              ks = pp == 1 ? std::vector<ScheduleKind>{ScheduleKind::one_f_one_b}
                           : std::vector<ScheduleKind>{ScheduleKind::gpipe, ScheduleKind::one_f_one_b,
                                                       ScheduleKind::interleaved, ScheduleKind::modular};
            } else {
              ks = {kind_of(p.schedule)};
            }
            for (const ScheduleKind k : ks) {
              std::vector<int> vs{1};
              if (k == ScheduleKind::interleaved) {
                vs.clear();
                if (f.has("parallel.virtual_stages")) {
                  for (const int v : divisors(m.layers / pp, 8))
                    if (v >= 2) vs.push_back(v);
                } else {
                  vs.push_back(static_cast<int>(p.virtual_stages));
                }
              }
              const std::vector<bool> ls = any_layered ? std::vector<bool>{false, true} : std::vector<bool>{p.layered};
              for (const int v : vs)
                for (const bool layered : ls) {
                  if (layered && pp > 1 && (k == ScheduleKind::one_f_one_b || k == ScheduleKind::interleaved)) continue;
                  if (layered && pp == 1 && k != ScheduleKind::one_f_one_b && k != ScheduleKind::gpipe) continue;
                  const bool standard = !layered && k != ScheduleKind::modular;
                  if (options.family == Family::standard && !standard) continue;
                  kinds.emplace_back(k, v, layered);
                }
            }
            // Sequence parallelism inside tensor-parallel groups whose ranks split the micro-batch's
            // rows (on a rank) evenly.
            const bool splits = tp > 1 && mbs * m.seq_len / cp % tp == 0;
            std::vector<bool> sps{p.sequence_parallel};
            if (f.has("parallel.sequence_parallel")) {
              sps = splits ? std::vector<bool>{false, true} : std::vector<bool>{false};
            }
            if (sps.front() && !splits) continue;
            for (const auto& [k, v, layered] : kinds) {
              for (const bool sp : sps) {
                ParallelLayout o;
                o.dp = dp;
                o.cp = cp;
                o.tp = tp;
                o.pp = pp;
                o.zero = zero;
                o.schedule = k;
                o.virtual_stages = v;
                o.layered = layered;
                o.sequence_parallel = sp;
                o.micro_batch_size = mbs;
                o.micro_batches = M;
                if (!schedule_problems(m.layers, o).empty()) continue;
                out.push_back(o);
              }
            }
          }
        }
      }
    }
  }
  return out;
}

// The choices a block may take: every policy, or the ones the deck fixes.
std::vector<LayerPolicy> choices_of(const Deck& deck, const Freedom& f, std::int64_t block) {
  std::vector<LayerPolicy> out;
  const auto i = static_cast<std::size_t>(block);
  for (const LayerPolicy& lp : all_policies()) {
    if (!f.has("memory.activations") && activation_policy_name(lp.activations) != deck.memory.activations[i]) continue;
    if (!f.has("memory.params") && mem_tier_name(lp.params) != deck.memory.params[i]) continue;
    if (!f.has("memory.optimizer") && optimizer_placement_name(lp.optimizer) != deck.memory.optimizer[i]) continue;
    out.push_back(lp);
  }
  return out;
}

// The additive model of one layout: per stage, the blocks' choices with their bytes and
// seconds, and what the stage holds whatever the blocks choose.
struct LayoutModel {
  ParallelLayout layout;
  bool checkpoints = false;  // blocks may offload their checkpoints (the stage holds the frames)
  std::vector<StageProblem> stages;
  std::vector<std::vector<std::int64_t>> stage_blocks;  // per stage, its blocks
  std::vector<std::vector<int>> stage_chunks;           // per stage, each block's chunk
  std::vector<double> fixed_seconds;                    // per stage: embedding, head, their updates
  std::vector<double> fixed_device, fixed_host;         // per stage
  std::vector<double> micro_batch_seconds;              // per stage: one micro-batch through it (for the bubble)
  double hop_seconds = 0.0;  // an activation and its gradient from one stage to the next
  // The first stage's fetches before its first block and collectives after its last.
  double edges = 0.0;
  // Compute alone, the slowest stage, the fill and drain and the edges (no choice changes them).
  double lower_bound = 0.0;
  // Bytes per rank with every saving on, the most of any stage (device, host): below the
  // capacity, or the layout cannot fit.
  double least_device = 0.0, least_host = 0.0;
  double sequences = 1.0;                               // the batch of this layout
  // Seconds per sequence: layouts with different batches compare by throughput.
  double per_sequence(double seconds) const { return seconds / sequences; }
};

// The objective's fill and drain of the pipeline (layout_objective), which no block's
// choice changes: part of the layout's lower bound. The schedule's closed form in blocks of
// the slowest stage.
double fill_and_drain(const LayoutModel& lm) {
  double per_mb = 0.0;
  for (const double t : lm.micro_batch_seconds) per_mb = std::max(per_mb, t);
  const double blocks = static_cast<double>(lm.stage_blocks[0].size());
  if (blocks == 0.0) return 0.0;
  // The messages on the way: one hop per stage, but a modular ring with fewer micro-batches
  // than stages waits for its first micro-batch, which passes every stage's every block.
  const ParallelLayout& o = lm.layout;
  const bool ring_waits = o.schedule == ScheduleKind::modular && o.micro_batches < o.pp;
  const double hops = ring_waits ? o.pp * blocks - 1.0 : o.pp - 1.0;
  return per_mb / blocks * fill_and_drain_blocks(o, blocks) + hops * lm.hop_seconds;
}

struct Costing {
  const Deck& deck;
  const MachineSpec& machine;
  const PlannerOptions& options;
  const Freedom& freedom;
  Capacity cap;
  std::map<int, ParamLayout> layouts;  // per tensor-parallel degree
  // Each block's choices (the deck may fix some keys per block).
  std::vector<std::vector<LayerPolicy>> choices;

  // Made before the layouts are modelled side by side, which only read them.
  void add_layout(int tp) {
    if (layouts.count(tp) == 0) layouts.emplace(tp, ParamLayout::of(deck.model, tp, 0));
  }
  const ParamLayout& layout(int tp) const { return layouts.at(tp); }
};

// ZeRO 1 and 2 all-gather each layer's updated shards after the optimizer step.
double share(const CostModel& cost, const ParallelLayout& o, int layer) {
  return o.zero == 1 || o.zero == 2 ? cost.share(layer) : 0.0;
}

// One block of a layout under each policy it may take: what it adds to its stage's step
// (an additive model: its compute, the part of its copies and collectives that its own
// compute does not hide, its optimizer update) and to its rank's memory (the memory model
// of plan/memory_estimate.hpp, which the exact estimate adds up too).
class BlockCosts {
 public:
  BlockCosts(const Costing& k, const Plan& plan, const ParamLayout& layout, const CostModel& cost)
      : k_(k), o_(plan.layout), plan_(plan), cost_(cost), serial_(k.machine.device_is_host),
        bf16_(plan.precision == Precision::bf16),
        shard_(LayerShard::of(layout.layers()[1].numel, plan.layout.replicas(), bf16_)) {
    Dims d = Dims::on_machine(k.deck.model, o_.micro_batch_size, o_.tp, k.machine.device_is_host,
                              o_.sequence_parallel, o_.cp);
    d.bf16 = bf16_;
    acts_ = activation_sizes(d);
    gather_device_ = cost.gather(1);
    Plan hosted = plan;
    for (LayerPolicy& b : hosted.blocks) b = {ActivationPolicy::keep, MemTier::host, OptimizerPlacement::host};
    gather_host_ = CostModel(k.deck.model, hosted, k.machine, k.options.measured, layout).gather(1);
    // Deep Optimizer States on the block's owned subgroups, with this machine's rates.
    DosModel dos;
    dos.host_rate = k.machine.host_adamw_rate / std::max(1, k.machine.devices_per_node);
    dos.device_rate = k.machine.device_adamw_rate > 0 ? k.machine.device_adamw_rate
                                                      : k.machine.memory_bandwidth * k.machine.adamw_efficiency / 28.0;
    dos.h2d = k.machine.h2d;
    dos.d2h = k.machine.d2h;
    dos.concurrent = !k.machine.device_is_host;
    std::vector<std::int64_t> sizes;
    for (const Subgroup& g :
         layout.subgroups(1, shard_.owned_begin(0, o_.zero), shard_.owned_end(0, o_.zero), plan.subgroup_size))
      sizes.push_back(g.end - g.begin);
    dos_ = plan_dos(sizes, dos, -1, DosSplit::model);
  }

  const ActivationSizes& activations() const { return acts_; }
  // The stage's last reduction, which no backward follows: the part copies() counts hidden.
  double reduction_tail() const {
    const double r = cost_.reduce(1);
    return r - exposed(r, reduction_window());
  }
  const LayerShard& shard() const { return shard_; }

  // Forward, backward and recomputation of the step's micro-batches, nothing else.
  double compute(ActivationPolicy a) const {
    const double M = o_.micro_batches;
    return M * (cost_.block_forward() + cost_.block_backward()) + (recomputed(a) ? M * cost_.block_forward() : 0.0);
  }

  // The same for every block of the layout: kept per policy.
  double seconds(const LayerPolicy& p) {
    const auto it = seconds_.find(policy_key(p));
    if (it != seconds_.end()) return it->second;
    return seconds_[policy_key(p)] = compute(p.activations) + copies(p) + update(p);
  }

  // Device and host bytes with `in_flight` micro-batches in flight (kept per policy and count).
  std::pair<double, double> bytes(const LayerPolicy& p, std::int64_t in_flight) {
    const auto key = std::make_pair(policy_key(p), in_flight);
    const auto it = bytes_.find(key);
    if (it != bytes_.end()) return it->second;
    Footprint f = layer_state(shard_, p, o_.zero, plan_.precision);
    f += block_activations(acts_, p.activations, bf16_, in_flight);
    return bytes_[key] = {static_cast<double>(f.total(MemTier::device)), static_cast<double>(f.total(MemTier::host))};
  }

  // What a copy or collective of t seconds adds beside a compute of c seconds: the part
  // the compute does not hide, or all of it where both take the same cores.
  double exposed(double t, double c) const { return serial_ ? t : std::max(0.0, t - c); }

 private:
  static int policy_key(const LayerPolicy& p) {
    return static_cast<int>(p.activations) * 9 + static_cast<int>(p.params) * 3 + static_cast<int>(p.optimizer);
  }

  // Activation copies, parameter fetches and gradient reductions, per step.
  double copies(const LayerPolicy& p) const {
    const double M = o_.micro_batches;
    const double tF = cost_.block_forward(), tB = cost_.block_backward();
    double t = 0.0;
    if (p.activations == ActivationPolicy::offload) {
      t += M * (exposed(cost_.activation_copy(true), tF) + exposed(cost_.activation_copy(false), tB));
    }
    if (p.activations == ActivationPolicy::offload_checkpoint) {  // the checkpoint out in forward, back in backward
      t += M * (exposed(cost_.checkpoint_copy(true), tF) + exposed(cost_.checkpoint_copy(false), tB + cost_.block_forward()));
    }
    if (p.params == MemTier::host || o_.zero == 3) {  // not resident: fetched per use
      const double g = p.params == MemTier::host ? gather_host_ : gather_device_;
      if (o_.layered && o_.zero == 3) {  // once per pass
        t += exposed(g, tF * pass_slots()) + exposed(g, tB * pass_slots());
      } else {
        t += M * (exposed(g, tF) + exposed(g, tB));
      }
    }
    const double reductions = o_.zero >= 2 && !o_.layered ? M : 1.0;
    return t + reductions * exposed(cost_.reduce(1), reduction_window());
  }
  // What hides a block's once-per-pass fetch or reduction: the neighbouring block's pass,
  // which in layers takes every micro-batch, and in a modular ring with fewer micro-batches
  // than stages also the wait for the first to come round.
  double pass_slots() const {
    if (!o_.layered) return 1.0;
    const int M = o_.micro_batches;
    return o_.schedule == ScheduleKind::modular ? std::max(M, o_.pp) : M;
  }
  // What hides a block's reduction: the backward until the stage's next gradients are whole.
  // Reduced once a step, a block's gradients are whole after its last micro-batch; with
  // several chunks per stage (interleaved, modular) a chunk's are, in the last group of pp
  // micro-batches, pp micro-batches' backward apart from the next chunk's.
  double reduction_window() const {
    const double tB = cost_.block_backward();
    if (o_.layered) return pass_slots() * tB;
    const bool chunks = (o_.schedule == ScheduleKind::interleaved && o_.virtual_stages > 1) ||
                        o_.schedule == ScheduleKind::modular;
    return o_.zero < 2 && chunks ? std::min(o_.micro_batches, o_.pp) * tB : tB;
  }

  // The optimizer step of the block's owned elements, with what crosses to the host, and
  // the updated shards shared.
  double update(const LayerPolicy& p) const { return owned_update(p) + share(cost_, o_, 1); }
  double owned_update(const LayerPolicy& p) const {
    const double tB = cost_.block_backward();
    const double owned = static_cast<double>(shard_.owned_size(o_.zero));
    const double param_bytes = bf16_ ? 2.0 : 4.0;
    const double host_part = static_cast<double>(dos_.host_params);
    switch (p.optimizer) {
      case OptimizerPlacement::device:
        return cost_.update(static_cast<std::int64_t>(owned), UpdateSite::device, false, bf16_);
      case OptimizerPlacement::host:
        return exposed(4.0 * owned / k_.machine.d2h, tB) +
               cost_.update(static_cast<std::int64_t>(owned), UpdateSite::host, true, false) +
               (p.params == MemTier::host ? 0.0 : owned * param_bytes / k_.machine.h2d);
      case OptimizerPlacement::dynamic:
        return exposed(4.0 * host_part / k_.machine.d2h, tB) + dos_.predicted_seconds +
               (p.params == MemTier::host ? 0.0 : host_part * param_bytes / k_.machine.h2d);
    }
    return 0.0;
  }

  const Costing& k_;
  ParallelLayout o_;
  const Plan& plan_;
  const CostModel& cost_;
  bool serial_, bf16_;
  LayerShard shard_;
  ActivationSizes acts_;
  double gather_device_ = 0.0, gather_host_ = 0.0;
  DosPlan dos_;
  std::map<int, double> seconds_;
  std::map<std::pair<int, std::int64_t>, std::pair<double, double>> bytes_;
};

// checkpoints: whether blocks may offload their checkpoints (layered layouts only); the
// stage then holds the frames their residual stream takes (about one layer's micro-batches:
// the outputs of one chunk, its gradients, a few checkpoints on their way), which the
// other variant of the layout does not.
LayoutModel model_layout(const Costing& k, const ParallelLayout& o, bool checkpoints) {
  const ModelConfig& m = k.deck.model;
  LayoutModel lm;
  lm.layout = o;
  lm.checkpoints = checkpoints;
  lm.sequences = static_cast<double>(o.dp) * static_cast<double>(o.micro_batch_size) * o.micro_batches;
  Plan plan;
  plan.layout = o;
  plan.blocks.assign(static_cast<std::size_t>(m.layers), LayerPolicy{});
  plan.precision = k.deck.train.precision;
  plan.tp_sums = tp_sum_precision(k.deck);
  plan.subgroup_size = k.deck.optimizer.subgroup_size;
  const bool bf16 = plan.precision == Precision::bf16;
  const ParamLayout& layout = k.layout(o.tp);
  const CostModel cost(m, plan, k.machine, k.options.measured, layout);
  BlockCosts block(k, plan, layout, cost);
  const ActivationSizes& a = block.activations();
  const LayerShard& shard = block.shard();
  const ScheduleShape shape = schedule_shape(m.layers, o);
  const double M = o.micro_batches;
  lm.hop_seconds = cost.p2p(true) + cost.p2p(false);
  // The pools' worst case: two gathered blocks, two full-size gradient accumulators and
  // their reduce-scatter staging, a scratch and two offload staging buffers.
  const double pools = 2.0 * (bf16 ? 2 : 4) * static_cast<double>(shard.padded) +
                       (o.zero >= 2 ? 2.0 * 4 * shard.padded : 0.0) + 4.0 * shard.padded + 3.0 * 4 * a.inner;
  const int stages = o.pp;
  lm.stages.resize(static_cast<std::size_t>(stages));
  lm.stage_blocks.resize(static_cast<std::size_t>(stages));
  lm.stage_chunks.resize(static_cast<std::size_t>(stages));
  lm.fixed_seconds.assign(static_cast<std::size_t>(stages), 0.0);
  lm.fixed_device.assign(static_cast<std::size_t>(stages), 0.0);
  lm.fixed_host.assign(static_cast<std::size_t>(stages), 0.0);
  lm.micro_batch_seconds.assign(static_cast<std::size_t>(stages), 0.0);
  for (int s = 0; s < stages; ++s) {
    StageProblem& sp = lm.stages[static_cast<std::size_t>(s)];
    double fixed = 4.0 * static_cast<double>(a.workspace + a.column_partials + a.sequence + a.context) + pools;
    double secs = 0.0, tail = 0.0;
    if (checkpoints) {
      fixed += 4.0 * static_cast<double>((M + 3) * Acts::stream_words(a, bf16) + (M + 1) * a.boundary);
    }
    for (int c : shape.partition.chunks_of(s)) {
      const Chunk& ch = shape.partition.chunk(c);
      const std::int64_t in_flight = shape.in_flight[static_cast<std::size_t>(c)];
      // Layered chunks hold one block: what the chunk keeps depends on that block's choice.
      const double range = static_cast<double>(in_flight * range_activations(a, ch.head, o.layered, bf16));
      const double pooled = static_cast<double>(in_flight * Acts::pooled_bytes(a, ch.head));
      fixed += (o.layered ? pooled : range) + (o.layered ? 0.0 : 4.0 * static_cast<double>(a.boundary));
      if (ch.embedding) secs += M * (cost.embed_forward() + cost.embed_backward());
      if (ch.head) secs += M * (cost.head_forward() + cost.head_backward());
      for (std::int64_t b = ch.first_block; b < ch.last_block; ++b) {
        lm.stage_blocks[static_cast<std::size_t>(s)].push_back(b);
        lm.stage_chunks[static_cast<std::size_t>(s)].push_back(c);
        // Blocks of one chunk hold as many micro-batches: with the same choices, the same costs.
        const auto& policies = k.choices[static_cast<std::size_t>(b)];
        if (b > ch.first_block && policies == k.choices[static_cast<std::size_t>(b - 1)]) {
          sp.blocks.push_back(sp.blocks.back());
          continue;
        }
        std::vector<BlockChoice> cs;
        cs.reserve(policies.size());
        for (const LayerPolicy& lp : policies) {
          const bool offloaded = lp.activations == ActivationPolicy::offload_checkpoint;
          if (offloaded && !checkpoints) continue;
          BlockChoice x;
          x.policy = lp;
          std::tie(x.device_bytes, x.host_bytes) = block.bytes(lp, in_flight);
          if (o.layered && !offloaded) x.device_bytes += range - pooled;
          if (k.cap.shared) {  // one memory: everything counts against it
            x.device_bytes += x.host_bytes;
            x.host_bytes = 0.0;
          }
          x.seconds = block.seconds(lp);
          cs.push_back(x);
        }
        sp.blocks.push_back(std::move(cs));
      }
      lm.micro_batch_seconds[static_cast<std::size_t>(s)] +=
          static_cast<double>(ch.blocks()) * (cost.block_forward() + cost.block_backward());
    }
    // The embedding (also on the last stage when the head reads it) and the final layer:
    // their states on the device (their policies follow the neighbouring blocks; the exact
    // estimate checks the final plan).
    for (int l : {0, static_cast<int>(m.layers) + 1}) {
      const bool held = l == 0 ? s == 0 || (s == stages - 1 && m.tie_embeddings) : s == stages - 1;
      if (!held) continue;
      const LayerShard ls = LayerShard::of(layout.layers()[static_cast<std::size_t>(l)].numel, o.dp, bf16);
      fixed += static_cast<double>(layer_state(ls, LayerPolicy{}, o.zero, plan.precision).total(MemTier::device));
      secs += cost.update(ls.owned_size(o.zero), UpdateSite::device, false, bf16) + share(cost, o, l);
      // Its reduction: the first stage's follows the stage's last compute; the last stage's
      // follow its first backward, beside the blocks' backward.
      const double blocks_backward =
          static_cast<double>(lm.stage_blocks[static_cast<std::size_t>(s)].size()) * cost.block_backward();
      if (l == 0 && s == 0) tail += cost.reduce(l);
      else secs += block.exposed(cost.reduce(l), blocks_backward);
    }
    if (!lm.stage_blocks[static_cast<std::size_t>(s)].empty()) tail += block.reduction_tail();
    tail += cost.sync();  // every stage ends with the tied embedding's halves added
    // The first stage starts the step with its first fetches and ends it with that tail: both
    // on the step's critical path. The other stages' tails run while the drain reaches it.
    if (s == 0) {
      lm.edges = tail;
      if (o.zero == 3) lm.edges += cost.gather(0) + cost.gather(1);
    }
    lm.fixed_seconds[static_cast<std::size_t>(s)] = secs;
    lm.fixed_device[static_cast<std::size_t>(s)] = fixed;
    sp.device_budget = k.cap.device - fixed;
    sp.host_budget = k.cap.shared ? 0.0 : k.cap.host;
    lm.lower_bound = std::max(lm.lower_bound, secs + stage_lower_bound(sp));
  }
  lm.lower_bound += fill_and_drain(lm) + lm.edges;
  for (std::size_t s = 0; s < lm.stages.size(); ++s) {
    double dev = lm.fixed_device[s], host = 0.0;
    for (const auto& cs : lm.stages[s].blocks) {
      double d = std::numeric_limits<double>::infinity(), h = std::numeric_limits<double>::infinity();
      for (const BlockChoice& x : cs) d = std::min(d, x.device_bytes), h = std::min(h, x.host_bytes);
      dev += d;
      host += h;
    }
    lm.least_device = std::max(lm.least_device, dev);
    lm.least_host = std::max(lm.least_host, host);
  }
  return lm;
}

// A layout's model without its blocks' choices (the bulk of its memory: tens of thousands of
// layouts are modelled at once), to be modelled again should it be solved.
void drop_choices(LayoutModel& lm) {
  for (StageProblem& sp : lm.stages) std::vector<std::vector<BlockChoice>>().swap(sp.blocks);
}

// The additive estimate of a layout's step once each stage's blocks are chosen: the
// slowest stage, plus the pipeline's fill and drain at one micro-batch per stage (shortened
// by the chunks per stage of interleaved and modular schedules) with its messages, plus
// what the first stage waits for before its first block and after its last.
double layout_objective(const LayoutModel& lm, const std::vector<StageSolution>& sol) {
  double slowest = 0.0;
  for (std::size_t s = 0; s < sol.size(); ++s) slowest = std::max(slowest, sol[s].seconds + lm.fixed_seconds[s]);
  return slowest + fill_and_drain(lm) + lm.edges;
}

StageSolution solve(const StageProblem& p, Solver s) {
  switch (s) {
    case Solver::dp: return solve_dp(p);
    case Solver::greedy: return solve_greedy(p);
    case Solver::brute: return solve_brute(p);
  }
  return {};
}

std::string list_value(const std::vector<std::string>& v) {
  const bool uniform = std::all_of(v.begin(), v.end(), [&](const std::string& x) { return x == v.front(); });
  if (uniform) return "\"" + v.front() + "\"";
  std::string out = "[";
  for (std::size_t i = 0; i < v.size(); ++i) out += (i ? "," : "") + std::string("\"") + v[i] + "\"";
  return out + "]";
}

// The deck overrides that give a plan's values to its free keys.
std::vector<std::string> overrides(const Plan& plan, const Freedom& f) {
  const ParallelLayout& o = plan.layout;
  std::vector<std::string> sets;
  auto add = [&](const char* key, const std::string& value) {
    if (f.has(key)) sets.push_back(std::string(key) + "=" + value);
  };
  add("parallel.dp", std::to_string(o.dp));
  add("parallel.cp", std::to_string(o.cp));
  add("parallel.tp", std::to_string(o.tp));
  add("parallel.pp", std::to_string(o.pp));
  add("parallel.zero", std::to_string(o.zero));
  add("parallel.schedule", std::string("\"") + schedule_kind_name(o.schedule) + "\"");
  add("parallel.virtual_stages", std::to_string(o.virtual_stages));
  add("parallel.layered", o.layered ? "true" : "false");
  add("parallel.sequence_parallel", o.sequence_parallel ? "true" : "false");
  add("data.micro_batch_size", std::to_string(o.micro_batch_size));
  add("data.batch_size", std::to_string(static_cast<std::int64_t>(o.dp) * o.micro_batch_size * o.micro_batches));
  std::vector<std::string> acts, params, opt;
  for (const LayerPolicy& b : plan.blocks) {
    acts.push_back(activation_policy_name(b.activations));
    params.push_back(mem_tier_name(b.params));
    opt.push_back(optimizer_placement_name(b.optimizer));
  }
  add("memory.activations", list_value(acts));
  add("memory.params", list_value(params));
  add("memory.optimizer", list_value(opt));
  return sets;
}

}  // namespace

std::string no_layout_message(const Deck& deck, const MachineSpec& machine, const PlannerOptions& options,
                              const PlanResult& r) {
  const ModelConfig& m = deck.model;
  const std::set<std::string> free(options.free_keys.begin(), options.free_keys.end());
  std::string fixed;
  for (const auto& [key, value] : {std::pair<const char*, std::int64_t>{"parallel.dp", deck.parallel.dp},
                                   {"parallel.tp", deck.parallel.tp},
                                   {"parallel.pp", deck.parallel.pp},
                                   {"data.micro_batch_size", deck.data.micro_batch_size}}) {
    if (free.count(key) == 0) fixed += strprintf("%s%s = %lld", fixed.empty() ? "" : ", ", key, static_cast<long long>(value));
  }
  std::string counts;
  for (const int n : r.ranks_with_layouts) counts += (counts.empty() ? "" : ", ") + std::to_string(n);
  const std::string batch = options.batch_cap > 0 ? strprintf("at most %lld", static_cast<long long>(options.batch_cap))
                                                  : strprintf("%lld", static_cast<long long>(deck.data.batch_size));
  return strprintf("no layout of %d rank(s) splits this model and batch: dp x tp x pp must be %d, with tp dividing "
                   "the %lld heads, the MLP width and the vocabulary of %lld, a divisor or a multiple of the key/value "
                   "heads, and at most the %d device(s) of a node, pp at most the "
                   "%lld layers, and dp x micro-batch dividing the batch of %s sequences%s; %s",
                   options.ranks, options.ranks, static_cast<long long>(m.heads), static_cast<long long>(m.vocab_size),
                   machine.devices_per_node, static_cast<long long>(m.layers), batch.c_str(),
                   fixed.empty() ? "" : ("; the deck fixes " + fixed).c_str(),
                   counts.empty() ? "no rank count near it has one either: check parallel.* and data.*"
                                  : ("rank counts that have layouts: " + counts).c_str());
}

PlanResult plan_search(const Deck& deck, const MachineSpec& machine, const PlannerOptions& options) {
  const auto t0 = Clock::now();
  Freedom f;
  f.keys.insert(options.free_keys.begin(), options.free_keys.end());
  if (options.batch_cap > 0) f.keys.insert("data.batch_size");  // each layout's own batch
  Costing k{deck, machine, options, f, capacity(deck, machine), {}, {}};
  for (std::int64_t b = 0; b < deck.model.layers; ++b) k.choices.push_back(choices_of(deck, f, b));
  PlanResult r;
  r.capacity_device = k.cap.device;
  r.capacity_host = k.cap.host;
  const std::vector<ParallelLayout> all = layouts(deck, options.ranks, f, machine, options);
  r.layouts_considered = static_cast<std::int64_t>(all.size());
  if (all.empty()) {
    // Nearest first, below and above in turn; enumerating a rank count's layouts is cheap.
    const int limit = std::max(64, 4 * options.ranks);
    for (int d = 1; r.ranks_with_layouts.size() < 8 && (options.ranks - d >= 1 || options.ranks + d <= limit); ++d) {
      for (const int n : {options.ranks - d, options.ranks + d}) {
        if (n >= 1 && n <= limit && r.ranks_with_layouts.size() < 8 && !layouts(deck, n, f, machine, options).empty()) {
          r.ranks_with_layouts.push_back(n);
        }
      }
    }
    std::sort(r.ranks_with_layouts.begin(), r.ranks_with_layouts.end());
    r.solve_s = std::chrono::duration<double>(Clock::now() - t0).count();
    return r;
  }

  // Model every layout (cheap), then solve them in the order of their compute lower bound,
  // stopping once a bound is slower than the K-th best estimate found.
  std::vector<LayoutModel> models;
  // Layered layouts twice where blocks may offload their checkpoints: with the frames
  // that costs the stage and without.
  bool any_offloaded = false, all_others = true;
  for (const auto& cs : k.choices) {
    bool other = false;
    for (const LayerPolicy& lp : cs) {
      const bool offloaded = lp.activations == ActivationPolicy::offload_checkpoint;
      any_offloaded = any_offloaded || offloaded;
      other = other || !offloaded;
    }
    all_others = all_others && other;
  }
  std::vector<std::pair<std::size_t, bool>> variants;  // (layout, checkpoints offloaded)
  for (std::size_t i = 0; i < all.size(); ++i) {
    if (all_others) variants.emplace_back(i, false);
    if (all[i].layered && any_offloaded) variants.emplace_back(i, true);
    k.add_layout(all[i].tp);
  }
  models.resize(variants.size());
  for_each_index(variants.size(), options.threads, [&](std::size_t v) {
    models[v] = model_layout(k, all[variants[v].first], variants[v].second);
    drop_choices(models[v]);
  });
  r.model_s = std::chrono::duration<double>(Clock::now() - t0).count();
  std::vector<std::size_t> order(models.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return models[a].per_sequence(models[a].lower_bound) < models[b].per_sequence(models[b].lower_bound);
  });

  struct Solved {
    std::size_t model;
    std::vector<StageSolution> stages;
    double objective;
  };
  std::vector<Solved> solved;
  const std::size_t keep = static_cast<std::size_t>(std::max(options.top, 1)) + 4;
  double min_dev = std::numeric_limits<double>::infinity(), min_host = std::numeric_limits<double>::infinity();
  // The layouts in that order, as one thread would take them; each batch's stage problems
  // are solved side by side beforehand for the layouts of the batch that the bound does not
  // prune yet (the bound only tightens, so the sequential walk then finds every solution it
  // needs among them, and plans, counts and bounds come out the same for any thread count).
  auto bound_prunes = [&](const LayoutModel& lm) {
    return solved.size() >= keep && lm.per_sequence(lm.lower_bound) > solved[keep - 1].objective;
  };
  // Cannot fit even with every saving on: how far off, for the advice.
  auto least_bytes = [](const LayoutModel& lm) { return std::make_pair(lm.least_device, lm.least_host); };
  // Batches of a few layouts per thread: the stage problems differ in size, and what a
  // batch solves that the tightened bound then prunes is wasted (at most one batch).
  const std::size_t batch = 4 * static_cast<std::size_t>(options.threads > 0 ? options.threads : usable_cores());
  std::vector<std::vector<StageSolution>> solutions(models.size());
  for (std::size_t first = 0; first < order.size(); first += batch) {
    const std::size_t last = std::min(order.size(), first + batch);
    std::vector<std::pair<std::size_t, std::size_t>> tasks;  // (model, stage)
    std::vector<std::size_t> to_solve;
    for (std::size_t j = first; j < last; ++j) {
      const LayoutModel& lm = models[order[j]];
      if (bound_prunes(lm) || least_bytes(lm).first > k.cap.device) continue;
      to_solve.push_back(order[j]);
      solutions[order[j]].resize(lm.stages.size());
      for (std::size_t st = 0; st < lm.stages.size(); ++st) tasks.emplace_back(order[j], st);
    }
    for_each_index(to_solve.size(), options.threads, [&](std::size_t n) {  // their choices again
      const std::size_t v = to_solve[n];
      models[v] = model_layout(k, all[variants[v].first], variants[v].second);
    });
    for_each_index(tasks.size(), options.threads, [&](std::size_t t) {
      const auto [m, st] = tasks[t];
      solutions[m][st] = solve(models[m].stages[st], options.solver);
    });
    for (std::size_t j = first; j < last; ++j) {
      const std::size_t i = order[j];
      const LayoutModel& lm = models[i];
      if (bound_prunes(lm)) {
        ++r.layouts_pruned;
        continue;
      }
      const auto [least_dev, least_host] = least_bytes(lm);
      min_dev = std::min(min_dev, least_dev);
      min_host = std::min(min_host, least_host);
      if (least_dev > k.cap.device) {
        ++r.layouts_pruned;
        continue;
      }
      Solved sv{i, std::move(solutions[i]), 0.0};
      bool ok = true;
      for (const StageSolution& st : sv.stages) ok = ok && st.feasible;
      ++r.layouts_solved;
      if (!ok) continue;
      if (lm.checkpoints) {  // offloading none, it is the other variant's plan with frames it does not use
        bool any = false;
        for (std::size_t s = 0; s < lm.stages.size(); ++s)
          for (std::size_t c = 0; c < sv.stages[s].choice.size(); ++c)
            any = any || lm.stages[s].blocks[c][static_cast<std::size_t>(sv.stages[s].choice[c])].policy.activations ==
                             ActivationPolicy::offload_checkpoint;
        if (!any) continue;
      }
      sv.objective = lm.per_sequence(layout_objective(lm, sv.stages));
      solved.push_back(std::move(sv));
      std::sort(solved.begin(), solved.end(),
                [](const Solved& a, const Solved& b) { return a.objective < b.objective; });
      // The K best, and every layout tied with the K-th: the additive model cannot tell them
      // apart, the exact simulation can.
      std::size_t kept = std::min(solved.size(), keep);
      while (kept < solved.size() && solved[kept].objective == solved[keep - 1].objective) ++kept;
      solved.resize(kept);
    }
  }

  r.inner_s = std::chrono::duration<double>(Clock::now() - t0).count() - r.model_s;
  // The best estimates, simulated and their memory estimated exactly.
  RunExtras extras = RunExtras::of(deck.checkpoint, deck.output);
  extras.machine_host = machine.device_is_host;  // that machine's kernels, as the cost model's
  // Fastest first; among equally fast plans the one that needs less memory (what a
  // person would pick: no layered accumulation where it buys nothing).
  const auto faster = [](const PlanCandidate& a, const PlanCandidate& b) {
    const double ta = a.step_s / a.plan.layout.micro_batches / a.plan.layout.micro_batch_size / a.plan.layout.dp;
    const double tb = b.step_s / b.plan.layout.micro_batches / b.plan.layout.micro_batch_size / b.plan.layout.dp;
    if (ta != tb) return ta < tb;
    return a.device_bytes + a.host_bytes < b.device_bytes + b.host_bytes;
  };
  const std::size_t top = static_cast<std::size_t>(std::max(options.top, 1));
  // Side by side, each candidate into its own slot (none: it does not fit after all). The
  // instruction lists of the fastest so far stay for the race check (at most `top`).
  std::vector<std::optional<PlanCandidate>> simulated(solved.size());
  std::vector<std::shared_ptr<const Schedule>> schedules(solved.size());
  std::mutex schedules_mutex;
  for_each_index(solved.size(), options.threads, [&](std::size_t n) {
    const Solved& sv = solved[n];
    const LayoutModel& lm = models[sv.model];
    PlanCandidate c;
    Plan& p = c.plan;
    p.layout = lm.layout;
    p.blocks.assign(static_cast<std::size_t>(deck.model.layers), LayerPolicy{});
    for (std::size_t s = 0; s < lm.stages.size(); ++s) {
      // Blocks of one chunk are interchangeable (same choices, same costs): their choices
      // sorted, so that equal policies sit in ranges a reader takes in at a glance.
      std::vector<int> choice = sv.stages[s].choice;
      for (std::size_t j = 0; j < choice.size();) {
        std::size_t e = j;
        while (e < choice.size() && lm.stage_chunks[s][e] == lm.stage_chunks[s][j]) ++e;
        std::sort(choice.begin() + static_cast<std::ptrdiff_t>(j), choice.begin() + static_cast<std::ptrdiff_t>(e));
        j = e;
      }
      for (std::size_t j = 0; j < lm.stage_blocks[s].size(); ++j) {
        const auto& c = lm.stages[s].blocks[j][static_cast<std::size_t>(choice[j])];
        p.blocks[static_cast<std::size_t>(lm.stage_blocks[s][j])] = c.policy;
      }
    }
    p.precision = deck.train.precision;
    p.tp_sums = tp_sum_precision(deck);
    p.subgroup_size = deck.optimizer.subgroup_size;
    p.budget = {deck.memory.device_budget, deck.memory.host_budget};
    c.solver_objective = sv.objective * lm.sequences;
    const auto built = std::make_shared<const Schedule>(Schedule::build(step_spec(p, deck.model)));
    const Schedule& schedule = *built;
    c.memory = estimate_memory(deck.model, p, extras, schedule);
    c.device_bytes = c.memory.total(tier_label(MemTier::device));
    c.host_bytes = c.memory.total(tier_label(MemTier::host));
    const double need_dev = k.cap.shared ? static_cast<double>(c.device_bytes + c.host_bytes) : static_cast<double>(c.device_bytes);
    if (need_dev > k.cap.device || (!k.cap.shared && static_cast<double>(c.host_bytes) > k.cap.host)) return;
    CostModel cost(deck.model, p, machine, options.measured);
    const Timeline t = simulate(schedule, cost.pricer(), cost.serial(), cost.compute_queued());
    c.traffic = cost.traffic(schedule.program(0), {});
    double update = 0.0;
    const ParamLayout layout = ParamLayout::of(deck.model, p.layout.tp, 0);
    for (int s = 0; s < schedule.stages(); ++s) {
      const RankOptimizers ro =
          plan_rank_optimizers(p, layout, schedule.layers_of_stage(s), 0, dos_model(p), -1);
      cost.set_rank_optimizers(ro);
      update = std::max(update, simulate_update(update_program(ro.updates(), p.layout.zero), cost.pricer(), {},
                                                cost.serial(), cost.compute_queued())
                                    .seconds);
    }
    c.update_s = update;
    c.step_s = t.makespan + update;
    // The pipeline's bubble: the stages' idle fraction when only compute takes time.
    const Pricer compute_only = [&cost](const Instruction& i, int) {
      return i.op == Op::forward || i.op == Op::backward || i.op == Op::recompute ? cost.price(i) : 0.0;
    };
    c.bubble = simulate(schedule, compute_only, false).bubble_fraction();
    c.idle = t.bubble_fraction();
    c.sets = overrides(p, f);
    simulated[n] = std::move(c);
    if (!options.check_races) return;
    const std::lock_guard<std::mutex> lock(schedules_mutex);
    schedules[n] = built;
    std::vector<std::size_t> held;
    for (std::size_t i = 0; i < schedules.size(); ++i)
      if (schedules[i]) held.push_back(i);
    if (held.size() <= top) return;
    std::sort(held.begin(), held.end(), [&](std::size_t a, std::size_t b) { return faster(*simulated[a], *simulated[b]); });
    for (std::size_t k = top; k < held.size(); ++k) schedules[held[k]].reset();
  });
  std::vector<std::size_t> fastest;
  for (std::size_t i = 0; i < simulated.size(); ++i)
    if (simulated[i]) fastest.push_back(i);
  std::sort(fastest.begin(), fastest.end(), [&](std::size_t a, std::size_t b) { return faster(*simulated[a], *simulated[b]); });
  if (fastest.size() > top) fastest.resize(top);
  for (const std::size_t i : fastest) r.best.push_back(std::move(*simulated[i]));
  // Every plan returned is proved race-free (a hazard is a bug of the builders: it throws).
  if (options.check_races) {
    for_each_index(r.best.size(), options.threads, [&](std::size_t n) {
      PlanCandidate& c = r.best[n];
      std::shared_ptr<const Schedule> schedule = std::move(schedules[fastest[n]]);
      if (!schedule) schedule = std::make_shared<const Schedule>(Schedule::build(step_spec(c.plan, deck.model)));
      c.checked_instructions = check_races(c.plan, deck.model, *schedule).instructions;
    });
  }
  r.feasible = !r.best.empty();
  if (!r.feasible) {
    r.min_device_bytes = std::isfinite(min_dev) ? static_cast<std::int64_t>(min_dev) : 0;
    r.min_host_bytes = std::isfinite(min_host) ? static_cast<std::int64_t>(min_host) : 0;
    std::string advice;
    if (!f.has("parallel.pp") || !f.has("parallel.tp")) advice += "leave parallel.tp and parallel.pp to the planner; ";
    if (!f.has("parallel.zero")) advice += "leave parallel.zero to the planner (ZeRO-3 shards parameters); ";
    if (deck.train.precision == Precision::fp32) advice += "train.precision = \"bf16\" halves parameters and activations; ";
    if (deck.model.loss_chunk == 0) {
      advice += "model.loss_chunk (e.g. 4096) keeps the head's logits for that many rows, not a micro-batch's; ";
    }
    advice += "more ranks (--ranks) split the model further; a smaller data.micro_batch_size cuts activations";
    r.advice = advice;
  }
  r.solve_s = std::chrono::duration<double>(Clock::now() - t0).count();
  return r;
}

}  // namespace lamina
