// Pipeline schedules on the cost model: bubble fractions against the closed forms of the
// papers (Lamy-Poirier 2021; Narayanan et al. 2021), and the structure every schedule needs.
#include "lamina/parallel/simulator.hpp"

#include <gtest/gtest.h>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

ScheduleOptions options(ScheduleKind kind, int pp, int M, int v = 1, bool layered = false, int zero = 0) {
  ScheduleOptions o;
  o.kind = kind;
  o.stages = pp;
  o.micro_batches = M;
  o.virtual_stages = v;
  o.layered = layered;
  o.zero = zero;
  return o;
}

double bubble(std::int64_t layers, const ScheduleOptions& o) {
  return simulate(Schedule::build(layers, o), CostModel{}).bubble_fraction();
}

TEST(Simulator, GPipeAnd1F1BBubbleIsPMinus1OverMPlusPMinus1) {
  for (int pp : {2, 3, 4}) {
    for (int M : {1, 2, 4, 8}) {
      const double want = (pp - 1.0) / (M + pp - 1.0);
      EXPECT_NEAR(bubble(pp * 2, options(ScheduleKind::gpipe, pp, M)), want, 1e-12) << pp << " " << M;
      EXPECT_NEAR(bubble(pp * 2, options(ScheduleKind::one_f_one_b, pp, M)), want, 1e-12) << pp << " " << M;
    }
  }
}

TEST(Simulator, InterleavedBubbleShrinksByTheVirtualStages) {
  for (int pp : {2, 4}) {
    for (int v : {2, 3}) {
      for (int M : {pp, 2 * pp, 4 * pp}) {
        const double want = (pp - 1.0) / (v * M + pp - 1.0);
        EXPECT_NEAR(bubble(pp * v, options(ScheduleKind::interleaved, pp, M, v)), want, 1e-12)
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
        EXPECT_NEAR(bubble(pp * m, options(ScheduleKind::modular, pp, M, 1, true)), want, 1e-12)
            << "pp " << pp << " m " << m << " M " << M;
      }
    }
  }
}

TEST(Simulator, ModularWithFewerMicroBatchesThanStagesIdlesMore) {
  // Each loop around the ring waits (pp - M) extra slots when M < pp.
  const int pp = 4, m = 2, M = 2;
  EXPECT_GT(bubble(pp * m, options(ScheduleKind::modular, pp, M, 1, true)), (pp - 1.0) / (m * M + pp - 1.0) + 0.05);
}

TEST(Schedule, InFlightMicroBatchesPerSchedule) {
  const Schedule f1b = Schedule::build(4, options(ScheduleKind::one_f_one_b, 4, 8));
  for (int c = 0; c < 4; ++c) EXPECT_EQ(f1b.max_in_flight(c), 4 - c);  // pp - stage
  const Schedule gp = Schedule::build(4, options(ScheduleKind::gpipe, 4, 8));
  for (int c = 0; c < 4; ++c) EXPECT_EQ(gp.max_in_flight(c), 8);
  const Schedule single = Schedule::build(3, options(ScheduleKind::one_f_one_b, 1, 5));
  EXPECT_EQ(single.max_in_flight(0), 1);  // plain gradient accumulation
  const Schedule layered = Schedule::build(3, options(ScheduleKind::gpipe, 1, 5, 1, true));
  EXPECT_EQ(layered.partition().num_chunks(), 3);
  EXPECT_EQ(layered.max_in_flight(1), 5);  // every micro-batch's layer input is kept
}

TEST(Schedule, ZeroThreeLayeredGathersOncePerPassAndReducesOncePerStep) {
  auto count = [](const Schedule& s, Op op) {
    int n = 0;
    for (const auto& i : s.program(0)) n += i.op == op;
    return n;
  };
  const int L = 3, M = 4;
  const Schedule standard = Schedule::build(L, options(ScheduleKind::gpipe, 1, M, 1, true, 3));
  EXPECT_EQ(count(standard, Op::gather_params), 2 * L);  // each layer: forward pass, backward pass
  EXPECT_EQ(count(standard, Op::reduce_grads), L);
  const Schedule depth = Schedule::build(L, options(ScheduleKind::one_f_one_b, 1, M, 1, false, 3));
  EXPECT_EQ(count(depth, Op::gather_params), 0);  // the executor gathers layer by layer, every micro-batch
  EXPECT_EQ(count(depth, Op::reduce_grads), M);
  const Schedule dp = Schedule::build(L, options(ScheduleKind::one_f_one_b, 1, M, 1, false, 0));
  EXPECT_EQ(count(dp, Op::gather_params), 0);
  EXPECT_EQ(count(dp, Op::reduce_grads), 1);
  EXPECT_EQ(dp.program(0).back().op, Op::optimizer_step);
}

TEST(Schedule, UnsupportedCombinationsAreInputErrors) {
  EXPECT_THROW(Schedule::build(4, options(ScheduleKind::one_f_one_b, 2, 4, 1, true)), InputError);
  EXPECT_THROW(Schedule::build(4, options(ScheduleKind::interleaved, 2, 3, 2)), InputError);  // M % pp
  EXPECT_THROW(Schedule::build(5, options(ScheduleKind::modular, 2, 4)), InputError);         // L % pp
  EXPECT_THROW(Schedule::build(3, options(ScheduleKind::gpipe, 2, 4)), InputError);           // L % chunks
}

}  // namespace
}  // namespace lamina::test
