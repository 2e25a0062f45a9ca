#pragma once
// A corpus as one stream of token ids: documents concatenated in file order, as
// Megatron's GPTDataset and llm.c's loader see them. Readers for Megatron indexed
// datasets (.bin/.idx), llm.c token shards and raw bytes validate headers when opened
// and token ids when read; a bad file is an InputError naming the file and byte offset.
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/io/mapped_file.hpp"

namespace lamina {

enum class TokenType { u8, i8, i16, u16, i32, u32, i64 };
int token_type_size(TokenType t);

class TokenDataset {
 public:
  virtual ~TokenDataset() = default;
  virtual std::int64_t num_tokens() const = 0;
  // Copies tokens [start, start + count) into out; every id must be in [0, vocab).
  virtual void read(std::int64_t start, std::int64_t count, std::int32_t* out) const = 0;
  virtual std::string describe() const = 0;
  // "" while every file still holds what it held when opened; else the first that shrank.
  virtual std::string shrinkage() const { return ""; }
};

// One mapped file holding a run of fixed-width tokens.
struct TokenRun {
  std::shared_ptr<MappedFile> file;
  std::int64_t byte_offset = 0;  // of the first token in the file
  std::int64_t tokens = 0;
  TokenType type = TokenType::u16;
};

// Files concatenated. Shared by every on-disk format.
class FileTokenDataset : public TokenDataset {
 public:
  FileTokenDataset(std::vector<TokenRun> runs, std::int64_t vocab, std::string description);
  std::int64_t num_tokens() const override { return total_; }
  void read(std::int64_t start, std::int64_t count, std::int32_t* out) const override;
  std::string describe() const override { return description_; }
  std::string shrinkage() const override;

 private:
  std::vector<TokenRun> runs_;
  std::vector<std::int64_t> starts_;  // first token of each run in the stream
  std::int64_t total_ = 0;
  std::int64_t vocab_;
  std::string description_;
};

// Uniformly random tokens, a pure function of (seed, position): for benchmarks and tests.
class SyntheticTokenDataset : public TokenDataset {
 public:
  SyntheticTokenDataset(std::int64_t vocab, std::uint64_t seed) : vocab_(vocab), seed_(seed) {}
  std::int64_t num_tokens() const override { return std::int64_t(1) << 40; }
  void read(std::int64_t start, std::int64_t count, std::int32_t* out) const override;
  std::string describe() const override;

 private:
  std::int64_t vocab_;
  std::uint64_t seed_;
};

// Raw bytes of text files (vocabulary 256).
std::unique_ptr<TokenDataset> open_text_dataset(const std::vector<std::string>& paths, std::int64_t vocab);
// llm.c shards: 256 int32 header (magic 20240520 or 20240801, version 1 = uint16 or 7 = uint32, count), tokens.
std::unique_ptr<TokenDataset> open_llmc_dataset(const std::vector<std::string>& paths, std::int64_t vocab);
// Megatron indexed datasets, one per prefix P (P.idx + P.bin).
std::unique_ptr<TokenDataset> open_megatron_dataset(const std::vector<std::string>& prefixes, std::int64_t vocab);
// Expands shell patterns (fineweb_train_*.bin) in sorted order; a pattern that matches
// nothing is an InputError. Plain paths pass through unchanged.
std::vector<std::string> expand_paths(const std::vector<std::string>& patterns);
// Dispatches on data.format, after expanding patterns in data.path.
std::unique_ptr<TokenDataset> open_dataset(const DataConfig& data, std::int64_t vocab, std::uint64_t seed);

// Unigram entropy in nats of the first `max_tokens` tokens: the loss of the best model
// that ignores context, a yardstick for whether training learns anything beyond it.
double unigram_entropy(const TokenDataset& ds, std::int64_t vocab, std::int64_t max_tokens);

}  // namespace lamina
