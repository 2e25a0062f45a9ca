#include "lamina/core/deck.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "lamina/core/error.hpp"

namespace lamina::test {
namespace {

const char* kGood = R"(
[model]
layers = 2
d_model = 64
heads = 4
seq_len = 32

[data]
format = "text"
path = "corpus.txt"
batch_size = 8
micro_batch_size = 4

[train]
steps = 100

[optimizer]
lr = 1e-3
)";

// The message of the InputError that parsing `text` (with overrides) throws.
std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  try {
    parse_deck(text, "deck.toml", sets);
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string with(const std::string& from, const std::string& to) {
  std::string s = kGood;
  const auto pos = s.find(from);
  EXPECT_NE(pos, std::string::npos) << from;
  return s.replace(pos, from.size(), to);
}

TEST(Deck, GoodDeckResolvesDefaults) {
  const Deck d = parse_deck(kGood, "runs/my-deck.toml");
  EXPECT_EQ(d.model.layers, 2);
  EXPECT_EQ(d.model.vocab_size, 256);  // byte vocabulary for text data
  EXPECT_FALSE(d.model.attention.has_value());  // the backend's fastest
  EXPECT_EQ(d.data.micro_batch_size, 4);
  EXPECT_EQ(d.data.paths, std::vector<std::string>{"corpus.txt"});
  EXPECT_DOUBLE_EQ(d.optimizer.lr, 1e-3);
  EXPECT_DOUBLE_EQ(d.optimizer.min_lr, 1e-4);
  EXPECT_EQ(d.output.dir, "runs/my-deck");
  EXPECT_EQ(d.checkpoint.dir, "runs/my-deck/checkpoints");
  EXPECT_NE(d.resolved_toml.find("lr = 0.001"), std::string::npos) << d.resolved_toml;
  EXPECT_NE(d.resolved_toml.find("[parallel]"), std::string::npos);
  // The resolved deck is itself a valid deck that resolves to the same thing.
  EXPECT_EQ(parse_deck(d.resolved_toml, "resolved.toml").resolved_toml, d.resolved_toml);
}

TEST(Deck, SetOverridesAnyKeyWithTypedValues) {
  const Deck d = parse_deck(kGood, "deck.toml",
                            {"optimizer.lr=3e-4", "data.shuffle=false", "output.dir=elsewhere", "memory.host_budget=2GiB",
                             "checkpoint.resume = latest", "data.path=[\"a\", \"b\"]", "model.attention=fused"});
  EXPECT_DOUBLE_EQ(d.optimizer.lr, 3e-4);
  EXPECT_FALSE(d.data.shuffle);
  EXPECT_EQ(d.output.dir, "elsewhere");
  EXPECT_EQ(d.memory.host_budget, 2LL << 30);
  EXPECT_EQ(d.checkpoint.resume, "latest");
  EXPECT_EQ(d.data.paths.size(), 2u);
  EXPECT_EQ(d.model.attention, AttentionProducts::fused);
}

// model.arch is a preset of the block's parts; each part overrides it on its own, and GPT-2
// decks resolve to GPT-2's block as before.
TEST(Deck, ArchIsAPresetOfTheBlocksParts) {
  const Deck gpt2 = parse_deck(kGood, "deck.toml");
  EXPECT_EQ(gpt2.model.parts.norm, NormKind::layernorm);
  EXPECT_EQ(gpt2.model.parts.position, PositionKind::learned);
  EXPECT_EQ(gpt2.model.parts.mlp, MlpKind::gelu);
  EXPECT_TRUE(gpt2.model.parts.bias);
  EXPECT_EQ(gpt2.model.key_value_heads(), 4);
  EXPECT_EQ(gpt2.model.mlp_hidden(), 256);

  const Deck llama = parse_deck(kGood, "deck.toml", {"model.arch=llama", "model.kv_heads=2", "model.rope_theta=5e5"});
  const BlockParts& p = llama.model.parts;
  EXPECT_EQ(p.norm, NormKind::rmsnorm);
  EXPECT_EQ(p.position, PositionKind::rotary);
  EXPECT_EQ(p.mlp, MlpKind::swiglu);
  EXPECT_FALSE(p.bias);
  EXPECT_DOUBLE_EQ(p.rope_theta, 5e5);
  EXPECT_EQ(llama.model.key_value_heads(), 2);
  EXPECT_EQ(llama.model.mlp_hidden(), 256);  // 8 x 64 / 3 = 170, rounded up to a multiple of 256
  EXPECT_EQ(parse_deck(llama.resolved_toml, "resolved.toml").resolved_toml, llama.resolved_toml);

  const Deck mixed = parse_deck(kGood, "deck.toml", {"model.arch=llama", "model.norm=layernorm", "model.ffn_hidden=96"});
  EXPECT_EQ(mixed.model.parts.norm, NormKind::layernorm);
  EXPECT_EQ(mixed.model.parts.position, PositionKind::rotary);
  EXPECT_EQ(mixed.model.mlp_hidden(), 96);
}

TEST(Deck, ParsesByteSizes) {
  std::int64_t b = 0;
  EXPECT_TRUE(parse_bytes("12GiB", b));
  EXPECT_EQ(b, 12LL << 30);
  EXPECT_TRUE(parse_bytes("1.5 kB", b));
  EXPECT_EQ(b, 1500);
  EXPECT_TRUE(parse_bytes("4096", b));
  EXPECT_EQ(b, 4096);
  EXPECT_FALSE(parse_bytes("12 parsecs", b));
  EXPECT_FALSE(parse_bytes("-1GB", b));
  EXPECT_FALSE(parse_bytes("", b));
}

struct BadDeck {
  const char* name;
  std::string text;
  std::vector<std::string> sets;
  std::vector<std::string> expect;  // substrings of the message
};

void PrintTo(const BadDeck& b, std::ostream* os) { *os << b.name; }

class BadDecks : public ::testing::TestWithParam<BadDeck> {};

TEST_P(BadDecks, AreRejectedWithLocationAndHint) {
  const BadDeck& b = GetParam();
  const std::string msg = error_of(b.text, b.sets);
  for (const auto& e : b.expect) EXPECT_NE(msg.find(e), std::string::npos) << "expected '" << e << "' in:\n" << msg;
}

INSTANTIATE_TEST_SUITE_P(
    Deck, BadDecks,
    ::testing::Values(
        BadDeck{"typo_in_key", with("lr = 1e-3", "lr_rate = 1e-3"), {},
                {"deck.toml:18:1: unknown key 'lr_rate' in optimizer (did you mean 'lr'?)"}},
        BadDeck{"typo_in_section", with("[optimizer]", "[optimiser]"), {},
                {"deck.toml:17:2: unknown section 'optimiser' (did you mean 'optimizer'?)"}},
        BadDeck{"key_in_wrong_section", with("steps = 100", "steps = 100\nlr = 0.1"), {},
                {"deck.toml:16:1: unknown key 'lr' in train (it belongs in [optimizer])"}},
        BadDeck{"string_for_integer", with("layers = 2", "layers = \"two\""), {},
                {"deck.toml:3:10: model.layers must be an integer, got a string (\"two\")"}},
        BadDeck{"float_for_integer", with("layers = 2", "layers = 2.5"), {},
                {"deck.toml:3:10: model.layers must be an integer, got a float (2.5)"}},
        BadDeck{"zero_layers", with("layers = 2", "layers = 0"), {},
                {"deck.toml:3:10: model.layers: 0 is out of range: must be in [1, 100000]"}},
        BadDeck{"negative_lr", with("lr = 1e-3", "lr = -1e-3"), {}, {"optimizer.lr: -0.001 is out of range: must be > 0"}},
        BadDeck{"beta_above_one", with("lr = 1e-3", "lr = 1e-3\nbeta2 = 1.5"), {},
                {"deck.toml:19:9: optimizer.beta2: 1.5 is out of range: must be in [0, 1)"}},
        // AdamW's bias correction divides by 1 - beta^t: 1 trained into NaN.
        BadDeck{"beta_of_one", with("lr = 1e-3", "lr = 1e-3\nbeta1 = 1.0"), {},
                {"deck.toml:19:9: optimizer.beta1: 1 is out of range: must be in [0, 1)"}},
        BadDeck{"init_std_above_one", kGood, {"model.init_std=2"},
                {"--set model.init_std=2: model.init_std: 2 is out of range: must be in (0, 1]"}},
        BadDeck{"heads_do_not_divide", with("heads = 4", "heads = 5"), {},
                {"deck.toml:5:9: model.heads: d_model (64) must be divisible by heads (5)"}},
        BadDeck{"missing_required", with("steps = 100", ""), {}, {"missing required key train.steps (an integer)"}},
        BadDeck{"kv_heads_do_not_divide_heads", kGood, {"model.kv_heads=3"},
                {"--set model.kv_heads=3: model.kv_heads: heads (4) must be a multiple of kv_heads (3)"}},
        BadDeck{"arch_typo_gets_hint", kGood, {"model.arch=lama"},
                {"model.arch: 'lama' is not one of 'gpt2', 'llama' (did you mean 'llama'?)"}},
        BadDeck{"rotary_needs_an_even_head_width", with("d_model = 64", "d_model = 60"), {"model.position=rotary"},
                {"model.position: rotary positions turn pairs of a head's features; the head width d_model / heads "
                 "= 15 is odd"}},
        BadDeck{"rope_frequency_bounds_crossed", kGood,
                {"model.rope_scaling=8", "model.rope_low_freq_factor=4", "model.rope_high_freq_factor=2"},
                {"model.rope_high_freq_factor: 2 must exceed model.rope_low_freq_factor (4)"}},
        BadDeck{"unknown_format", with("format = \"text\"", "format = \"parquet\""), {},
                {"data.format: 'parquet' is not one of 'text', 'megatron', 'llmc', 'synthetic'"}},
        BadDeck{"choice_typo_gets_hint", with("lr = 1e-3", "lr = 1e-3\nschedule = \"cosin\""), {},
                {"'cosin' is not one of 'constant', 'cosine' (did you mean 'cosine'?)"}},
        BadDeck{"attention_typo_gets_hint", with("seq_len = 32", "seq_len = 32\nattention = \"flash\""), {},
                {"model.attention: 'flash' is not one of 'auto', 'in_place', 'staged', 'fused'"}},
        BadDeck{"small_vocab_for_bytes", with("seq_len = 32", "seq_len = 32\nvocab_size = 100"), {},
                {"model.vocab_size: 100 is smaller than 256, the byte vocabulary"}},
        BadDeck{"bad_budget", with("lr = 1e-3", "lr = 1e-3\n[memory]\ndevice_budget = \"lots\""), {},
                {"memory.device_budget must be a byte count"}},
        BadDeck{"warmup_longer_than_run", with("lr = 1e-3", "lr = 1e-3\nwarmup_steps = 500"), {},
                {"optimizer.warmup_steps: 500 exceeds train.steps (100); "
                 "set optimizer.warmup_steps <= 100 or raise train.steps"}},
        BadDeck{"trace_after_the_run", kGood, {"output.trace_step=101"},
                {"output.trace_step: step 101 is after the last one (train.steps = 100); set output.trace_step <= 100"}},
        BadDeck{"min_lr_above_lr", with("lr = 1e-3", "lr = 1e-3\nmin_lr = 1e-2"), {},
                {"optimizer.min_lr: 0.01 exceeds optimizer.lr (0.001)"}},
        BadDeck{"section_not_a_table", with("[model]\nlayers = 2\nd_model = 64\nheads = 4\nseq_len = 32\n", "model = 3\n"), {},
                {"deck.toml:2:9: 'model' must be a table ([model]), got an integer (3)"}},
        BadDeck{"toml_syntax_error", with("layers = 2", "layers = = 2"), {}, {"deck.toml:3:", "TOML syntax error"}},
        BadDeck{"set_unknown_key", kGood, {"optimizer.lr_rate=1"},
                {"--set optimizer.lr_rate=1: unknown key 'lr_rate' in optimizer (did you mean 'lr'?)"}},
        BadDeck{"set_wrong_type", kGood, {"model.layers=many"},
                {"--set model.layers=many: model.layers must be an integer, got a string (\"many\")"}},
        BadDeck{"set_malformed", kGood, {"lr=1"}, {"--set lr=1: expected section.key=value"}},
        BadDeck{"several_errors_at_once", with("heads = 4", "heads = 5\nlayerz = 3"), {},
                {"2 problems in the deck", "unknown key 'layerz' in model (did you mean 'layers'?)",
                 "must be divisible by heads"}},
        BadDeck{"zero_bad_stage", kGood + std::string("\n[parallel]\nzero = 4\n"), {},
                {"parallel.zero: 4 is out of range: must be in [0, 3]"}},
        BadDeck{"empty_path_list", with("path = \"corpus.txt\"", "path = []"), {}, {"data.path: the array is empty"}}),
    [](const ::testing::TestParamInfo<BadDeck>& info) { return std::string(info.param.name); });

TEST(Deck, MissingFileIsAnInputError) {
  try {
    load_deck("/nonexistent/deck.toml");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/deck.toml: cannot open"), std::string::npos);
  }
}

TEST(Deck, DirectoryIsAnInputErrorSayingSo) {
  const std::string dir = ::testing::TempDir();
  try {
    load_deck(dir);
    FAIL();
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(dir + ": is a directory, not a deck file"), std::string::npos) << e.what();
  }
}

// The README's deck table lists every key the parser accepts, and no other: the table is
// the rows of "## Input decks" whose first cell names keys (`section.key`, then `key`s of
// the same section).
TEST(Deck, TheReadmeTableListsEveryKeyAndNoOther) {
  std::ifstream in(std::string(LAMINA_SOURCE_DIR) + "/README.md");
  std::string line;
  bool inside = false;
  std::set<std::string> documented;
  while (std::getline(in, line)) {
    if (line.rfind("## ", 0) == 0) inside = line == "## Input decks";
    if (!inside || line.rfind("| `", 0) != 0) continue;
    const std::string cell = line.substr(2, line.find('|', 2) - 2);
    std::string section;
    for (std::size_t at = cell.find('`'); at != std::string::npos; at = cell.find('`', cell.find('`', at + 1) + 1)) {
      const std::string name = cell.substr(at + 1, cell.find('`', at + 1) - at - 1);
      const std::size_t dot = name.find('.');
      if (dot != std::string::npos) section = name.substr(0, dot);
      documented.insert(dot != std::string::npos ? name : section + "." + name);
    }
  }
  const std::vector<std::string> keys = deck_keys();
  const std::set<std::string> parsed(keys.begin(), keys.end());
  for (const auto& k : parsed) EXPECT_TRUE(documented.count(k)) << k << " is missing from the README's deck table";
  for (const auto& k : documented) EXPECT_TRUE(parsed.count(k)) << k << " is in the README's deck table, not in the parser";
}

TEST(Deck, EditDistance) {
  EXPECT_EQ(edit_distance("lr", "lr"), 0u);
  EXPECT_EQ(edit_distance("optimiser", "optimizer"), 1u);
  EXPECT_EQ(edit_distance("", "abc"), 3u);
}

}  // namespace
}  // namespace lamina::test
