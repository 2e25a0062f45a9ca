// The parameter layout follows the block's parts, and tensor parallelism places every
// element of a rank's piece, [q | k | v] blocks of unequal widths included, where its
// slabs say it goes: the ranks' pieces tile the global tensor exactly once, counting a
// piece that several ranks share (K/V heads where tp exceeds kv_heads) by its first copy.
#include "lamina/model/param_layout.hpp"

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace lamina::test {
namespace {

ModelConfig llama() {
  ModelConfig m;
  m.layers = 2;
  m.d_model = 32;
  m.heads = 4;
  m.kv_heads = 2;
  m.ffn_hidden = 48;
  m.seq_len = 16;
  m.vocab_size = 64;
  m.parts.norm = NormKind::rmsnorm;
  m.parts.position = PositionKind::rotary;
  m.parts.mlp = MlpKind::swiglu;
  m.parts.bias = false;
  return m;
}

std::map<std::string, std::vector<std::int64_t>> shapes(const ParamLayout& p) {
  std::map<std::string, std::vector<std::int64_t>> out;
  for (const LayerSpec& l : p.layers()) {
    for (const TensorSpec& t : l.tensors) out[t.name] = t.global_shape;
  }
  return out;
}

TEST(ParamLayout, ALlamaBlockHasNoBiasesNoPositionTableAndGroupedKeysAndValues) {
  const ParamLayout p = ParamLayout::of(llama());
  using Shape = std::vector<std::int64_t>;
  const std::map<std::string, Shape> expected = {
      {"wte", {64, 32}},
      {"h.0.ln_1.weight", {32}},
      {"h.0.attn.c_attn.weight", {32, 32 + 2 * 16}},  // q: 4 heads of 8, k and v: 2 heads of 8
      {"h.0.attn.c_proj.weight", {32, 32}},
      {"h.0.ln_2.weight", {32}},
      {"h.0.mlp.c_fc.weight", {32, 2 * 48}},  // [gate | up]
      {"h.0.mlp.c_proj.weight", {48, 32}},
      {"h.1.ln_1.weight", {32}},
      {"h.1.attn.c_attn.weight", {32, 64}},
      {"h.1.attn.c_proj.weight", {32, 32}},
      {"h.1.ln_2.weight", {32}},
      {"h.1.mlp.c_fc.weight", {32, 96}},
      {"h.1.mlp.c_proj.weight", {48, 32}},
      {"ln_f.weight", {32}}};
  EXPECT_EQ(shapes(p), expected);
  EXPECT_EQ(p.total_numel(), 64 * 32 + 2 * (32 + 32 * 64 + 32 * 32 + 32 + 32 * 96 + 48 * 32) + 32);

  ModelConfig gpt2 = llama();
  gpt2.kv_heads = gpt2.ffn_hidden = 0;
  gpt2.parts = BlockParts();
  const auto g = shapes(ParamLayout::of(gpt2));
  EXPECT_EQ(g.size(), 2 + 2 * 12 + 2u);
  EXPECT_EQ(g.at("wpe"), (std::vector<std::int64_t>{16, 32}));
  EXPECT_EQ(g.at("h.1.attn.c_attn.bias"), (std::vector<std::int64_t>{96}));
  EXPECT_EQ(g.at("h.1.mlp.c_fc.weight"), (std::vector<std::int64_t>{32, 128}));
}

TEST(ParamLayout, TensorParallelPiecesTileEveryTensorOnce) {
  // tp 4 exceeds the two key/value heads: ranks 0 and 1 share the first, 2 and 3 the second.
  for (const int tp : {2, 4}) {
    std::map<std::string, std::vector<int>> first, all;  // per tensor: first copies, all copies of each element
    for (int r = 0; r < tp; ++r) {
      const ParamLayout p = ParamLayout::of(llama(), tp, r);
      for (const LayerSpec& l : p.layers()) {
        for (const TensorSpec& t : l.tensors) {
          std::int64_t global = 1;
          for (const auto d : t.global_shape) global *= d;
          auto& f = first[t.name];
          auto& a = all[t.name];
          f.resize(static_cast<std::size_t>(global));
          a.resize(static_cast<std::size_t>(global));
          for (const SlabMap& s : t.slabs()) {
            // global_index agrees with the slabs: each slab's first element maps to its offset.
            std::int64_t local = 0, expected = 0;
            for (std::size_t k = 0; k < t.shape.size(); ++k) {
              local = local * t.shape[k] + s.local_offset[k];
              expected = expected * t.global_shape[k] + s.global_offset[k];
            }
            EXPECT_EQ(t.global_index(local), expected) << t.name;
            for (const auto& [b, e] : t.runs(s)) {
              for (std::int64_t i = b; i < e; ++i) {
                const auto g = static_cast<std::size_t>(t.global_index(i));
                ++a[g];
                if (s.first_copy) ++f[g];
              }
            }
          }
        }
      }
    }
    for (const auto& [name, h] : first) {
      for (std::size_t i = 0; i < h.size(); ++i) ASSERT_EQ(h[i], 1) << name << " element " << i << ", tp " << tp;
    }
    // Held by every rank: the norms; by two ranks at tp 4: the k and v columns (32..63).
    const auto& qkv = all.at("h.0.attn.c_attn.weight");
    for (std::size_t i = 0; i < qkv.size(); ++i) ASSERT_EQ(qkv[i], tp == 4 && i % 64 >= 32 ? 2 : 1) << i;
    EXPECT_EQ(all.at("ln_f.weight")[0], tp);
  }
  {
    // Rank 1's q columns follow rank 0's within the q block, its k columns start the k block's second half.
    const ParamLayout p1 = ParamLayout::of(llama(), 2, 1);
    int layer = 0;
    const TensorSpec* qkv = nullptr;
    ASSERT_TRUE(p1.find("h.0.attn.c_attn.weight", layer, qkv));
    EXPECT_EQ(qkv->shape, (std::vector<std::int64_t>{32, 32}));
    EXPECT_EQ(qkv->global_index(0), 16);       // q: global columns 16..31
    EXPECT_EQ(qkv->global_index(16), 32 + 8);  // k: global columns 40..47
    EXPECT_EQ(qkv->global_index(24), 48 + 8);  // v: global columns 56..63
  }
  {
    // At tp 4 rank 3 holds q columns 24..31 and the second key/value head, which rank 2 also
    // holds and writes.
    const ParamLayout p3 = ParamLayout::of(llama(), 4, 3);
    int layer = 0;
    const TensorSpec* qkv = nullptr;
    ASSERT_TRUE(p3.find("h.0.attn.c_attn.weight", layer, qkv));
    EXPECT_EQ(qkv->shape, (std::vector<std::int64_t>{32, 8 + 8 + 8}));
    EXPECT_EQ(qkv->global_index(0), 24);
    EXPECT_EQ(qkv->global_index(8), 32 + 8);
    EXPECT_EQ(qkv->global_index(16), 48 + 8);
    const std::vector<SlabMap> slabs = qkv->slabs();
    ASSERT_EQ(slabs.size(), 3u);
    EXPECT_TRUE(slabs[0].first_copy);
    EXPECT_FALSE(slabs[1].first_copy);
    EXPECT_EQ(slabs[1].copies, 2);
    EXPECT_EQ(qkv->runs(slabs[1]).size(), 32u);  // a row's 8 columns, 24 apart
    EXPECT_EQ(qkv->runs(slabs[1])[1], (std::pair<std::int64_t, std::int64_t>{24 + 8, 24 + 16}));
  }
}

}  // namespace
}  // namespace lamina::test
