// Pipeline schedules on the simulator with the virtual clock's prices: bubble fractions
// against the closed forms of the papers (Narayanan et al. 2021; Lamy-Poirier 2021), and
// hand-computed timelines where copies and collectives take time too.
#include "lamina/plan/simulator.hpp"

#include <gtest/gtest.h>

#include <algorithm>

#include "schedule_spec.hpp"

namespace lamina::test {
namespace {

double bubble(const StepSpec& s) {
  const Schedule schedule = Schedule::build(s);
  return simulate(schedule, clock_pricer(ClockPrices{}, schedule.final_layer())).bubble_fraction();
}

TEST(Simulator, GPipeAnd1F1BBubbleIsPMinus1OverMPlusPMinus1) {
  for (int pp : {2, 3, 4}) {
    for (int M : {1, 2, 4, 8}) {
      const double want = (pp - 1.0) / (M + pp - 1.0);
      EXPECT_NEAR(bubble(spec(pp * 2, ScheduleKind::gpipe, pp, M)), want, 1e-12) << pp << " " << M;
      EXPECT_NEAR(bubble(spec(pp * 2, ScheduleKind::one_f_one_b, pp, M)), want, 1e-12) << pp << " " << M;
    }
  }
}

TEST(Simulator, InterleavedBubbleShrinksByTheVirtualStages) {
  for (int pp : {2, 4}) {
    for (int v : {2, 3}) {
      for (int M : {pp, 2 * pp, 4 * pp}) {
        const double want = (pp - 1.0) / (v * M + pp - 1.0);
        EXPECT_NEAR(bubble(spec(pp * v, ScheduleKind::interleaved, pp, M, v)), want, 1e-12)
            << "pp " << pp << " v " << v << " M " << M;
      }
    }
  }
}

TEST(Simulator, ModularLayeredBubbleIsPMinus1OverMTimesMbPlusPMinus1) {
  for (int pp : {2, 3, 4}) {
    for (int m : {1, 2, 4}) {  // layers per stage
      for (int M : {pp, pp + 1, 8}) {
        const double want = (pp - 1.0) / (m * M + pp - 1.0);
        EXPECT_NEAR(bubble(spec(pp * m, ScheduleKind::modular, pp, M, 1, true)), want, 1e-12)
            << "pp " << pp << " m " << m << " M " << M;
      }
    }
  }
}

TEST(Simulator, BubblesAreTheClosedFormsThePlannerAddsUp) {
  // Uniform stages, free messages: the simulated idle time of every schedule the planner
  // ranks, fewer micro-batches than stages included, is fill_and_drain_blocks.
  struct Case {
    ScheduleKind kind;
    int v;
    bool layered;
  };
  for (const Case c : {Case{ScheduleKind::gpipe, 1, false}, Case{ScheduleKind::one_f_one_b, 1, false},
                       Case{ScheduleKind::gpipe, 1, true}, Case{ScheduleKind::interleaved, 2, false},
                       Case{ScheduleKind::modular, 1, false},
                       Case{ScheduleKind::modular, 1, true}}) {
    for (int pp : {2, 3, 4}) {
      for (int m : {1, 2, 3}) {  // blocks per stage
        if (c.kind == ScheduleKind::interleaved && m % c.v != 0) continue;
        for (int M : {1, 2, pp, pp + 1, 2 * pp}) {
          // Interleaved schedules (modular ones without layered accumulation among them)
          // take whole rounds of pp micro-batches.
          const bool rounds = c.kind == ScheduleKind::interleaved || (c.kind == ScheduleKind::modular && !c.layered);
          if (rounds && M % pp != 0) continue;
          const StepSpec s = spec(pp * m, c.kind, pp, M, c.v, c.layered);
          const double idle = fill_and_drain_blocks(s.layout, m);
          EXPECT_NEAR(bubble(s), idle / (idle + m * M), 1e-12)
              << schedule_kind_name(c.kind) << (c.layered ? " layered" : "") << " pp " << pp << " blocks " << m
              << " M " << M;
        }
      }
    }
  }
}

// Prices by instruction kind, for hand-computed timelines: blocks' forward and backward,
// gathers, prefetches and reductions; the embedding and the head are free.
Pricer prices(int final_layer, double forward, double backward, double gather, double prefetch, double reduce) {
  return [=](const Instruction& i, int) {
    const bool block = i.layer > 0 && i.layer < final_layer;
    switch (i.op) {
      case Op::forward: return block ? forward : 0.0;
      case Op::backward: return block ? backward : 0.0;
      case Op::gather_params: return gather;
      case Op::prefetch_params: return prefetch;
      case Op::reduce_grads: return reduce;
      default: return 0.0;
    }
  };
}

TEST(Simulator, PrefetchedParametersOverlapTheComputeOfTheLayerBefore) {
  // One rank, 2 blocks, ZeRO-3 (forward 2, backward 3, moving a layer's parameters g).
  const Schedule s = Schedule::build(spec(2, ScheduleKind::one_f_one_b, 1, 1, 1, false, 3));
  const int f = s.final_layer();
  // g = 1. Forward: the embedding's prefetch [0,1] taken over by its gather; gather h.0
  // [1,2]; prefetch h.1 [2,3] beside F(h.0) [2,4]; F(h.1) [4,6]; the head gathers emb and
  // ln_f [6,8]. Backward: the head's prefetches [8,10]; gather h.1 [10,11]; prefetch h.0
  // [11,12] beside B(h.1) [11,14]; B(h.0) [14,17].
  const Timeline t = simulate(s, prices(f, 2.0, 3.0, 1.0, 1.0, 0.0));
  EXPECT_DOUBLE_EQ(t.makespan, 17.0);
  EXPECT_DOUBLE_EQ(t.busy[0], 10.0);
  // g = 3: a prefetch outlasts the forward beside it (3 > 2), not the backward (3 = 3):
  // forward 3 + 3 + 3 + 2 + 6, backward 6 + 3 + 3 + 3.
  EXPECT_DOUBLE_EQ(simulate(s, prices(f, 2.0, 3.0, 3.0, 3.0, 0.0)).makespan, 32.0);
}

TEST(Simulator, ZeroOneReductionsRunOneAtATimeBehindTheBackward) {
  // One rank, 3 blocks, ZeRO-1, one micro-batch (forward 1, backward 2, reduction r):
  // each layer's reduce-scatter starts after its backward, queued on the collective stream
  // behind the one before.
  const Schedule s = Schedule::build(spec(3, ScheduleKind::one_f_one_b, 1, 1, 1, false, 1));
  auto run = [&](double r) { return simulate(s, prices(s.final_layer(), 1.0, 2.0, 0.0, 0.0, r)).makespan; };
  EXPECT_DOUBLE_EQ(run(0.0), 9.0);  // forward 3, backward 6
  // r = 1 < backward: each hides behind the next backward; the last two (h.0 after B(h.0)
  // at 9, then the embedding's) end at 11.
  EXPECT_DOUBLE_EQ(run(1.0), 11.0);
  // r = 3 > backward: the five reductions (ln_f, h.2, h.1, h.0, embedding) run back to back
  // from the end of the forward: 3 + 5 x 3.
  EXPECT_DOUBLE_EQ(run(3.0), 18.0);
}

TEST(Simulator, ZeroOneReductionsDoNotHoldUpTheGradientForTheStageBefore) {
  // Two stages of 2 blocks, ZeRO-1, one micro-batch (forward 1, backward 2, reduction 5,
  // messages free). Stage 1 (h.2, h.3, the head and the tied embedding's copy): forward
  // [2,4]; the head's reduction [4,9] queued as its backward ends, then B(h.3) [4,6] and
  // B(h.2) [6,8] go on beside it, and the gradient leaves for stage 0 at 8; its reductions
  // h.3 [9,14], h.2 [14,19], embedding [19,24] follow one another on the collective
  // stream. Stage 0: B(h.1) [8,10], B(h.0) [10,12], reductions h.1 [10,15], h.0 [15,20],
  // embedding [20,25]. Had the host waited for each reduction before issuing the next, stage
  // 1 would have sent the gradient at 19 and stage 0 finished at 36.
  const Schedule s = Schedule::build(spec(4, ScheduleKind::one_f_one_b, 2, 1, 1, false, 1));
  const Timeline t = simulate(s, prices(s.final_layer(), 1.0, 2.0, 0.0, 0.0, 5.0));
  EXPECT_DOUBLE_EQ(t.finish[1], 24.0);
  EXPECT_DOUBLE_EQ(t.finish[0], 25.0);
  EXPECT_DOUBLE_EQ(t.makespan, 25.0);
}

TEST(Simulator, OneFOneBBringsAnOffloadedLastBlockBackDuringTheForwardBeforeItsBackward) {
  // Four stages of 2 blocks, 1F1B, 8 micro-batches; stage 0 offloads its last block (forward
  // 1, backward 2, each copy c). In the steady state a backward step starts with that block:
  // its activations come back while the forward step before it runs, into the staging
  // buffer the forward's own offloaded block leaves alone. Copies shorter than a block's
  // forward then add nothing to the step. Brought back at the backward step's start, behind
  // the copy out of the forward just before it, each steady-state step waited for both.
  StepSpec sp = spec(8, ScheduleKind::one_f_one_b, 4, 8);
  sp.blocks[1].activations = ActivationPolicy::offload;
  const Schedule s = Schedule::build(sp);
  auto run = [&](double c) {
    const Pricer price = [&](const Instruction& i, int) {
      const bool block = i.layer > 0 && i.layer < s.final_layer();
      switch (i.op) {
        case Op::forward: return block ? 1.0 : 0.0;
        case Op::backward: return block ? 2.0 : 0.0;
        case Op::offload_activations:
        case Op::prefetch_activations:
        case Op::reload_activations: return c;
        default: return 0.0;
      }
    };
    return simulate(s, price).makespan;
  };
  EXPECT_GT(run(0.0), 0.0);
  EXPECT_DOUBLE_EQ(run(0.9), run(0.0));
  const auto& p = s.program(0);
  EXPECT_EQ(std::count_if(p.begin(), p.end(), [](const Instruction& i) { return i.op == Op::reload_activations; }), 0);
}

TEST(Simulator, UpdateProgramRunsDeviceSubgroupsBesideTheHost) {
  LayerUpdate u;
  u.layer = 1;
  u.placement = OptimizerPlacement::dynamic;
  u.sites = {UpdateSite::host, UpdateSite::device, UpdateSite::host, UpdateSite::device};
  const auto program = update_program({u}, 0);
  const Pricer price = [](const Instruction& i, int) {
    if (i.op == Op::optimizer_update) return i.site == UpdateSite::host ? 2.0 : 3.0;
    return i.op == Op::publish_params ? 0.5 : 0.0;
  };
  // On a device, its subgroups queue (3 + 3) while the host runs its two (2 + 2); publish
  // waits for both.
  const UpdateTimeline t = simulate_update(program, price, {}, false, true);
  EXPECT_DOUBLE_EQ(t.host, 4.0);
  EXPECT_DOUBLE_EQ(t.device, 6.0);
  EXPECT_DOUBLE_EQ(t.seconds, 6.5);
  // Gradients still arriving delay the host's part.
  EXPECT_DOUBLE_EQ(simulate_update(program, price, {{1, 5.0}}, false, true).seconds, 5.0 + 4.0 + 0.5);
  // Where kernels run in the host's thread, nothing overlaps.
  EXPECT_DOUBLE_EQ(simulate_update(program, price).seconds, 3.0 + 3.0 + 2.0 + 2.0 + 0.5);
}

}  // namespace
}  // namespace lamina::test
