#pragma once
// LayerNorm over the last dimension (eps 1e-5, as GPT-2 and PyTorch):
//   out = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps), biased variance.
// x, out and the saved mean and rstd are read and written in their storage type (float,
// or bf16 in bf16 runs; the final norm's statistics stay fp32), with fp32 arithmetic;
// gradients are fp32.
#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/norm_backward.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

constexpr float kLayerNormEps = 1e-5f;

// Row i of a layer norm by a team: inp, out, mean and rstd views of any storage type.
template <class Member, class Out, class Stat, class In, class W>
KOKKOS_INLINE_FUNCTION void layernorm_row(const Member& team, std::int64_t i, std::int64_t C, const Out& out,
                                          const Stat& mean, const Stat& rstd, const In& inp, const W& weight,
                                          const W& bias) {
  const float m = team_sum(team, C, [&](std::int64_t c) { return widen(inp(i, c)); }) / C;
  const float sq = team_sum(team, C, [&](std::int64_t c) {
    const float d = widen(inp(i, c)) - m;
    return d * d;
  });
  const float r = 1.0f / math::sqrt(sq / C + kLayerNormEps);
  Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                       [&](std::int64_t c) { put(out(i, c), (widen(inp(i, c)) - m) * r * weight(c) + bias(c)); });
  Kokkos::single(Kokkos::PerTeam(team), [&]() {
    put(mean(i), m);
    put(rstd(i), r);
  });
}

// One team per row. X: the input's storage type, Y: the output's, S: the saved statistics'.
template <class Exec, class X, class Y, class S>
struct LayernormForward {
  MatOf<Exec, Y> out;
  VecOf<Exec, S> mean, rstd;
  MatOf<Exec, const X> inp;
  ConstVec<Exec> weight, bias;
  std::int64_t C;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    layernorm_row(team, team.league_rank(), C, out, mean, rstd, inp, weight, bias);
  }
};

// A residual add and the layer norm after it in one pass, one team per row: the sum stored
// (T: float or bf16), then normalized as stored, while the row is still in cache. B: the
// branch's storage type.
template <class Exec, class T, class B>
struct ResidualLayernormForward {
  MatOf<Exec, T> sum, out;
  VecOf<Exec, T> mean, rstd;
  MatOf<Exec, const T> a;
  MatOf<Exec, const B> b;
  ConstVec<Exec> b_bias, weight, bias;
  std::int64_t C;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                         [&](std::int64_t c) { put(sum(i, c), widen(a(i, c)) + (widen(b(i, c)) + b_bias(c))); });
    team.team_barrier();
    layernorm_row(team, i, C, out, mean, rstd, MatOf<Exec, const T>(sum), weight, bias);
  }
};

// out: (N, C); mean, rstd: (N), saved for backward (fp32, or as out is stored); inp: (N, C);
// weight, bias: (C)
template <class Exec, class OutV, class StatV, class InV>
void layernorm_forward(const Exec& exec, const OutV& out, const StatV& mean, const StatV& rstd, const InV& inp,
                       const ConstVec<Exec>& weight, const ConstVec<Exec>& bias) {
  using X = StoredType<InV>;
  using Y = StoredType<OutV>;
  using S = StoredType<StatV>;
  const std::int64_t N = static_cast<std::int64_t>(inp.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(inp.extent(1));
  Kokkos::parallel_for("lamina::layernorm_forward", Teams<Exec>(exec, N, Kokkos::AUTO),
                       LayernormForward<Exec, X, Y, S>{out, mean, rstd, inp, weight, bias, C});
}

// sum = a + (b + b_bias) (residual_forward), then out, mean, rstd = the layer norm of sum as
// stored (layernorm_forward), in one pass. sum, out, a: (N, C) as stored; b: (N, C) fp32,
// or bf16 as the tensor-parallel shards summed it. The backward needs no pass of its own:
// layernorm_backward joins the residual's gradient.
template <class Exec, class V, class StatV, class AV, class BV>
void residual_layernorm_forward(const Exec& exec, const V& sum, const V& out, const StatV& mean, const StatV& rstd,
                                const AV& a, const BV& b, const ConstVec<Exec>& b_bias,
                                const ConstVec<Exec>& weight, const ConstVec<Exec>& bias) {
  using T = StoredType<V>;
  static_assert(std::is_same<StoredType<AV>, T>::value && std::is_same<StoredType<StatV>, T>::value,
                "residual_layernorm_forward: the stream and what it saves are stored in one type");
  const std::int64_t N = static_cast<std::int64_t>(sum.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(sum.extent(1));
  Kokkos::parallel_for(
      "lamina::residual_layernorm_forward", Teams<Exec>(exec, N, Kokkos::AUTO),
      ResidualLayernormForward<Exec, T, StoredType<BV>>{sum, out, mean, rstd, a, b, b_bias, weight, bias, C});
}

// Row i of the backward pass by `r` (a team, or SerialRow on a host thread): writes dinp and
// hands dout * xhat to `terms` for the weight gradient. X: the input's storage type, S: the
// saved statistics', D: the output gradient's (fp32, or bf16 as the tensor-parallel shards
// summed it).
template <class Exec, class X, class S, class D>
struct LayernormBackward {
  Mat<Exec> dinp;
  MatOf<Exec, const D> dout;
  ConstMat<Exec> dskip;
  MatOf<Exec, const X> inp;
  ConstVec<Exec> weight;
  VecOf<Exec, const S> mean, rstd;
  Mat<Exec> scratch;
  std::int64_t C;
  bool has_skip;
  template <class Row, class Terms>
  KOKKOS_INLINE_FUNCTION void row(const Row& r, std::int64_t i, const Terms& terms) const {
    const float m = widen(mean(i)), rs = widen(rstd(i));
    // dnorm = dout * weight; dinp = rs * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    const float s1 = r.sum(C, [&](std::int64_t c) { return widen(dout(i, c)) * weight(c); }) / C;
    const float s2 =
        r.sum(C, [&](std::int64_t c) { return widen(dout(i, c)) * weight(c) * (widen(inp(i, c)) - m) * rs; }) / C;
    store_gradient_row(r, i, C, dinp, dskip, has_skip, [&](std::int64_t c) {
      const float xhat = (widen(inp(i, c)) - m) * rs;
      terms.put(i, c, widen(dout(i, c)) * xhat);
      return rs * (widen(dout(i, c)) * weight(c) - s1 - xhat * s2);
    });
  }
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    row(TeamRow<typename Teams<Exec>::member_type>{team}, team.league_rank(),
        GainTerms{scratch.data(), static_cast<std::int64_t>(scratch.stride_0())});
  }
};

// dinp: (N, C) = dskip + d(layernorm)/d(inp)^T dout. The residual stream's gradient
// (dskip) joins here; dinp may alias dskip, and an empty dskip means zero.
// dweight, dbias: (C) +=.
// scratch: (N, C) workspace; partials: for a device's column sums (add_column_sums).
// inp, mean, rstd: as the forward pass read and saved them (float or bf16); dout: fp32 or
// bf16.
template <class Exec, class InV, class StatV, class DV>
void layernorm_backward(const Exec& exec, const Mat<Exec>& dinp, const Vec<Exec>& dweight, const Vec<Exec>& dbias,
                        const DV& dout, const ConstMat<Exec>& dskip, const InV& inp,
                        const ConstVec<Exec>& weight, const StatV& mean, const StatV& rstd,
                        const Mat<Exec>& scratch, const Vec<Exec>& partials) {
  const std::int64_t N = static_cast<std::int64_t>(inp.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(inp.extent(1));
  norm_backward("lamina::layernorm_backward", exec,
                LayernormBackward<Exec, StoredType<InV>, StoredType<StatV>, StoredType<DV>>{
                    dinp, dout, dskip, inp, weight, mean, rstd, scratch, C, dskip.data() != nullptr},
                N, C, scratch, dweight, dbias, dout, partials);
}

}  // namespace lamina
