#include "lamina/parallel/schedule.hpp"

#include <algorithm>
#include <map>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/parallel/simulator.hpp"

namespace lamina {

ScheduleOptions schedule_options(const Deck& deck) {
  const ParallelConfig& p = deck.parallel;
  ScheduleOptions o;
  o.kind = p.schedule == "gpipe"         ? ScheduleKind::gpipe
           : p.schedule == "interleaved" ? ScheduleKind::interleaved
           : p.schedule == "modular"     ? ScheduleKind::modular
                                         : ScheduleKind::one_f_one_b;
  o.stages = static_cast<int>(p.pp);
  o.micro_batches = static_cast<int>(deck.data.batch_size / (deck.data.micro_batch_size * p.dp));
  o.virtual_stages = static_cast<int>(p.virtual_stages);
  o.layered = p.layered;
  o.zero = static_cast<int>(p.zero);
  return o;
}

const char* op_name(Op op) {
  switch (op) {
    case Op::forward: return "F";
    case Op::backward: return "B";
    case Op::send_activation: return "send_act";
    case Op::recv_activation: return "recv_act";
    case Op::send_gradient: return "send_grad";
    case Op::recv_gradient: return "recv_grad";
    case Op::gather_params: return "gather";
    case Op::release_params: return "release";
    case Op::reduce_grads: return "reduce";
    case Op::optimizer_step: return "step";
  }
  return "?";
}

namespace {

using Program = std::vector<Instruction>;

Instruction F(int c, int m) { return {Op::forward, c, m, -1}; }
Instruction B(int c, int m) { return {Op::backward, c, m, -1}; }

// Forward and backward orders of one stage.
Program depth_first(const std::vector<int>& local, int M) {
  Program p;
  for (int m = 0; m < M; ++m)
    for (int c : local) p.push_back(F(c, m));
  for (int m = 0; m < M; ++m)
    for (auto it = local.rbegin(); it != local.rend(); ++it) p.push_back(B(*it, m));
  return p;
}

Program breadth_first(const std::vector<int>& local, int M) {
  Program p;
  for (int c : local)
    for (int m = 0; m < M; ++m) p.push_back(F(c, m));
  for (auto it = local.rbegin(); it != local.rend(); ++it)
    for (int m = 0; m < M; ++m) p.push_back(B(*it, m));
  return p;
}

// PipeDream-flush (Narayanan et al. 2021): pp - s - 1 warm-up forwards, then one forward
// and one backward alternately, then the remaining backwards.
Program one_f_one_b(int chunk, int stage, int stages, int M) {
  Program p;
  const int warmup = std::min(stages - stage - 1, M);
  for (int m = 0; m < warmup; ++m) p.push_back(F(chunk, m));
  for (int i = 0; i < M - warmup; ++i) {
    p.push_back(F(chunk, warmup + i));
    p.push_back(B(chunk, i));
  }
  for (int m = M - warmup; m < M; ++m) p.push_back(B(chunk, m));
  return p;
}

// Megatron's interleaved 1F1B: micro-step k of a stage runs virtual chunk (k / pp) mod v
// (reversed in backward) on micro-batch (k / (pp v)) pp + k mod pp.
Program interleaved(int stage, int stages, int v, int M) {
  const int total = M * v;
  auto chunk_of = [&](int k, bool forward) {
    const int vi = (k / stages) % v;
    return (forward ? vi : v - 1 - vi) * stages + stage;
  };
  auto mb_of = [&](int k) { return (k / (stages * v)) * stages + k % stages; };
  int warmup = M == stages ? total : std::min(total, (stages - stage - 1) * 2 + (v - 1) * stages);
  Program p;
  for (int k = 0; k < warmup; ++k) p.push_back(F(chunk_of(k, true), mb_of(k)));
  for (int k = 0; k < total - warmup; ++k) {
    p.push_back(F(chunk_of(k + warmup, true), mb_of(k + warmup)));
    p.push_back(B(chunk_of(k, false), mb_of(k)));
  }
  for (int k = total - warmup; k < total; ++k) p.push_back(B(chunk_of(k, false), mb_of(k)));
  return p;
}

// Point-to-point messages where neighbouring chunks sit on different stages.
Program with_messages(const Program& compute, const Partition& part) {
  Program p;
  const int last = part.num_chunks() - 1;
  for (const Instruction& i : compute) {
    const Chunk& c = part.chunk(i.chunk);
    if (i.op == Op::forward) {
      if (i.chunk > 0 && part.chunk(i.chunk - 1).stage != c.stage)
        p.push_back({Op::recv_activation, i.chunk, i.micro_batch, part.chunk(i.chunk - 1).stage});
      p.push_back(i);
      if (i.chunk < last && part.chunk(i.chunk + 1).stage != c.stage)
        p.push_back({Op::send_activation, i.chunk, i.micro_batch, part.chunk(i.chunk + 1).stage});
    } else {
      if (i.chunk < last && part.chunk(i.chunk + 1).stage != c.stage)
        p.push_back({Op::recv_gradient, i.chunk, i.micro_batch, part.chunk(i.chunk + 1).stage});
      p.push_back(i);
      if (i.chunk > 0 && part.chunk(i.chunk - 1).stage != c.stage)
        p.push_back({Op::send_gradient, i.chunk, i.micro_batch, part.chunk(i.chunk - 1).stage});
    }
  }
  return p;
}

// ZeRO-3 gathers, data-parallel reductions after the backward that completes a chunk's
// gradients, and the optimizer step. Depth-first, the executor gathers each layer's
// parameters just before it runs and drops them after, every micro-batch; breadth-first,
// gather_params holds a chunk's parameters across its run of micro-batches, so they are
// gathered once per pass. Gradients are reduced once per step, or every micro-batch where
// the ZeRO stage keeps no full copy of them (2 and 3) and the schedule is depth-first.
Program with_zero(const Program& in, int zero, bool layered, int M) {
  auto is_compute = [](const Instruction& i) { return i.op == Op::forward || i.op == Op::backward; };
  std::vector<const Instruction*> compute;
  for (const Instruction& i : in)
    if (is_compute(i)) compute.push_back(&i);
  // A breadth-first run: consecutive compute ops of the same pass over the same chunk.
  auto same_run = [&](std::size_t a, std::size_t b) {
    return layered && compute[a]->chunk == compute[b]->chunk && compute[a]->op == compute[b]->op;
  };
  Program p;
  std::map<int, int> backwards;  // per chunk, so far
  std::size_t k = 0;             // index of the next compute op
  for (const Instruction& ins : in) {
    if (!is_compute(ins)) {
      p.push_back(ins);
      continue;
    }
    const bool hold = zero == 3 && layered;
    if (hold && !(k > 0 && same_run(k - 1, k))) p.push_back({Op::gather_params, ins.chunk, ins.micro_batch, -1});
    p.push_back(ins);
    if (hold && !(k + 1 < compute.size() && same_run(k, k + 1)))
      p.push_back({Op::release_params, ins.chunk, ins.micro_batch, -1});
    if (ins.op == Op::backward) {
      const int n = ++backwards[ins.chunk];
      if ((zero >= 2 && !layered) || n == M) p.push_back({Op::reduce_grads, ins.chunk, ins.micro_batch, -1});
    }
    ++k;
  }
  p.push_back({Op::optimizer_step, -1, -1, -1});
  return p;
}

}  // namespace

Schedule Schedule::build(std::int64_t layers, const ScheduleOptions& o) {
  const int pp = o.stages, M = o.micro_batches;
  Schedule s;
  s.options_ = o;
  std::vector<Program> compute(static_cast<std::size_t>(pp));
  switch (o.kind) {
    case ScheduleKind::gpipe:
    case ScheduleKind::one_f_one_b: {
      const bool gpipe = o.kind == ScheduleKind::gpipe || o.layered;
      if (o.layered && o.kind == ScheduleKind::one_f_one_b && pp > 1) {
        throw InputError("parallel.layered = true runs each layer over all micro-batches, which 1F1B's alternation "
                         "does not allow: use parallel.schedule = \"gpipe\" or \"modular\"");
      }
      // Layered: one block per chunk, consecutive blocks on each stage.
      s.partition_ = Partition::make(layers, pp, o.layered ? static_cast<int>(layers) : pp, false);
      s.name_ = o.layered ? "gpipe, layer by layer" : gpipe ? "gpipe" : "1f1b";
      for (int st = 0; st < pp; ++st) {
        const auto local = s.partition_.chunks_of(st);
        compute[st] = o.layered ? breadth_first(local, M)
                      : gpipe   ? depth_first(local, M)
                                : one_f_one_b(local.front(), st, pp, M);
      }
      break;
    }
    case ScheduleKind::interleaved:
    case ScheduleKind::modular: {
      const bool modular = o.kind == ScheduleKind::modular;
      const int v = modular ? static_cast<int>(layers / pp) : o.virtual_stages;
      if (modular && layers % pp != 0) {
        throw InputError(strprintf("the modular pipeline places layer l on stage l mod pp: model.layers = %lld must "
                                   "be a multiple of parallel.pp = %d",
                                   static_cast<long long>(layers), pp));
      }
      s.partition_ = Partition::make(layers, pp, v * pp, true);
      if (o.layered) {
        if (!modular) {
          throw InputError("parallel.layered = true with the interleaved schedule: use parallel.schedule = "
                           "\"modular\" (one layer per chunk, breadth-first)");
        }
        s.name_ = "modular, layer by layer";
        for (int st = 0; st < pp; ++st) compute[st] = breadth_first(s.partition_.chunks_of(st), M);
      } else {
        if (M % pp != 0) {
          throw InputError(strprintf("the interleaved schedule needs the micro-batches per step (%d) to be a multiple "
                                     "of parallel.pp = %d; change data.micro_batch_size or data.batch_size",
                                     M, pp));
        }
        s.name_ = modular ? "modular (interleaved 1F1B, one layer per chunk)"
                          : strprintf("interleaved 1F1B, %d chunks per stage", v);
        for (int st = 0; st < pp; ++st) compute[st] = interleaved(st, pp, v, M);
      }
      break;
    }
  }
  for (int st = 0; st < pp; ++st) {
    s.programs_.push_back(with_zero(with_messages(compute[st], s.partition_), o.zero, o.layered, M));
  }
  // Every receive has its send and no stage waits forever: the simulator would throw.
  simulate(s, CostModel{});
  return s;
}

int Schedule::max_in_flight(int chunk) const {
  const int stage = partition_.chunk(chunk).stage;
  int now = 0, peak = 0;
  for (const Instruction& i : program(stage)) {
    if (i.chunk != chunk) continue;
    if (i.op == Op::forward) peak = std::max(peak, ++now);
    if (i.op == Op::backward) --now;
  }
  return peak;
}

std::string Schedule::describe(int stage) const {
  std::string out;
  for (const Instruction& i : program(stage)) {
    if (!out.empty()) out += ' ';
    out += op_name(i.op);
    if (i.chunk >= 0) out += strprintf("(%d,%d)", i.chunk, i.micro_batch);
  }
  return out;
}

}  // namespace lamina
