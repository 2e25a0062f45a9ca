// A deck's [parallel] and [memory] keys become a Plan in one place: every layout and policy
// problem is reported at once, each at the deck line (or --set) to change.
#include "lamina/plan/plan.hpp"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

const char* kDeck = R"([model]
layers = 4
d_model = 32
heads = 4
seq_len = 16
vocab_size = 64
[data]
format = "synthetic"
batch_size = 8
[train]
steps = 1
[parallel]
pp = 2
schedule = "gpipe"
[memory]
activations = ["keep", "keep", "recompute", "offload"]
)";

std::string error_of(const std::vector<std::string>& sets, int world = 0) {
  try {
    plan_from_deck(parse_deck(kDeck, "deck.toml", sets), world);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Plan, ComesFromTheDeckWithEveryKeyResolved) {
  const Plan p = plan_from_deck(parse_deck(kDeck, "deck.toml", {"parallel.dp=2", "data.micro_batch_size=2"}), 4);
  EXPECT_EQ(p.layout.pp, 2);
  EXPECT_EQ(p.layout.dp, 2);
  EXPECT_EQ(p.layout.schedule, ScheduleKind::gpipe);
  EXPECT_EQ(p.layout.micro_batches, 2);  // 8 sequences = dp 2 x 2 micro-batches of 2
  ASSERT_EQ(p.blocks.size(), 4u);
  EXPECT_EQ(p.blocks[2].activations, ActivationPolicy::recompute);
  EXPECT_EQ(p.blocks[3].activations, ActivationPolicy::offload);
  EXPECT_EQ(p.layer(0).activations, ActivationPolicy::keep);      // the embedding follows block 0
  EXPECT_EQ(p.layer(5).activations, ActivationPolicy::offload);   // the final norm the last block
  EXPECT_EQ(plan_summary(p),
            "dp=2 tp=1 pp=2 zero=0 schedule=gpipe virtual_stages=1 layered=false micro_batch_size=2 micro_batches=2 "
            "precision=fp32 activations=keep*2,recompute*1,offload*1 params=device optimizer=device");
  const std::string d = describe(p);
  EXPECT_NE(d.find("blocks 0-1: activations keep"), std::string::npos) << d;
  EXPECT_NE(d.find("blocks 3-3: activations offload"), std::string::npos) << d;
}

TEST(Plan, LayoutProblemsPointAtTheKeyToChange) {
  // Three stages for four layers: at the deck line of parallel.pp.
  EXPECT_NE(error_of({"parallel.pp=3"}).find("--set parallel.pp=3: parallel.pp: model.layers = 4 cannot be cut"),
            std::string::npos)
      << error_of({"parallel.pp=3"});
  const std::string pp5 = error_of({"parallel.pp=5"});
  EXPECT_NE(pp5.find("every stage needs at least one layer"), std::string::npos) << pp5;
  const std::string world = error_of({}, 3);
  EXPECT_NE(world.find("deck.toml:12:1: parallel.dp: dp x tp x pp = 1 x 1 x 2 = 2 ranks, but the job runs on 3"),
            std::string::npos)
      << world;
  const std::string v = error_of({"parallel.schedule=interleaved", "parallel.virtual_stages=3"});
  EXPECT_NE(v.find("--set parallel.virtual_stages=3: parallel.virtual_stages"), std::string::npos) << v;
  // All at once.
  const std::string both = error_of({"parallel.tp=3", "parallel.layered=true", "parallel.schedule=1f1b"});
  EXPECT_NE(both.find("problems in the deck"), std::string::npos) << both;
  EXPECT_NE(both.find("parallel.tp: model.heads = 4 must be divisible by tp = 3"), std::string::npos) << both;
  EXPECT_NE(both.find("parallel.layered: layered gradient accumulation runs each layer"), std::string::npos) << both;
}

// Each tensor-parallel rank takes whole key/value heads or shares one: tp 4 over 2 heads
// plans (two ranks a head), tp 6 over 4 heads of 12 queries does not.
TEST(Plan, TensorParallelismTakesWholeKeyValueHeadsOrSharesThem) {
  EXPECT_EQ(error_of({"model.kv_heads=2", "parallel.tp=4"}, 8), "(no error)");
  const std::string e = error_of({"model.d_model=48", "model.heads=12", "model.kv_heads=4", "parallel.tp=6"}, 12);
  EXPECT_NE(e.find("parallel.tp: model.kv_heads = 4 and tp = 6: one must divide the other"), std::string::npos) << e;
}

TEST(Plan, ABatchThatMicroBatchesDoNotDivideIsADeckError) {
  const std::string e = error_of({"data.micro_batch_size=3"});
  EXPECT_NE(e.find("deck.toml:9:14: data.batch_size: 8 is not a multiple of micro_batch_size x parallel.dp = 3 x 1"),
            std::string::npos)
      << e;
}

TEST(Plan, SizesBeyondAnyMachineAreDeckErrorsNotOverflows) {
  const std::string mb = error_of({"data.batch_size=1099511627776", "data.micro_batch_size=2147483648",
                                   "model.seq_len=100000"});
  EXPECT_NE(mb.find("--set data.micro_batch_size=2147483648: data.micro_batch_size: a micro-batch of 2147483648 "
                    "sequences of 100000 tokens makes activations of"),
            std::string::npos)
      << mb;
  const std::string steps = error_of({"data.batch_size=1099511627776", "data.micro_batch_size=1"});
  EXPECT_NE(steps.find("micro-batches of 1 x parallel.dp = 1 per step; at most 16777216"), std::string::npos) << steps;
  const std::string model = error_of({"model.d_model=1048576", "model.heads=1024", "model.vocab_size=1073741824"});
  EXPECT_NE(model.find("more than any machine holds"), std::string::npos) << model;
  try {
    parse_deck(kDeck, "deck.toml", {"data.batch_size=9223372036854775807"});
    FAIL() << "the deck accepted a batch of 2^63 - 1 sequences";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("out of range"), std::string::npos) << e.what();
  }
}

// Tensor-parallel sums in bf16 round a bf16 run's partial results: an fp32 run cannot ask.
TEST(Plan, Bf16TensorParallelSumsBelongToBf16Runs) {
  const Plan p = plan_from_deck(
      parse_deck(kDeck, "deck.toml", {"parallel.tp=2", "train.precision=bf16", "parallel.tp_sums=bf16"}));
  EXPECT_EQ(p.tp_sums, Precision::bf16);
  EXPECT_EQ(step_spec(p, parse_deck(kDeck, "deck.toml", {}).model).tp_sums, Precision::bf16);
  EXPECT_NE(plan_summary(p).find("precision=bf16 tp_sums=bf16 "), std::string::npos) << plan_summary(p);
  EXPECT_NE(describe(p).find(", bf16, optimizer subgroups of 4194304, tensor-parallel sums in bf16"), std::string::npos)
      << describe(p);
  EXPECT_EQ(plan_from_deck(parse_deck(kDeck, "deck.toml", {"train.precision=bf16"})).tp_sums, Precision::fp32);
  const std::string e = error_of({"parallel.tp_sums=bf16"});
  EXPECT_NE(e.find("--set parallel.tp_sums=bf16: parallel.tp_sums: 'bf16' rounds a bf16 run's partial results; this "
                   "run is fp32"),
            std::string::npos)
      << e;
  const std::string typo = error_of({"parallel.tp_sums=bf18"});
  EXPECT_NE(typo.find("tp_sums"), std::string::npos) << typo;
}

// Sequence parallelism splits a micro-batch's rows over the tensor-parallel group: it needs a
// group and rows that split evenly. (A rank's rows are whole bf16 pairs: tp divides
// the heads, which divide d_model.)
TEST(Plan, SequenceParallelismNeedsATensorParallelGroupThatSplitsTheRows) {
  const Plan p = plan_from_deck(parse_deck(kDeck, "deck.toml", {"parallel.tp=2", "parallel.sequence_parallel=true"}));
  EXPECT_TRUE(p.layout.sequence_parallel);
  EXPECT_TRUE(step_spec(p, parse_deck(kDeck, "deck.toml", {}).model).layout.sequence_parallel);
  EXPECT_NE(plan_summary(p).find("precision=fp32 sequence_parallel=true "), std::string::npos) << plan_summary(p);
  EXPECT_NE(describe(p).find(", sequence parallelism"), std::string::npos) << describe(p);
  EXPECT_FALSE(plan_from_deck(parse_deck(kDeck, "deck.toml", {"parallel.tp=2"})).layout.sequence_parallel);
  const std::string alone = error_of({"parallel.sequence_parallel=true"});
  EXPECT_NE(alone.find("--set parallel.sequence_parallel=true: parallel.sequence_parallel: shards the sequence over "
                       "the tensor-parallel group, and parallel.tp = 1 has none"),
            std::string::npos)
      << alone;
  // A micro-batch of one sequence: 16 rows split over tp 4, 15 not over tp 2.
  EXPECT_EQ(error_of({"parallel.tp=4", "parallel.sequence_parallel=true"}), "(no error)");
  const std::string uneven =
      error_of({"parallel.tp=2", "parallel.sequence_parallel=true", "model.seq_len=15", "data.micro_batch_size=1"});
  EXPECT_NE(uneven.find("a micro-batch's 15 positions (micro_batch_size x seq_len) do not split evenly over tp = 2"),
            std::string::npos)
      << uneven;
  // bf16 sums reduce-scatter in bf16.
  EXPECT_EQ(error_of({"parallel.tp=2", "parallel.sequence_parallel=true", "train.precision=bf16",
                      "parallel.tp_sums=bf16"}),
            "(no error)");
}

// Context parallelism: a grid dimension of its own (dp x cp x tp x pp ranks), sequences cut
// into 2 cp chunks, attention on the fused kernels.
TEST(Plan, ContextParallelismCutsSequencesIntoTwoChunksPerRank) {
  const Plan p = plan_from_deck(parse_deck(kDeck, "deck.toml", {"parallel.cp=2", "parallel.pp=1"}), 2);
  EXPECT_EQ(p.layout.cp, 2);
  EXPECT_EQ(p.layout.ranks(), 2);
  EXPECT_EQ(p.layout.replicas(), 2);
  EXPECT_NE(plan_summary(p).find(" cp=2 "), std::string::npos) << plan_summary(p);
  EXPECT_NE(describe(p).find(", context parallelism over 2 ranks (ring attention)"), std::string::npos) << describe(p);
  const std::string world = error_of({"parallel.cp=2"}, 3);
  EXPECT_NE(world.find("parallel.dp: dp x cp x tp x pp = 1 x 2 x 1 x 2 = 4 ranks, but the job runs on 3; change "
                       "parallel.dp, cp, tp or pp"),
            std::string::npos)
      << world;
  // seq_len 16 is 2 chunks of 8 per rank over cp 4 (8 chunks of 2), not over cp 3.
  EXPECT_EQ(error_of({"parallel.cp=4"}, 8), "(no error)");
  const std::string uneven = error_of({"parallel.cp=3"}, 6);
  EXPECT_NE(uneven.find("--set parallel.cp=3: parallel.cp: cuts each sequence into 2 cp = 6 chunks"),
            std::string::npos)
      << uneven;
  const std::string in_place = error_of({"parallel.cp=2", "model.attention=in_place"}, 4);
  EXPECT_NE(in_place.find("model.attention: context parallelism (parallel.cp = 2) runs attention as ring attention on "
                          "the fused kernels or on staged products, not in place"),
            std::string::npos)
      << in_place;
  EXPECT_EQ(error_of({"parallel.cp=2", "model.attention=fused"}, 4), "(no error)");
  EXPECT_EQ(error_of({"parallel.cp=2", "model.attention=staged"}, 4), "(no error)");
}

TEST(Plan, PolicyProblemsAreDeckErrors) {
  const std::string e = error_of({"memory.params=host"});
  EXPECT_NE(e.find("memory.optimizer: block 0 has memory.params = 'host'"), std::string::npos) << e;
  EXPECT_EQ(error_of({"memory.params=host", "memory.optimizer=dynamic"}), "(no error)");
}

}  // namespace
}  // namespace lamina::test
