#include "lamina/io/token_dataset.hpp"

#include <glob.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/random.hpp"

namespace lamina {

int token_type_size(TokenType t) {
  switch (t) {
    case TokenType::u8:
    case TokenType::i8: return 1;
    case TokenType::i16:
    case TokenType::u16: return 2;
    case TokenType::i32:
    case TokenType::u32: return 4;
    case TokenType::i64: return 8;
  }
  return 1;
}

namespace {

const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::u8: return "uint8";
    case TokenType::i8: return "int8";
    case TokenType::i16: return "int16";
    case TokenType::u16: return "uint16";
    case TokenType::i32: return "int32";
    case TokenType::u32: return "uint32";
    case TokenType::i64: return "int64";
  }
  return "?";
}

template <class T>
T load_le(const std::uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));  // x86, ARM and Power LE: the files are little-endian
  return v;
}

std::int64_t token_at(const std::uint8_t* p, TokenType t) {
  switch (t) {
    case TokenType::u8: return *p;
    case TokenType::i8: return static_cast<std::int8_t>(*p);
    case TokenType::i16: return load_le<std::int16_t>(p);
    case TokenType::u16: return load_le<std::uint16_t>(p);
    case TokenType::i32: return load_le<std::int32_t>(p);
    case TokenType::u32: return load_le<std::uint32_t>(p);
    case TokenType::i64: return load_le<std::int64_t>(p);
  }
  return 0;
}

std::string count_str(std::int64_t n) { return strprintf("%lld", static_cast<long long>(n)); }

}  // namespace

FileTokenDataset::FileTokenDataset(std::vector<TokenRun> runs, std::int64_t vocab, std::string description)
    : runs_(std::move(runs)), vocab_(vocab), description_(std::move(description)) {
  for (const auto& r : runs_) {
    starts_.push_back(total_);
    total_ += r.tokens;
  }
}

std::string FileTokenDataset::shrinkage() const {
  const MappedFile* last = nullptr;
  for (const TokenRun& run : runs_) {
    if (run.file.get() == last) continue;  // runs of one file are neighbours
    last = run.file.get();
    if (std::string what = last->shrinkage(); !what.empty()) return what;
  }
  return "";
}

void FileTokenDataset::read(std::int64_t start, std::int64_t count, std::int32_t* out) const {
  if (start < 0 || count < 0 || start + count > total_) {
    throw std::out_of_range(strprintf("token range [%lld, %lld) outside a dataset of %lld tokens",
                                      static_cast<long long>(start), static_cast<long long>(start + count),
                                      static_cast<long long>(total_)));
  }
  std::size_t r = static_cast<std::size_t>(std::upper_bound(starts_.begin(), starts_.end(), start) - starts_.begin() - 1);
  std::int64_t pos = start, done = 0;
  while (done < count) {
    while (pos >= starts_[r] + runs_[r].tokens) ++r;
    const TokenRun& run = runs_[r];
    const int w = token_type_size(run.type);
    const std::int64_t n = std::min(count - done, starts_[r] + run.tokens - pos);
    const std::int64_t first = run.byte_offset + (pos - starts_[r]) * w;
    const std::uint8_t* p = run.file->data() + first;
    std::int64_t bad = -1, bad_token = 0;  // the first token outside the vocabulary
    auto convert = [&] {
      for (std::int64_t i = 0; i < n; ++i) {
        const std::int64_t tok = token_at(p + i * w, run.type);
        if (tok < 0 || tok >= vocab_) {
          bad = i;
          bad_token = tok;
          return;
        }
        out[done + i] = static_cast<std::int32_t>(tok);
      }
    };
    run.file->read_checked(first + n * w, convert);
    if (bad >= 0) {
      throw InputError(strprintf("%s: byte offset %lld: token id %lld is outside the vocabulary [0, %lld) "
                                 "(model.vocab_size too small, or the file is not %s tokens)",
                                 run.file->path().c_str(), static_cast<long long>(first + bad * w),
                                 static_cast<long long>(bad_token), static_cast<long long>(vocab_),
                                 token_type_name(run.type)));
    }
    done += n;
    pos += n;
  }
}

void SyntheticTokenDataset::read(std::int64_t start, std::int64_t count, std::int32_t* out) const {
  for (std::int64_t i = 0; i < count; ++i) {
    out[i] = static_cast<std::int32_t>(hash_combine(seed_, static_cast<std::uint64_t>(start + i)) %
                                       static_cast<std::uint64_t>(vocab_));
  }
}

std::string SyntheticTokenDataset::describe() const {
  return strprintf("synthetic uniform tokens (vocab %lld)", static_cast<long long>(vocab_));
}

std::unique_ptr<TokenDataset> open_text_dataset(const std::vector<std::string>& paths, std::int64_t vocab) {
  std::vector<TokenRun> runs;
  std::int64_t total = 0;
  for (const auto& p : paths) {
    auto f = std::make_shared<MappedFile>(p);
    if (f->size() == 0) throw InputError(p + ": the file is empty");
    total += f->size();
    runs.push_back({f, 0, f->size(), TokenType::u8});
  }
  return std::make_unique<FileTokenDataset>(
      std::move(runs), vocab, strprintf("text, %zu file(s), %s bytes", paths.size(), count_str(total).c_str()));
}

std::unique_ptr<TokenDataset> open_llmc_dataset(const std::vector<std::string>& paths, std::int64_t vocab) {
  constexpr std::int64_t kHeaderBytes = 256 * 4;
  std::vector<TokenRun> runs;
  std::int64_t total = 0;
  for (const auto& p : paths) {
    auto f = std::make_shared<MappedFile>(p);
    if (f->size() < kHeaderBytes) {
      throw InputError(strprintf("%s: byte offset %lld: file ends inside the 1024-byte llm.c header (truncated?)",
                                 p.c_str(), static_cast<long long>(f->size())));
    }
    const std::int32_t magic = load_le<std::int32_t>(f->data());
    const std::int32_t version = load_le<std::int32_t>(f->data() + 4);
    const std::int32_t count = load_le<std::int32_t>(f->data() + 8);
    if (magic != 20240520 && magic != 20240801) {
      throw InputError(strprintf("%s: byte offset 0: magic %d is not an llm.c token file (20240520 GPT-2, "
                                 "20240801 Llama-3)",
                                 p.c_str(), magic));
    }
    TokenType type;
    if (version == 1) {
      type = TokenType::u16;
    } else if (version == 7) {
      type = TokenType::u32;
    } else {
      throw InputError(strprintf("%s: byte offset 4: unsupported llm.c version %d (1 = uint16, 7 = uint32 tokens)",
                                 p.c_str(), version));
    }
    if (count <= 0) throw InputError(strprintf("%s: byte offset 8: token count %d must be positive", p.c_str(), count));
    const std::int64_t expect = kHeaderBytes + static_cast<std::int64_t>(count) * token_type_size(type);
    if (f->size() != expect) {
      throw InputError(strprintf("%s: byte offset %lld: the header promises %d tokens (%lld bytes in all) but the "
                                 "file has %lld bytes (%s)",
                                 p.c_str(), static_cast<long long>(std::min(f->size(), expect)), count,
                                 static_cast<long long>(expect), static_cast<long long>(f->size()),
                                 f->size() < expect ? "truncated" : "trailing bytes"));
    }
    total += count;
    runs.push_back({f, kHeaderBytes, count, type});
  }
  return std::make_unique<FileTokenDataset>(
      std::move(runs), vocab, strprintf("llm.c, %zu shard(s), %s tokens", paths.size(), count_str(total).c_str()));
}

std::unique_ptr<TokenDataset> open_megatron_dataset(const std::vector<std::string>& prefixes, std::int64_t vocab) {
  std::vector<TokenRun> runs;
  std::int64_t total = 0, documents = 0;
  for (const auto& prefix : prefixes) {
    const std::string idx_path = prefix + ".idx", bin_path = prefix + ".bin";
    MappedFile idx(idx_path);
    auto bin = std::make_shared<MappedFile>(bin_path);
    auto need = [&](std::int64_t end, const char* what) {
      if (idx.size() < end) {
        throw InputError(strprintf("%s: byte offset %lld: file ends inside %s (truncated?)", idx_path.c_str(),
                                   static_cast<long long>(idx.size()), what));
      }
    };
    need(34, "the header");
    static const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', '\0', '\0'};
    if (std::memcmp(idx.data(), magic, 9) != 0) {
      throw InputError(idx_path + ": byte offset 0: not a Megatron index (magic \"MMIDIDX\\0\\0\" missing)");
    }
    const std::uint64_t version = load_le<std::uint64_t>(idx.data() + 9);
    if (version != 1) {
      throw InputError(strprintf("%s: byte offset 9: index version %llu, only version 1 is supported",
                                 idx_path.c_str(), static_cast<unsigned long long>(version)));
    }
    TokenType type;
    switch (idx.data()[17]) {
      case 1: type = TokenType::u8; break;
      case 2: type = TokenType::i8; break;
      case 3: type = TokenType::i16; break;
      case 4: type = TokenType::i32; break;
      case 5: type = TokenType::i64; break;
      case 8: type = TokenType::u16; break;
      case 6:
      case 7:
        throw InputError(idx_path + ": byte offset 17: floating-point token dtype; token ids must be integers");
      default:
        throw InputError(strprintf("%s: byte offset 17: unknown dtype code %d", idx_path.c_str(), idx.data()[17]));
    }
    const std::int64_t S = static_cast<std::int64_t>(load_le<std::uint64_t>(idx.data() + 18));
    const std::int64_t D = static_cast<std::int64_t>(load_le<std::uint64_t>(idx.data() + 26));
    if (S < 0 || D < 1 || S > (idx.size() / 12) || D > idx.size() / 8) {
      throw InputError(strprintf("%s: byte offset 18: implausible counts (%lld sequences, %lld document entries) "
                                 "for a %lld-byte index",
                                 idx_path.c_str(), static_cast<long long>(S), static_cast<long long>(D),
                                 static_cast<long long>(idx.size())));
    }
    need(34 + 12 * S + 8 * D, "the sequence and document tables");
    const int w = token_type_size(type);
    const std::uint8_t* lengths = idx.data() + 34;
    const std::uint8_t* pointers = lengths + 4 * S;
    std::int64_t expect_ptr = 0, tokens = 0;
    for (std::int64_t i = 0; i < S; ++i) {
      const std::int32_t len = load_le<std::int32_t>(lengths + 4 * i);
      const std::int64_t ptr = load_le<std::int64_t>(pointers + 8 * i);
      if (len < 0) {
        throw InputError(strprintf("%s: byte offset %lld: negative length of sequence %lld", idx_path.c_str(),
                                   static_cast<long long>(34 + 4 * i), static_cast<long long>(i)));
      }
      if (ptr != expect_ptr) {
        throw InputError(strprintf("%s: byte offset %lld: sequence %lld starts at byte %lld of the .bin, expected "
                                   "%lld (sequences must be stored back to back, as Megatron writes them)",
                                   idx_path.c_str(), static_cast<long long>(34 + 4 * S + 8 * i),
                                   static_cast<long long>(i), static_cast<long long>(ptr),
                                   static_cast<long long>(expect_ptr)));
      }
      expect_ptr += static_cast<std::int64_t>(len) * w;
      tokens += len;
    }
    if (bin->size() < expect_ptr) {
      throw InputError(strprintf("%s: byte offset %lld: the index describes %lld bytes of tokens but the file has "
                                 "%lld (truncated?)",
                                 bin_path.c_str(), static_cast<long long>(bin->size()),
                                 static_cast<long long>(expect_ptr), static_cast<long long>(bin->size())));
    }
    if (tokens == 0) throw InputError(idx_path + ": the dataset holds no tokens");
    total += tokens;
    documents += D - 1;
    runs.push_back({bin, 0, tokens, type});
  }
  return std::make_unique<FileTokenDataset>(
      std::move(runs), vocab,
      strprintf("megatron, %zu prefix(es), %s documents, %s tokens", prefixes.size(), count_str(documents).c_str(),
                count_str(total).c_str()));
}

std::vector<std::string> expand_paths(const std::vector<std::string>& patterns) {
  std::vector<std::string> out;
  for (const auto& p : patterns) {
    // A file named as it is (`run[1].bin`) is that file, whatever its name holds.
    std::error_code ec;
    if (p.find_first_of("*?[") == std::string::npos || std::filesystem::exists(p, ec)) {
      out.push_back(p);
      continue;
    }
    glob_t g{};
    const int rc = ::glob(p.c_str(), 0, nullptr, &g);
    if (rc != 0) {
      ::globfree(&g);
      throw InputError("no data file matches '" + p + "'" +
                       (p.find('[') != std::string::npos
                            ? " (a shell pattern, where '[...]' matches one of the characters inside)"
                            : ""));
    }
    for (std::size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);  // glob sorts
    ::globfree(&g);
  }
  return out;
}

std::unique_ptr<TokenDataset> open_dataset(const DataConfig& data, std::int64_t vocab, std::uint64_t seed) {
  const std::vector<std::string> paths = expand_paths(data.paths);
  switch (data.format) {
    case DataFormat::text: return open_text_dataset(paths, vocab);
    case DataFormat::llmc: return open_llmc_dataset(paths, vocab);
    case DataFormat::megatron: return open_megatron_dataset(paths, vocab);
    case DataFormat::synthetic: return std::make_unique<SyntheticTokenDataset>(vocab, seed);
  }
  throw std::logic_error("unknown data format");
}

double unigram_entropy(const TokenDataset& ds, std::int64_t vocab, std::int64_t max_tokens) {
  const std::int64_t n = std::min(ds.num_tokens(), max_tokens);
  std::vector<std::int64_t> counts(static_cast<std::size_t>(vocab), 0);
  std::vector<std::int32_t> chunk(1 << 16);
  for (std::int64_t s = 0; s < n; s += static_cast<std::int64_t>(chunk.size())) {
    const std::int64_t c = std::min<std::int64_t>(static_cast<std::int64_t>(chunk.size()), n - s);
    ds.read(s, c, chunk.data());
    for (std::int64_t i = 0; i < c; ++i) ++counts[static_cast<std::size_t>(chunk[i])];
  }
  double h = 0.0;
  for (const auto c : counts) {
    if (c > 0) {
      const double p = static_cast<double>(c) / static_cast<double>(n);
      h -= p * std::log(p);
    }
  }
  return h;
}

}  // namespace lamina
