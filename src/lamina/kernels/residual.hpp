#pragma once
// Residual connection: out = a + (b + bias), where b is a projection's output and bias its
// bias, joined here instead of in a pass of its own (with tensor parallelism after the
// shards' partial products are summed, so every rank adds it once). b is fp32, or bf16 where
// the shards' partial results were summed in bf16 (parallel.tp_sums): read as summed. Its backward is the
// identity on both branches: the model hands the same gradient to both, and the skip
// branch joins the other one inside layernorm_backward (its `dskip` argument), which saves
// a pass over memory; the bias gradient is the projection's (linear_backward). The residual
// stream (a, out) is read and written in its storage type (float, or bf16 in bf16 runs).
#include "lamina/kernels/bf16.hpp"

namespace lamina {

// One team per row. T: the stream's storage type, B: the branch's.
template <class Exec, class T, class B>
struct ResidualForward {
  MatOf<Exec, T> out;
  MatOf<Exec, const T> a;
  MatOf<Exec, const B> b;
  ConstVec<Exec> bias;
  bool has_bias;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, static_cast<std::int64_t>(out.extent(1))), [&](std::int64_t j) {
      put(out(i, j), widen(a(i, j)) + (has_bias ? widen(b(i, j)) + bias(j) : widen(b(i, j))));
    });
  }
};

// out, a: (N, C) as stored; b: (N, C) fp32 or bf16; bias: (C), or empty for none
template <class Exec, class OutV, class AV, class BV>
void residual_forward(const Exec& exec, const OutV& out, const AV& a, const BV& b, const ConstVec<Exec>& bias) {
  using T = StoredType<OutV>;
  static_assert(std::is_same<StoredType<AV>, T>::value, "residual_forward: the stream is stored in one type");
  Kokkos::parallel_for("lamina::residual_forward",
                       Teams<Exec>(exec, static_cast<std::int64_t>(out.extent(0)), Kokkos::AUTO),
                       ResidualForward<Exec, T, StoredType<BV>>{out, a, b, bias, bias.data() != nullptr});
}

}  // namespace lamina
