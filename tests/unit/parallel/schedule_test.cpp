// The instruction lists the builders emit: how many activations each schedule keeps in
// flight, where ZeRO gathers and reductions go, the memory actions each policy adds around
// a layer, and the optimizer program's order.
#include "lamina/parallel/schedule.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "lamina/core/error.hpp"
#include "schedule_spec.hpp"

namespace lamina::test {
namespace {

int count(const std::vector<Instruction>& p, Op op, int layer = -2) {
  return static_cast<int>(std::count_if(p.begin(), p.end(), [&](const Instruction& i) {
    return i.op == op && (layer == -2 || i.layer == layer);
  }));
}

// Index of the first instruction matching op and layer (and micro-batch, when given).
std::size_t find(const std::vector<Instruction>& p, Op op, int layer, int mb = -1) {
  for (std::size_t k = 0; k < p.size(); ++k)
    if (p[k].op == op && p[k].layer == layer && (mb < 0 || p[k].micro_batch == mb)) return k;
  return p.size();
}

TEST(Schedule, InFlightMicroBatchesPerSchedule) {
  const Schedule f1b = Schedule::build(spec(4, ScheduleKind::one_f_one_b, 4, 8));
  for (int c = 0; c < 4; ++c) EXPECT_EQ(f1b.max_in_flight(c), 4 - c);  // pp - stage
  const Schedule gp = Schedule::build(spec(4, ScheduleKind::gpipe, 4, 8));
  for (int c = 0; c < 4; ++c) EXPECT_EQ(gp.max_in_flight(c), 8);
  const Schedule single = Schedule::build(spec(3, ScheduleKind::one_f_one_b, 1, 5));
  EXPECT_EQ(single.max_in_flight(0), 1);  // plain gradient accumulation
  const Schedule layered = Schedule::build(spec(3, ScheduleKind::gpipe, 1, 5, 1, true));
  EXPECT_EQ(layered.partition().num_chunks(), 3);
  EXPECT_EQ(layered.max_in_flight(1), 5);  // every micro-batch's layer input is kept
}

// The planner's shape of a layout (closed forms where the orders have one) is what the
// built instruction lists hold, for every schedule kind.
TEST(Schedule, ShapeInFlightEqualsTheBuiltSchedules) {
  // Micro-batches past several periods of the interleaved orders (pp v micro-steps), whose
  // steady state schedule_shape takes from one period.
  int compared = 0;
  for (const ScheduleKind kind :
       {ScheduleKind::gpipe, ScheduleKind::one_f_one_b, ScheduleKind::interleaved, ScheduleKind::modular}) {
    const std::vector<int> chunks = kind == ScheduleKind::interleaved ? std::vector<int>{2, 4} : std::vector<int>{1};
    for (const int v : chunks) {
      for (const int pp : {1, 2, 4}) {
        for (const int M : {1, 2, 3, 4, 5, 8, 12, 16, 20}) {
          for (const bool layered : {false, true}) {
            const StepSpec s = spec(8, kind, pp, M, v, layered);
            if (!schedule_problems(s.layers, s.layout).empty()) continue;
            const ScheduleShape shape = schedule_shape(s.layers, s.layout);
            const Schedule built = Schedule::build(s);
            ASSERT_EQ(shape.partition.num_chunks(), built.partition().num_chunks());
            for (int c = 0; c < shape.partition.num_chunks(); ++c) {
              EXPECT_EQ(shape.in_flight[static_cast<std::size_t>(c)], built.max_in_flight(c))
                  << built.name() << ", pp " << pp << ", " << M << " micro-batches, chunk " << c;
              ++compared;
            }
          }
        }
      }
    }
  }
  EXPECT_GT(compared, 400);
}

TEST(Schedule, ZeroThreeLayeredGathersOncePerPassAndReducesOncePerStep) {
  const int L = 3, M = 4;
  const Schedule layered = Schedule::build(spec(L, ScheduleKind::gpipe, 1, M, 1, true, 3));
  const auto& p = layered.program(0);
  for (int l = 1; l <= L; ++l) {
    // Once per pass (a gather, or the prefetch of the run before), except the last block,
    // whose backward run follows its forward run and keeps the parameters it gathered.
    const int fetches = count(p, Op::gather_params, l) + count(p, Op::prefetch_params, l);
    EXPECT_EQ(fetches, l == L ? 1 : 2) << "block " << l - 1;
    EXPECT_EQ(count(p, Op::release_params, l), fetches);
    EXPECT_EQ(count(p, Op::reduce_grads, l), 1);
  }
  // Double-buffered: while one block's run computes, the next one's parameters come in; never
  // more than two blocks' full parameters at once.
  std::map<int, int> held;
  std::size_t most = 0;
  for (const Instruction& i : p) {
    if (i.layer < 1 || i.layer > L) continue;
    if (i.op == Op::gather_params || i.op == Op::prefetch_params) held[i.layer] = 1;
    if (i.op == Op::release_params) held.erase(i.layer);
    most = std::max(most, held.size());
  }
  EXPECT_EQ(most, 2u);
  // Depth-first, ZeRO-3 fetches each layer for every micro-batch's forward and backward (a
  // gather, or a prefetch one layer ahead) and reduces after each micro-batch (no full
  // gradient is kept).
  const Schedule depth = Schedule::build(spec(L, ScheduleKind::one_f_one_b, 1, M, 1, false, 3));
  for (int l = 1; l <= L; ++l) {
    EXPECT_EQ(count(depth.program(0), Op::gather_params, l) + count(depth.program(0), Op::prefetch_params, l), 2 * M);
    EXPECT_EQ(count(depth.program(0), Op::release_params, l), 2 * M);
    EXPECT_EQ(count(depth.program(0), Op::reduce_grads, l), M);
  }
  // Plain data parallelism: parameters stay, one reduction per layer per step.
  const Schedule dp = Schedule::build(spec(L, ScheduleKind::one_f_one_b, 1, M, 1, false, 0));
  EXPECT_EQ(count(dp.program(0), Op::gather_params), 0);
  EXPECT_EQ(count(dp.program(0), Op::reduce_grads), L + 2);  // blocks, embedding, final norm
  EXPECT_EQ(dp.program(0).back().op, Op::sync_grads);
}

// ZeRO-2/3: a block's reduce-scatter waits for the previous block's (the blocks hold at most
// two full-size accumulators), the embedding's and the final layer's for their own previous
// one alone (ZeRO-2 without layers reduces every micro-batch into the same shard), and no
// block's for theirs: the head's pipeline end reduces both with its last block, and waiting
// there held its host, and the next chunk's backward, for two reductions.
TEST(Schedule, AReductionWaitsForTheBlockReductionBeforeItOrItsOwn) {
  const int L = 4;
  int checked = 0;
  for (const int zero : {2, 3}) {
    for (const bool layered : {false, true}) {
      const ScheduleKind kind = layered ? ScheduleKind::modular : ScheduleKind::one_f_one_b;
      const Schedule pipe = Schedule::build(spec(L, kind, 2, 2, 1, layered, zero));
      for (int stage = 0; stage < 2; ++stage) {
        const auto& p = pipe.program(stage);
        int previous_block = -1;
        std::map<int, int> previous;  // layer -> its last reduction
        for (std::size_t k = 0; k < p.size(); ++k) {
          if (p[k].op != Op::reduce_grads) continue;
          std::vector<int> reductions;
          for (const int j : p[k].after)
            if (p[static_cast<std::size_t>(j)].op == Op::reduce_grads) reductions.push_back(j);
          const int l = p[k].layer;
          const bool block = l >= 1 && l <= L;
          const int before = block ? previous_block : (previous.count(l) ? previous[l] : -1);
          EXPECT_EQ(reductions, before >= 0 ? std::vector<int>{before} : std::vector<int>{})
              << "ZeRO " << zero << (layered ? ", layered" : "") << ", stage " << stage << ", layer " << l;
          if (block) previous_block = static_cast<int>(k);
          previous[l] = static_cast<int>(k);
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 20);
}

// A tied head reads the token embedding: the last stage holds it too and gathers it under
// ZeRO-3. An untied head has its own lm_head: the last stage holds no embedding, never
// fetches or reduces one, and sync_grads adds nothing.
TEST(Schedule, AnUntiedHeadLeavesTheEmbeddingToTheFirstStage) {
  const int L = 4, M = 2;
  for (const bool tied : {true, false}) {
    StepSpec s = spec(L, ScheduleKind::one_f_one_b, 2, M, 1, false, 3);
    s.tied_embeddings = tied;
    const Schedule pipe = Schedule::build(s);
    const std::vector<int> last = pipe.layers_of_stage(1);
    EXPECT_EQ(std::count(last.begin(), last.end(), 0), tied ? 1 : 0);
    const auto& p = pipe.program(1);
    EXPECT_EQ(count(p, Op::gather_params, 0) + count(p, Op::prefetch_params, 0), tied ? 2 * M : 0);
    EXPECT_EQ(count(p, Op::reduce_grads, 0), tied ? M : 0);
    // One stage, depth-first: per micro-batch the lookup gathers the embedding, and a tied
    // head's forward and backward again.
    s.layout.pp = 1;
    const Schedule single = Schedule::build(s);
    const auto& one = single.program(0);
    EXPECT_EQ(count(one, Op::gather_params, 0) + count(one, Op::prefetch_params, 0), tied ? 3 * M : M) << tied;
  }
}

TEST(Schedule, MemoryPoliciesAddTheirInstructionsAroundEachLayer) {
  StepSpec s = spec(4, ScheduleKind::one_f_one_b, 1, 1);
  for (int b = 0; b < 3; ++b) s.blocks[static_cast<std::size_t>(b)].activations = ActivationPolicy::offload;
  s.blocks[3].activations = ActivationPolicy::recompute;
  s.blocks[3].params = MemTier::host;
  s.blocks[3].optimizer = OptimizerPlacement::host;  // also the final norm's (it follows the last block)
  const Schedule schedule = Schedule::build(s);
  const auto& p = schedule.program(0);
  // Offloaded blocks go out after their forward through the staging buffers in turn: h.0's
  // and h.2's through buffer 0, h.1's through buffer 1, so h.1's forward waits for no copy
  // and h.2's for h.0's copy out of buffer 0.
  const std::size_t off1 = find(p, Op::offload_activations, 1), off2 = find(p, Op::offload_activations, 2);
  EXPECT_EQ(p[off1].after, std::vector<int>{static_cast<int>(find(p, Op::forward, 1))});
  EXPECT_EQ(p[off1].buffer, 0);
  EXPECT_EQ(p[off2].buffer, 1);
  EXPECT_EQ(p[find(p, Op::offload_activations, 3)].buffer, 0);
  EXPECT_TRUE(p[find(p, Op::forward, 2)].after.empty());
  EXPECT_EQ(p[find(p, Op::forward, 3)].after, std::vector<int>{static_cast<int>(off1)});
  // They come back before their backward: h.2's and h.1's are still in the buffers their
  // forwards filled (no copy back), h.0's comes back into buffer 0 while h.1's backward
  // runs, once h.2's backward has read that buffer, and h.0's backward waits for it.
  EXPECT_EQ(count(p, Op::reload_activations), 0);
  EXPECT_EQ(count(p, Op::prefetch_activations), 1);
  const std::size_t pre1 = find(p, Op::prefetch_activations, 1);
  EXPECT_EQ(p[pre1].buffer, 0);
  EXPECT_LT(find(p, Op::backward, 3), pre1);
  EXPECT_LT(pre1, find(p, Op::backward, 2));
  EXPECT_EQ(p[find(p, Op::backward, 1)].after, std::vector<int>{static_cast<int>(pre1)});
  EXPECT_EQ(count(p, Op::recompute), 1);
  EXPECT_EQ(find(p, Op::recompute, 4) + 1, find(p, Op::backward, 4));
  // Host-tier parameters: prefetched one block ahead in forward, gathered in backward,
  // each use released once the compute that read them is done.
  const std::size_t pre = find(p, Op::prefetch_params, 4);
  EXPECT_LT(pre, find(p, Op::forward, 3));
  EXPECT_EQ(p[find(p, Op::forward, 4)].after, std::vector<int>{static_cast<int>(pre)});
  EXPECT_EQ(count(p, Op::gather_params, 4) + count(p, Op::prefetch_params, 4), 2);
  EXPECT_EQ(count(p, Op::release_params, 4), 2);
  EXPECT_EQ(p[find(p, Op::release_params, 4)].after, std::vector<int>{static_cast<int>(find(p, Op::forward, 4))});
  EXPECT_EQ(count(p, Op::gather_params, 1), 0);  // resident
  // Host-updated layers' gradients leave once their reduction is done; the rest stay.
  EXPECT_EQ(count(p, Op::flush_grads), 2);
  for (int l : {4, 5}) {
    EXPECT_EQ(p[find(p, Op::flush_grads, l)].after, std::vector<int>{static_cast<int>(find(p, Op::reduce_grads, l))});
  }
}

// Where each backward step is one block and backward steps follow one another (modular,
// layered), an offloaded block comes back during the step before: after the first, no copy
// back starts right before the backward that reads it.
TEST(Schedule, OffloadedSingleBlockStepsComeBackOneStepAhead) {
  StepSpec s = spec(4, ScheduleKind::modular, 2, 4, 1, true);
  for (auto& b : s.blocks) b.activations = ActivationPolicy::offload;
  const Schedule schedule = Schedule::build(s);
  for (int stage = 0; stage < 2; ++stage) {
    const auto& p = schedule.program(stage);
    EXPECT_EQ(count(p, Op::reload_activations), 0) << schedule.describe(stage);
    int prefetched = 0;
    bool first = true;
    for (std::size_t k = 0; k < p.size(); ++k) {
      if (p[k].op != Op::backward || p[k].layer == schedule.final_layer()) continue;
      for (int j : p[k].after) {
        if (p[static_cast<std::size_t>(j)].op != Op::prefetch_activations) continue;
        ++prefetched;
        bool between = false;  // another block's backward between the copy's issue and its reader
        for (std::size_t m = static_cast<std::size_t>(j) + 1; m < k; ++m)
          between |= p[m].op == Op::backward && p[m].layer != schedule.final_layer();
        EXPECT_TRUE(between || first) << "stage " << stage << ", instruction " << k << ": " << schedule.describe(stage);
      }
      first = false;
    }
    EXPECT_EQ(prefetched, 2 * 4) << schedule.describe(stage);  // the first at its own step's start
  }
}

// Over every kind of schedule (building one also checks that both ends of every message
// channel issue its messages in the same order): each receive is waited for by the compute
// that consumes it, each ZeRO-3 fetch by every compute that reads the layer before its
// release, and every wait names an earlier instruction.
TEST(Schedule, ComputeWaitsForItsMessagesAndParameters) {
  std::vector<StepSpec> specs;
  for (int pp : {2, 3, 4}) {
    specs.push_back(spec(2 * pp, ScheduleKind::gpipe, pp, 5, 1, false, 3));
    specs.push_back(spec(2 * pp, ScheduleKind::one_f_one_b, pp, 6, 1, false, 3));
    specs.push_back(spec(4 * pp, ScheduleKind::interleaved, pp, 2 * pp, 2, false, 3));
    specs.push_back(spec(2 * pp, ScheduleKind::modular, pp, 2 * pp, 1, false, 3));
    specs.push_back(spec(2 * pp, ScheduleKind::modular, pp, 3, 1, true, 3));
    specs.push_back(spec(2 * pp, ScheduleKind::gpipe, pp, 3, 1, true, 3));
  }
  for (const StepSpec& sp : specs) {
    const Schedule s = Schedule::build(sp);
    for (int st = 0; st < s.stages(); ++st) {
      const auto& p = s.program(st);
      std::map<int, int> fetched;  // layer -> its fetch, while held
      for (std::size_t k = 0; k < p.size(); ++k) {
        const Instruction& i = p[k];
        for (int j : i.after) ASSERT_LT(j, static_cast<int>(k)) << s.name();
        auto waits_for = [&](int j) { return std::find(i.after.begin(), i.after.end(), j) != i.after.end(); };
        if (i.op == Op::gather_params || i.op == Op::prefetch_params) fetched[i.layer] = static_cast<int>(k);
        if (i.op == Op::recv_activation || i.op == Op::recv_gradient) {
          std::size_t c = k + 1;
          while (c < p.size() && p[c].op != Op::forward && p[c].op != Op::backward) ++c;
          ASSERT_LT(c, p.size()) << s.name();
          EXPECT_TRUE(std::find(p[c].after.begin(), p[c].after.end(), static_cast<int>(k)) != p[c].after.end())
              << s.name() << ": stage " << st << " computes " << op_name(p[c].op) << " before its message arrived";
        }
        const bool reads = i.op == Op::forward || i.op == Op::recompute || (i.op == Op::backward && i.layer != 0);
        if (reads) {
          const std::vector<int> layers =
              i.layer == s.final_layer() ? std::vector<int>{0, i.layer} : std::vector<int>{i.layer};
          for (int l : layers) {
            ASSERT_TRUE(fetched.count(l)) << s.name() << ": stage " << st << " reads layer " << l << " unfetched";
            EXPECT_TRUE(waits_for(fetched[l])) << s.name() << ": stage " << st << " does not wait for layer " << l;
          }
        }
      }
    }
  }
}

TEST(Schedule, UpdateProgramPutsDeviceSubgroupsFirstAndSharesLast) {
  LayerUpdate dynamic{1, OptimizerPlacement::dynamic, {UpdateSite::host, UpdateSite::device, UpdateSite::host}};
  LayerUpdate device{2, OptimizerPlacement::device, {UpdateSite::device, UpdateSite::device}};
  LayerUpdate none{3, OptimizerPlacement::host, {}};  // this rank owns none of it
  const auto p = update_program({dynamic, device, none}, 1);
  ASSERT_EQ(p.size(), 4u + 2u + 3u);
  EXPECT_EQ(p[0].subgroup, 1);
  EXPECT_EQ(p[0].site, UpdateSite::device);
  EXPECT_EQ(p[1].subgroup, 0);
  EXPECT_EQ(p[2].subgroup, 2);
  EXPECT_EQ(p[3].op, Op::publish_params);
  // State on the device: its updates write the stored parameters, and the layer's share
  // waits for both of them.
  auto writes_params = [](const Instruction& i) {
    for (const auto& a : i.access)
      if (a.buffer.kind == Buf::params && a.write) return true;
    return false;
  };
  EXPECT_FALSE(writes_params(p[0]));
  EXPECT_TRUE(writes_params(p[4]));
  EXPECT_TRUE(writes_params(p[5]));
  for (std::size_t k = 6; k < p.size(); ++k) EXPECT_EQ(p[k].op, Op::share_params);  // every layer, ZeRO-1
  EXPECT_EQ(p[6].after, std::vector<int>{3});
  EXPECT_EQ(p[7].after, (std::vector<int>{4, 5}));
}

TEST(Schedule, LayoutsNoBuilderSupportsNameTheirKey) {
  auto key = [](std::int64_t layers, const StepSpec& s) {
    const auto problems = schedule_problems(layers, s.layout);
    return problems.empty() ? std::string() : problems.front().key;
  };
  EXPECT_EQ(key(4, spec(4, ScheduleKind::one_f_one_b, 2, 4, 1, true)), "parallel.layered");
  EXPECT_EQ(key(4, spec(4, ScheduleKind::interleaved, 2, 3, 2)), "data.micro_batch_size");  // M % pp
  EXPECT_EQ(key(5, spec(5, ScheduleKind::modular, 2, 4)), "parallel.pp");                  // L % pp
  EXPECT_EQ(key(3, spec(3, ScheduleKind::gpipe, 2, 4)), "parallel.pp");                    // L % pp
  EXPECT_EQ(key(2, spec(2, ScheduleKind::gpipe, 4, 4)), "parallel.pp");                    // more stages than layers
  EXPECT_EQ(key(6, spec(6, ScheduleKind::interleaved, 2, 4, 4)), "parallel.virtual_stages");
  EXPECT_THROW(Schedule::build(spec(3, ScheduleKind::gpipe, 2, 4)), InputError);
}

}  // namespace
}  // namespace lamina::test
