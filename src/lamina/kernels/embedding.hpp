#pragma once
// Token and position embeddings (GPT-2 "encoder"): out[b,t,:] = wte[tok[b,t],:] + wpe[t,:].
// The token table may be one vocabulary shard [vocab_begin, vocab_begin + V) of a larger
// table (Megatron's vocabulary-parallel embedding): tokens outside it contribute zero,
// and tensor parallelism sums the shards' outputs.
#include "lamina/kernels/bf16.hpp"

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
  const Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>> all(exec, {0, 0}, {N, C});
  if (wte.bf16()) {
    Kokkos::parallel_for("lamina::token_embedding_forward", all,
                         TokenEmbeddingForward<Exec, std::uint16_t>{out, tokens, wte.b16, vocab_begin, wte.rows()});
  } else {
    Kokkos::parallel_for("lamina::token_embedding_forward", all,
                         TokenEmbeddingForward<Exec, float>{out, tokens, wte.f32, vocab_begin, wte.rows()});
  }
}

template <class Exec>
struct TokenEmbeddingBackward {
  Mat<Exec> dwte;
  ConstMat<Exec> dout;
  Tokens<Exec> tokens;
  std::int64_t vocab_begin, N, V;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t c) const {
    for (std::int64_t i = 0; i < N; ++i) {
      const std::int64_t row = tokens(i) - vocab_begin;
      if (row >= 0 && row < V) dwte(row, c) += dout(i, c);
    }
  }
};

// dwte: (V, C) +=; dout: (B*T, C).
// One thread per channel walks all rows in order: no atomics, so repeated tokens sum
// in a fixed order and the result is bitwise reproducible.
template <class Exec>
void token_embedding_backward(const Exec& exec, const Mat<Exec>& dwte, const ConstMat<Exec>& dout,
                              const Tokens<Exec>& tokens, std::int64_t vocab_begin) {
  const std::int64_t N = static_cast<std::int64_t>(dout.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(dout.extent(1));
  const std::int64_t V = static_cast<std::int64_t>(dwte.extent(0));
  Kokkos::parallel_for("lamina::token_embedding_backward", Range<Exec>(exec, 0, C),
                       TokenEmbeddingBackward<Exec>{dwte, dout, tokens, vocab_begin, N, V});
}

template <class Exec, class W>
struct PositionEmbeddingForward {
  Mat<Exec> out;
  Kokkos::View<const W**, Kokkos::LayoutRight, typename Exec::memory_space> wpe;
  std::int64_t T;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t i, std::int64_t c) const { out(i, c) += widen(wpe(i % T, c)); }
};

// out: (B*T, C) +=; wpe: (>=T, C)
template <class Exec>
void position_embedding_forward(const Exec& exec, const Mat<Exec>& out, const MatRefArg<Exec>& wpe, std::int64_t T) {
  const std::int64_t N = static_cast<std::int64_t>(out.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(out.extent(1));
  const Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>> all(exec, {0, 0}, {N, C});
  if (wpe.bf16()) {
    Kokkos::parallel_for("lamina::position_embedding_forward", all,
                         PositionEmbeddingForward<Exec, std::uint16_t>{out, wpe.b16, T});
  } else {
    Kokkos::parallel_for("lamina::position_embedding_forward", all, PositionEmbeddingForward<Exec, float>{out, wpe.f32, T});
  }
}

template <class Exec>
struct PositionEmbeddingBackward {
  Mat<Exec> dwpe;
  ConstMat<Exec> dout;
  std::int64_t T, B;
  KOKKOS_INLINE_FUNCTION void operator()(std::int64_t t, std::int64_t c) const {
    float s = 0.0f;
    for (std::int64_t b = 0; b < B; ++b) s += dout(b * T + t, c);
    dwpe(t, c) += s;
  }
};

// dwpe: (>=T, C) +=, summed over the sequences of dout: (B*T, C)
template <class Exec>
void position_embedding_backward(const Exec& exec, const Mat<Exec>& dwpe, const ConstMat<Exec>& dout,
                                 std::int64_t T) {
  const std::int64_t N = static_cast<std::int64_t>(dout.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(dout.extent(1));
  const std::int64_t B = N / T;
  Kokkos::parallel_for(
      "lamina::position_embedding_backward",
      Kokkos::MDRangePolicy<Exec, Kokkos::Rank<2>, Kokkos::IndexType<std::int64_t>>(exec, {0, 0}, {T, C}),
      PositionEmbeddingBackward<Exec>{dwpe, dout, T, B});
}

}  // namespace lamina
