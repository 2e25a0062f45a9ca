// The hazard checker proves the instruction lists race-free on any machine: every schedule
// kind, memory policy and mix, parameter and optimizer tier, ZeRO stage, and the layouts of
// the multi-rank tests pass; and a list with one needed wait removed, or a pooled buffer
// used outside its hold, is rejected, naming the two instructions and the buffer.
#include "lamina/parallel/hazards.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "schedule_spec.hpp"

namespace lamina::test {
namespace {

// The optimizer program of a stage: every held layer by its block's placement, dynamic
// layers alternating device and host subgroups.
std::vector<Instruction> update_of(const Schedule& s, int stage) {
  std::vector<LayerUpdate> layers;
  for (int l : s.layers_of_stage(stage)) {
    LayerUpdate u;
    u.layer = l;
    u.placement = policy_of_layer(s.spec().blocks, l).optimizer;
    for (int g = 0; g < 3; ++g) {
      const bool device = u.placement == OptimizerPlacement::device ||
                          (u.placement == OptimizerPlacement::dynamic && g % 2 == 0);
      u.sites.push_back(device ? UpdateSite::device : UpdateSite::host);
    }
    layers.push_back(u);
  }
  return update_program(layers, s.spec().layout.zero);
}

void expect_race_free(const StepSpec& sp, const std::string& what) {
  const Schedule s = Schedule::build(sp);
  for (int st = 0; st < s.stages(); ++st) {
    const std::vector<Hazard> h = find_hazards(s, st, update_of(s, st));
    EXPECT_TRUE(h.empty()) << what << " (" << s.name() << "), stage " << st << ": " << h.size()
                           << " hazard(s), the first: " << h.front().message;
  }
}

// Activation policies of the blocks: uniform, and mixes that put different policies side by side.
std::vector<std::vector<ActivationPolicy>> activation_mixes(std::int64_t layers, bool layered) {
  using A = ActivationPolicy;
  std::vector<std::vector<A>> out;
  std::vector<A> kinds = {A::keep, A::recompute, A::offload};
  if (layered) kinds.push_back(A::offload_checkpoint);
  for (A a : kinds) out.push_back(std::vector<A>(static_cast<std::size_t>(layers), a));
  for (std::size_t shift = 0; shift < kinds.size(); ++shift) {
    std::vector<A> mix;
    for (std::int64_t b = 0; b < layers; ++b) mix.push_back(kinds[(static_cast<std::size_t>(b) + shift) % kinds.size()]);
    out.push_back(mix);
  }
  return out;
}

TEST(Hazards, EveryScheduleKindPolicyAndTierIsRaceFree) {
  std::vector<StepSpec> layouts;
  for (int pp : {1, 2, 3}) {
    for (int zero : {0, 1, 2, 3}) {
      layouts.push_back(spec(2 * pp, ScheduleKind::gpipe, pp, 5, 1, false, zero));
      layouts.push_back(spec(2 * pp, ScheduleKind::one_f_one_b, pp, 6, 1, false, zero));
      if (pp > 1) {
        layouts.push_back(spec(4 * pp, ScheduleKind::interleaved, pp, 2 * pp, 2, false, zero));
        layouts.push_back(spec(2 * pp, ScheduleKind::modular, pp, 2 * pp, 1, false, zero));
      }
      layouts.push_back(spec(2 * pp, ScheduleKind::modular, pp, 3, 1, true, zero));
      layouts.push_back(spec(2 * pp, ScheduleKind::gpipe, pp, 3, 1, true, zero));
    }
  }
  int checked = 0;
  for (const StepSpec& base : layouts) {
    for (const auto& mix : activation_mixes(base.layers, base.layout.layered)) {
      for (int tiers = 0; tiers < 3; ++tiers) {
        StepSpec sp = base;
        for (std::size_t b = 0; b < sp.blocks.size(); ++b) {
          sp.blocks[b].activations = mix[b];
          // 0: everything on the device; 1: parameters and optimizer on the host; 2: alternating,
          // with Deep Optimizer States.
          const bool host = tiers == 1 || (tiers == 2 && b % 2 == 0);
          sp.blocks[b].params = host ? MemTier::host : MemTier::device;
          sp.blocks[b].optimizer = tiers == 0 ? OptimizerPlacement::device
                                   : tiers == 1 ? OptimizerPlacement::host
                                                : (b % 2 ? OptimizerPlacement::dynamic : OptimizerPlacement::host);
        }
        expect_race_free(sp, "activations/tiers variant " + std::to_string(tiers));
        ++checked;
      }
    }
  }
  EXPECT_GT(checked, 700);
}

// The layouts the multi-rank tests train (tests/mpi/parallel_training_test.cpp), one stage's
// lists each: 4 blocks, 4 micro-batches; tied and untied.
TEST(Hazards, TheMultiRankTestLayoutsAreRaceFree) {
  auto layout = [](ScheduleKind k, int pp, int zero, bool layered = false, int v = 1) {
    StepSpec s = spec(4, k, pp, 4, v, layered, zero);
    s.layout.dp = zero > 0 ? 2 : 1;
    return s;
  };
  using S = ScheduleKind;
  std::vector<StepSpec> specs = {layout(S::one_f_one_b, 1, 0), layout(S::one_f_one_b, 1, 1), layout(S::one_f_one_b, 1, 2),
                                 layout(S::one_f_one_b, 1, 3), layout(S::gpipe, 2, 0),       layout(S::one_f_one_b, 2, 0),
                                 layout(S::interleaved, 2, 0, false, 2), layout(S::modular, 2, 0),
                                 layout(S::modular, 2, 0, true),     layout(S::modular, 2, 3, true)};
  StepSpec checkpoints = layout(S::modular, 2, 0, true);
  for (auto& b : checkpoints.blocks) b.activations = ActivationPolicy::offload_checkpoint;
  specs.push_back(checkpoints);
  StepSpec offload_host_dynamic = layout(S::one_f_one_b, 1, 3);
  for (auto& b : offload_host_dynamic.blocks) {
    b.activations = ActivationPolicy::offload;
    b.params = MemTier::host;
    b.optimizer = OptimizerPlacement::dynamic;
  }
  specs.push_back(offload_host_dynamic);
  StepSpec recompute_host = layout(S::one_f_one_b, 2, 0);
  for (auto& b : recompute_host.blocks) {
    b.activations = ActivationPolicy::recompute;
    b.optimizer = OptimizerPlacement::host;
  }
  specs.push_back(recompute_host);
  for (StepSpec s : specs) {
    expect_race_free(s, "multi-rank test layout");
    s.tied_embeddings = false;  // the head reads its own lm_head, not the embedding
    expect_race_free(s, "multi-rank test layout, untied");
  }
}

// Index of the first instruction that matches.
template <class Match>
int find(const std::vector<Instruction>& p, Match m, int from = 0) {
  for (int k = from; k < static_cast<int>(p.size()); ++k)
    if (m(p[static_cast<std::size_t>(k)])) return k;
  return -1;
}

// The program with one wait removed: instruction `k` no longer waits for `j`.
std::vector<Instruction> without_wait(std::vector<Instruction> p, int k, int j) {
  auto& a = p[static_cast<std::size_t>(k)].after;
  const auto it = std::find(a.begin(), a.end(), j);
  EXPECT_NE(it, a.end()) << "instruction " << k << " does not wait for " << j;
  if (it != a.end()) a.erase(it);
  return p;
}

bool names(const std::vector<Hazard>& h, Buf kind) {
  return std::any_of(h.begin(), h.end(), [&](const Hazard& x) { return x.buffer.kind == kind; });
}

// The race reading found: with more warm-up micro-batches than staging buffers (1F1B, pp 3)
// and [offload, recompute], the first stage copies a micro-batch's activations back into
// staging buffer 0 while the copy of a later micro-batch's out of it may still run. The
// builder makes the reload wait for that copy; without the wait, the checker finds it.
TEST(Hazards, TheReloadRaceIsFoundWhenItsWaitIsRemoved) {
  StepSpec sp = spec(6, ScheduleKind::one_f_one_b, 3, 6);
  for (std::size_t b = 0; b < sp.blocks.size(); ++b)
    sp.blocks[b].activations = b % 2 == 0 ? ActivationPolicy::offload : ActivationPolicy::recompute;
  const Schedule s = Schedule::build(sp);
  const auto& p = s.program(0);
  // A reload that waits for an offload of another micro-batch out of the same buffer.
  int reload = -1, offload = -1;
  for (int k = 0; k < static_cast<int>(p.size()) && reload < 0; ++k) {
    const Instruction& i = p[static_cast<std::size_t>(k)];
    if (i.op != Op::reload_activations) continue;
    for (int j : i.after) {
      const Instruction& o = p[static_cast<std::size_t>(j)];
      if (o.op == Op::offload_activations && o.micro_batch != i.micro_batch && o.buffer == i.buffer) {
        reload = k;
        offload = j;
      }
    }
  }
  ASSERT_GE(reload, 0) << "no reload follows another micro-batch's offload: " << s.describe(0);
  EXPECT_TRUE(find_hazards(s, 0, {}).empty());
  const std::vector<Hazard> h = find_hazards(s, without_wait(p, reload, offload), {});
  ASSERT_FALSE(h.empty());
  EXPECT_TRUE(names(h, Buf::staging)) << h.front().message;
  EXPECT_NE(h.front().message.find("reload"), std::string::npos) << h.front().message;
  EXPECT_NE(h.front().message.find("offload"), std::string::npos) << h.front().message;
}

// Other waits a list needs, each removed in turn: the checker names what would race.
TEST(Hazards, EachNeededWaitRemovedIsFound) {
  struct Case {
    const char* what;
    StepSpec spec;
    Op waiter, waited;
    Buf buffer;
  };
  StepSpec offload = spec(3, ScheduleKind::one_f_one_b, 1, 2);  // a third block to bring back ahead
  for (auto& b : offload.blocks) b.activations = ActivationPolicy::offload;
  StepSpec host_params = spec(3, ScheduleKind::one_f_one_b, 1, 2);
  for (auto& b : host_params.blocks) {
    b.params = MemTier::host;
    b.optimizer = OptimizerPlacement::host;
  }
  StepSpec zero3 = spec(3, ScheduleKind::one_f_one_b, 1, 2, 1, false, 3);
  StepSpec checkpoints = spec(3, ScheduleKind::gpipe, 1, 3, 1, true);
  for (auto& b : checkpoints.blocks) b.activations = ActivationPolicy::offload_checkpoint;
  StepSpec pp2 = spec(4, ScheduleKind::one_f_one_b, 2, 4);
  const std::vector<Case> cases = {
      {"an offload copies out what its forward wrote", offload, Op::offload_activations, Op::forward, Buf::staging},
      {"a backward reads what its prefetch brought back", offload, Op::backward, Op::prefetch_activations,
       Buf::staging},
      {"a compute reads the parameters its fetch gathers", host_params, Op::forward, Op::prefetch_params,
       Buf::gathered},
      {"a gathered buffer goes back only once the compute that read it is done", zero3, Op::release_params,
       Op::forward, Buf::gathered},
      {"a reduction reads the gradients the backward accumulated", spec(3, ScheduleKind::one_f_one_b, 1, 2),
       Op::reduce_grads, Op::backward, Buf::grads},
      {"a flush copies out the reduced gradients", host_params, Op::flush_grads, Op::reduce_grads, Buf::grads},
      {"a recomputation starts from the checkpoint its prefetch brought back", checkpoints, Op::recompute,
       Op::prefetch_checkpoint, Buf::input},
      {"a prefetched checkpoint's frame waits for its own copy out", checkpoints, Op::prefetch_checkpoint,
       Op::offload_checkpoint, Buf::checkpoint},
      {"a compute consumes the activation its receive writes", pp2, Op::backward, Op::recv_gradient, Buf::grad},
  };
  for (const Case& c : cases) {
    const Schedule s = Schedule::build(c.spec);
    const int stage = 0;
    const auto& p = s.program(stage);
    ASSERT_TRUE(find_hazards(s, stage, {}).empty()) << c.what;
    // Each wait of an instruction of kind `waiter` for one of kind `waited`, removed alone
    // (some are implied by later instructions' waits; where none is, the race is found).
    int waits = 0, found = 0;
    for (int k = 0; k < static_cast<int>(p.size()); ++k) {
      if (p[static_cast<std::size_t>(k)].op != c.waiter) continue;
      for (int j : p[static_cast<std::size_t>(k)].after) {
        if (p[static_cast<std::size_t>(j)].op != c.waited) continue;
        ++waits;
        if (names(find_hazards(s, without_wait(p, k, j), {}), c.buffer)) ++found;
      }
    }
    ASSERT_GT(waits, 0) << c.what << ": no such wait in " << s.describe(stage);
    EXPECT_GT(found, 0) << c.what << ": removing any of its " << waits << " waits goes unnoticed";
  }
}

// The optimizer program: a layer's parameters are published only after its device
// subgroups' updates, which on a device run beside the host.
TEST(Hazards, PublishingBeforeTheDeviceUpdatesEndIsFound) {
  const Schedule s = Schedule::build(spec(2, ScheduleKind::one_f_one_b, 1, 2));
  LayerUpdate u{1, OptimizerPlacement::dynamic, {UpdateSite::device, UpdateSite::host}};
  std::vector<Instruction> update = update_program({u}, 0);
  EXPECT_TRUE(find_hazards(s, 0, update).empty());
  const int publish = find(update, [](const Instruction& i) { return i.op == Op::publish_params; });
  ASSERT_GE(publish, 0);
  update = without_wait(update, publish, 0);  // the device subgroup's update
  const std::vector<Hazard> h = find_hazards(s, 0, update);
  ASSERT_FALSE(h.empty());
  EXPECT_TRUE(names(h, Buf::optimizer)) << h.front().message;
  EXPECT_EQ(h.front().program, 1);  // in the update program
}

// Pooled buffers: touched only while held, given back before they are taken again.
TEST(Hazards, PooledBuffersUsedOutsideTheirHoldAreFound) {
  const Schedule s = Schedule::build(spec(2, ScheduleKind::one_f_one_b, 1, 2, 1, false, 3));
  const auto& p = s.program(0);
  // Dropping a gather's take of its buffer: the compute then reads parameters nobody holds.
  std::vector<Instruction> untaken = p;
  const int gather = find(untaken, [](const Instruction& i) { return i.op == Op::gather_params || i.op == Op::prefetch_params; });
  ASSERT_GE(gather, 0);
  untaken[static_cast<std::size_t>(gather)].pool.clear();
  std::vector<Hazard> h = find_hazards(s, untaken, {});
  ASSERT_FALSE(h.empty());
  EXPECT_NE(h.front().message.find("is not taken"), std::string::npos) << h.front().message;
  // Never giving a slot back: the next step takes it again.
  std::vector<Instruction> kept = p;
  for (Instruction& i : kept) {
    i.pool.erase(std::remove_if(i.pool.begin(), i.pool.end(),
                                [](const PoolEvent& e) { return !e.acquire && e.held.pool == Pool::slots; }),
                 i.pool.end());
  }
  h = find_hazards(s, kept, {});
  ASSERT_FALSE(h.empty());
  EXPECT_NE(h.front().message.find("taken again"), std::string::npos) << h.front().message;
}

// A wait on an instruction that is not earlier in the list is an error of the list itself.
TEST(Hazards, WaitsOnLaterInstructionsAreRejected) {
  const Schedule s = Schedule::build(spec(2, ScheduleKind::one_f_one_b, 1, 1));
  std::vector<Instruction> p = s.program(0);
  p.front().after.push_back(static_cast<int>(p.size()) - 1);
  const std::vector<Hazard> h = find_hazards(s, p, {});
  ASSERT_FALSE(h.empty());
  EXPECT_NE(h.front().message.find("not before it"), std::string::npos) << h.front().message;
}

}  // namespace
}  // namespace lamina::test
