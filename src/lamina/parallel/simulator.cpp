#include "lamina/parallel/simulator.hpp"

#include <algorithm>
#include <map>
#include <stdexcept>
#include <tuple>

#include "lamina/core/format.hpp"

namespace lamina {

double compute_cost(const Chunk& c, Op op, const CostModel& cost) {
  const bool fwd = op == Op::forward;
  double t = static_cast<double>(c.blocks()) * (fwd ? cost.forward_block : cost.backward_block);
  if (c.embedding) t += cost.embedding;
  if (c.head) t += fwd ? cost.head : 2.0 * cost.head;
  if (!fwd) {
    const auto it = cost.recomputed.find(c.index);
    if (it != cost.recomputed.end()) t += it->second * cost.forward_block;
  }
  return t;
}

double Timeline::bubble_fraction() const {
  if (makespan <= 0.0 || busy.empty()) return 0.0;
  double idle = 0.0;
  for (const double b : busy) idle += (makespan - b) / makespan;
  return idle / static_cast<double>(busy.size());
}

Timeline simulate(const Schedule& s, const CostModel& cost) {
  const int stages = s.stages();
  const Partition& part = s.partition();
  // A message is known by (kind, receiving chunk, micro-batch); kind 0 activation, 1 gradient.
  std::map<std::tuple<int, int, int>, double> arrivals;
  std::vector<std::size_t> ip(static_cast<std::size_t>(stages), 0);
  Timeline t;
  t.busy.assign(static_cast<std::size_t>(stages), 0.0);
  t.finish.assign(static_cast<std::size_t>(stages), 0.0);
  std::size_t remaining = 0;
  for (int st = 0; st < stages; ++st) remaining += s.program(st).size();
  while (remaining > 0) {
    bool progress = false;
    for (int st = 0; st < stages; ++st) {
      const auto& prog = s.program(st);
      auto& i = ip[static_cast<std::size_t>(st)];
      double& clock = t.finish[static_cast<std::size_t>(st)];
      while (i < prog.size()) {
        const Instruction& ins = prog[i];
        if (ins.op == Op::recv_activation || ins.op == Op::recv_gradient) {
          const auto key = std::make_tuple(ins.op == Op::recv_activation ? 0 : 1, ins.chunk, ins.micro_batch);
          const auto it = arrivals.find(key);
          if (it == arrivals.end()) break;  // not sent yet: this stage waits
          clock = std::max(clock, it->second);
          arrivals.erase(it);
        } else if (ins.op == Op::send_activation) {
          arrivals[std::make_tuple(0, ins.chunk + 1, ins.micro_batch)] = clock + cost.p2p;
        } else if (ins.op == Op::send_gradient) {
          arrivals[std::make_tuple(1, ins.chunk - 1, ins.micro_batch)] = clock + cost.p2p;
        } else if (ins.op == Op::forward || ins.op == Op::backward) {
          const double c = compute_cost(part.chunk(ins.chunk), ins.op, cost);
          clock += c;
          t.busy[static_cast<std::size_t>(st)] += c;
        }
        ++i;
        --remaining;
        progress = true;
      }
    }
    if (!progress) {
      std::string where;
      for (int st = 0; st < stages; ++st) {
        const auto& prog = s.program(st);
        const auto i = ip[static_cast<std::size_t>(st)];
        if (i < prog.size()) {
          where += strprintf(" stage %d at %s(chunk %d, micro-batch %d);", st, op_name(prog[i].op), prog[i].chunk,
                             prog[i].micro_batch);
        }
      }
      throw std::logic_error("schedule '" + s.name() + "' deadlocks:" + where);
    }
  }
  if (!arrivals.empty()) throw std::logic_error("schedule '" + s.name() + "' sends messages nobody receives");
  t.makespan = *std::max_element(t.finish.begin(), t.finish.end());
  return t;
}

}  // namespace lamina
