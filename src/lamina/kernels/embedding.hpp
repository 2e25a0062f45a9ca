#pragma once
// Token and position embeddings (GPT-2 "encoder"): out[b,t,:] = wte[tok[b,t],:] + wpe[t,:].
// The token table may be one vocabulary shard [vocab_begin, vocab_begin + V) of a larger
// table (Megatron's vocabulary-parallel embedding): tokens outside it contribute zero,
// and tensor parallelism sums the shards' outputs.
#include <algorithm>
#include <type_traits>

#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/context_chunks.hpp"

namespace lamina {

// W: how the table is stored (float, or std::uint16_t for bf16).
template <class Exec, class W>
struct TokenEmbeddingForward {
  Mat<Exec> out;
  Tokens<Exec> tokens;
  Kokkos::View<const W**, Kokkos::LayoutRight, typename Exec::memory_space> wte;
  std::int64_t vocab_begin, V;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t c) const {
    const std::int64_t row = tokens(i) - vocab_begin;
    out(i, c) = (row >= 0 && row < V) ? widen(wte(row, c)) : 0.0f;
  }
};

// out: (B*T, C) overwritten; tokens: (B*T); wte: (V, C), rows for ids vocab_begin..
template <class Exec>
void token_embedding_forward(const Exec& exec, const Mat<Exec>& out, const Tokens<Exec>& tokens,
                             const MatRefArg<Exec>& wte, std::int64_t vocab_begin) {
  const std::int64_t N = static_cast<std::int64_t>(out.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(out.extent(1));
  const RowMajor<Exec, 2> all(exec, {0, 0}, {N, C});
  if (wte.bf16()) {
    Kokkos::parallel_for("lamina::token_embedding_forward", all,
                         TokenEmbeddingForward<Exec, std::uint16_t>{out, tokens, wte.b16, vocab_begin, wte.rows()});
  } else {
    Kokkos::parallel_for("lamina::token_embedding_forward", all,
                         TokenEmbeddingForward<Exec, float>{out, tokens, wte.f32, vocab_begin, wte.rows()});
  }
}

// A micro-batch's positions grouped by token id, for the token embedding's backward:
// `order` lists the positions sorted by token (in position order within a token), run r
// holds positions order[starts[r]] .. order[starts[r + 1] - 1], all of one token.
template <class Exec>
struct TokenRuns {
  Tokens<Exec> order, starts;  // (N), (runs + 1)
  std::int64_t runs = 0;
};

// Fills order (n) and starts (n + 1) from n token ids on the host; returns the runs.
inline std::int64_t build_token_runs(const std::int32_t* tokens, std::int64_t n, std::int32_t* order,
                                     std::int32_t* starts) {
  for (std::int64_t i = 0; i < n; ++i) order[i] = static_cast<std::int32_t>(i);
  std::stable_sort(order, order + n, [tokens](std::int32_t a, std::int32_t b) { return tokens[a] < tokens[b]; });
  std::int64_t runs = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    if (i == 0 || tokens[order[i]] != tokens[order[i - 1]]) starts[runs++] = static_cast<std::int32_t>(i);
  }
  starts[runs] = static_cast<std::int32_t>(n);
  return runs;
}

template <class Exec>
struct TokenEmbeddingBackward {
  Mat<Exec> dwte;
  ConstMat<Exec> dout;
  Tokens<Exec> tokens, order, starts;
  std::int64_t vocab_begin, V, C;
  template <class Member>
  KOKKOS_INLINE_FUNCTION void operator()(const Member& team) const {
    const std::int64_t r = team.league_rank();
    const std::int64_t begin = starts(r), end = starts(r + 1);
    const std::int64_t row = tokens(order(begin)) - vocab_begin;
    if (row < 0 || row >= V) return;  // another vocabulary shard's token
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](std::int64_t c) {
      float s = 0.0f;
      for (std::int64_t j = begin; j < end; ++j) s += dout(order(j), c);
      dwte(row, c) += s;
    });
  }
};

// dwte: (V, C) +=; dout: (B*T, C); runs: the positions of `tokens` grouped by token.
// One team per token that occurs, its threads over the channels, each summing the token's
// positions in order: every row of dwte is written by one team, no atomics, so repeated
// tokens sum in a fixed order and the result is bitwise reproducible.
template <class Exec>
void token_embedding_backward(const Exec& exec, const Mat<Exec>& dwte, const ConstMat<Exec>& dout,
                              const Tokens<Exec>& tokens, const TokenRuns<Exec>& runs, std::int64_t vocab_begin) {
  if (runs.runs == 0) return;
  const std::int64_t C = static_cast<std::int64_t>(dout.extent(1));
  const std::int64_t V = static_cast<std::int64_t>(dwte.extent(0));
  Kokkos::parallel_for("lamina::token_embedding_backward",
                       Kokkos::TeamPolicy<Exec>(exec, static_cast<int>(runs.runs), Kokkos::AUTO),
                       TokenEmbeddingBackward<Exec>{dwte, dout, tokens, runs.order, runs.starts, vocab_begin, V, C});
}

template <class Exec, class W>
struct PositionEmbeddingForward {
  Mat<Exec> out;
  Kokkos::View<const W**, Kokkos::LayoutRight, typename Exec::memory_space> wpe;
  ContextChunks where;
  std::int64_t first_row;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t c) const {
    out(i, c) += widen(wpe(where.position((first_row + i) % where.rows()), c));
  }
};

// out: rows [first_row, first_row + rows) of a (B*R, C) matrix of sequences of R rows at the
// positions `where` says (all of it, or a sequence-parallel rank's share), +=; wpe: (>=T, C)
template <class Exec>
void position_embedding_forward(const Exec& exec, const Mat<Exec>& out, const MatRefArg<Exec>& wpe,
                                const ContextChunks& where, std::int64_t first_row = 0) {
  const std::int64_t N = static_cast<std::int64_t>(out.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(out.extent(1));
  const RowMajor<Exec, 2> all(exec, {0, 0}, {N, C});
  if (wpe.bf16()) {
    Kokkos::parallel_for("lamina::position_embedding_forward", all,
                         PositionEmbeddingForward<Exec, std::uint16_t>{out, wpe.b16, where, first_row});
  } else {
    Kokkos::parallel_for("lamina::position_embedding_forward", all,
                         PositionEmbeddingForward<Exec, float>{out, wpe.f32, where, first_row});
  }
}

// out(i, c) = wte[tokens(i)] + wpe[position of row first_row + i] (no wpe: rotary
// positions) in one pass, written as stored: the fp32 sum the two passes above give, rounded
// once where out is bf16 (no pass of its own rounds it). For a table no other rank shares: a
// vocabulary split sums the ranks' lookups in fp32 before the positions are added.
template <class Exec, class O, class W, class P>
struct EmbeddingForward {
  MatOf<Exec, O> out;
  Tokens<Exec> tokens;
  Kokkos::View<const W**, Kokkos::LayoutRight, typename Exec::memory_space> wte;
  Kokkos::View<const P**, Kokkos::LayoutRight, typename Exec::memory_space> wpe;
  ContextChunks where;
  std::int64_t first_row, vocab_begin, V;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t c) const {
    const std::int64_t row = tokens(i) - vocab_begin;
    float x = (row >= 0 && row < V) ? widen(wte(row, c)) : 0.0f;
    if (wpe.data() != nullptr) x += widen(wpe(where.position((first_row + i) % where.rows()), c));
    put(out(i, c), x);
  }
  // Row i on a host thread, the same sums: the token and the position looked up once, and a
  // loop per case over the columns, which vectorizes (element by element the lookups and the
  // branch came with every value: three times the time of the two passes it replaced).
  void row(std::int64_t i) const {
    const std::int64_t r = tokens(i) - vocab_begin, C = static_cast<std::int64_t>(out.extent(1));
    const W* t = r >= 0 && r < V ? &wte(r, 0) : nullptr;
    const P* p = wpe.data() != nullptr ? &wpe(where.position((first_row + i) % where.rows()), 0) : nullptr;
    O* o = &out(i, 0);
    if (t != nullptr && p != nullptr) {
      for (std::int64_t c = 0; c < C; ++c) put(o[c], widen(t[c]) + widen(p[c]));
    } else if (t != nullptr) {
      for (std::int64_t c = 0; c < C; ++c) put(o[c], widen(t[c]));
    } else if (p != nullptr) {
      for (std::int64_t c = 0; c < C; ++c) put(o[c], 0.0f + widen(p[c]));
    } else {
      for (std::int64_t c = 0; c < C; ++c) put(o[c], 0.0f);
    }
  }
};

// out: (B*T, C) overwritten, fp32 or bf16 (OutV); tokens: (B*T); wte: (V, C), rows for ids
// vocab_begin..; wpe: as position_embedding_forward's, or empty.
template <class Exec, class OutV>
void embedding_forward(const Exec& exec, const OutV& out, const Tokens<Exec>& tokens, const MatRefArg<Exec>& wte,
                       const MatRefArg<Exec>& wpe, const ContextChunks& where, std::int64_t first_row,
                       std::int64_t vocab_begin) {
  using O = StoredType<OutV>;
  const std::int64_t N = static_cast<std::int64_t>(out.extent(0));
  const auto run = [&](const auto& t, const auto& p) {
    using W = StoredType<std::decay_t<decltype(t)>>;
    using P = StoredType<std::decay_t<decltype(p)>>;
    const EmbeddingForward<Exec, O, W, P> lookup{out, tokens, t, p, where, first_row, vocab_begin, wte.rows()};
    if constexpr (detail::kOnHost<Exec>) {
      Kokkos::parallel_for("lamina::embedding_forward", Range<Exec>(exec, 0, N),
                           detail::HostRows<EmbeddingForward<Exec, O, W, P>>{lookup});
    } else {
      Kokkos::parallel_for("lamina::embedding_forward",
                           RowMajor<Exec, 2>(exec, {0, 0}, {N, static_cast<std::int64_t>(out.extent(1))}), lookup);
    }
  };
  const auto with_positions = [&](const auto& t) {
    if (wpe.bf16()) {
      run(t, wpe.b16);
    } else {
      run(t, wpe.f32);
    }
  };
  if (wte.bf16()) {
    with_positions(wte.b16);
  } else {
    with_positions(wte.f32);
  }
}

template <class Exec>
struct PositionEmbeddingBackward {
  Mat<Exec> dwpe;
  ConstMat<Exec> dout;
  ContextChunks where;
  std::int64_t B;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t c) const {
    const std::int64_t R = where.rows();
    float s = 0.0f;
    for (std::int64_t b = 0; b < B; ++b) s += dout(b * R + t, c);
    dwpe(where.position(t), c) += s;
  }
};

// dwpe: (>=T, C) +=, at the positions of the rows `where` says, summed over the sequences of
// dout: (B*R, C), R rows each
template <class Exec>
void position_embedding_backward(const Exec& exec, const Mat<Exec>& dwpe, const ConstMat<Exec>& dout,
                                 const ContextChunks& where) {
  const std::int64_t N = static_cast<std::int64_t>(dout.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(dout.extent(1));
  const std::int64_t R = where.rows();
  Kokkos::parallel_for("lamina::position_embedding_backward", RowMajor<Exec, 2>(exec, {0, 0}, {R, C}),
                       PositionEmbeddingBackward<Exec>{dwpe, dout, where, N / R});
}

}  // namespace lamina
