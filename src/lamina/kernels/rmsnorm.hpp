#pragma once
// RMSNorm over the last dimension (Llama; Zhang and Sennrich 2019):
//   out = x * rstd * weight,  rstd = 1 / sqrt(mean(x^2) + eps)
// No centring and no bias. x, out and the saved rstd are read and written in their storage
// type (float, or bf16 in bf16 runs; the final norm's rstd stays fp32) with fp32 arithmetic;
// gradients are fp32.
#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/norm_backward.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

// One team per row. X: the input's storage type, Y: the output's, S: the saved rstd's.
template <class Exec, class X, class Y, class S>
struct RmsnormForward {
  MatOf<Exec, Y> out;
  VecOf<Exec, S> rstd;
  MatOf<Exec, const X> inp;
  ConstVec<Exec> weight;
  std::int64_t C;
  float eps;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    const float sq = team_sum(team, C, [&](std::int64_t c) {
      const float x = widen(inp(i, c));
      return x * x;
    });
    const float r = 1.0f / math::sqrt(sq / C + eps);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                         [&](std::int64_t c) { put(out(i, c), widen(inp(i, c)) * r * weight(c)); });
    Kokkos::single(Kokkos::PerTeam(team), [&]() { put(rstd(i), r); });
  }
};

// out: (N, C); rstd: (N), saved for backward (fp32, or stored as out is); inp: (N, C); weight: (C)
template <class Exec, class OutV, class StatV, class InV>
void rmsnorm_forward(const Exec& exec, const OutV& out, const StatV& rstd, const InV& inp,
                     const ConstVec<Exec>& weight, float eps) {
  using X = StoredType<InV>;
  using Y = StoredType<OutV>;
  using S = StoredType<StatV>;
  const std::int64_t N = static_cast<std::int64_t>(inp.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(inp.extent(1));
  Kokkos::parallel_for("lamina::rmsnorm_forward", Teams<Exec>(exec, N, Kokkos::AUTO),
                       RmsnormForward<Exec, X, Y, S>{out, rstd, inp, weight, C, eps});
}

// Row i of the backward pass by `r` (a team, or SerialRow on a host thread): writes dinp and
// hands dout * xhat to `terms` for the weight gradient. D: the output gradient's storage type.
template <class Exec, class X, class S, class D>
struct RmsnormBackward {
  Mat<Exec> dinp;
  MatOf<Exec, const D> dout;
  ConstMat<Exec> dskip;
  MatOf<Exec, const X> inp;
  ConstVec<Exec> weight;
  VecOf<Exec, const S> rstd;
  Mat<Exec> scratch;
  std::int64_t C;
  bool has_skip;
  template <class Row, class Terms>
  KOKKOS_INLINE_FUNCTION void row(const Row& r, std::int64_t i, const Terms& terms) const {
    const float rs = widen(rstd(i));
    // xhat = x * rs; dinp = rs * (dout * weight - xhat * mean(dout * weight * xhat))
    const float s =
        r.sum(C, [&](std::int64_t c) { return widen(dout(i, c)) * weight(c) * widen(inp(i, c)) * rs; }) / C;
    store_gradient_row(r, i, C, dinp, dskip, has_skip, [&](std::int64_t c) {
      const float xhat = widen(inp(i, c)) * rs;
      terms.put(i, c, widen(dout(i, c)) * xhat);
      return rs * (widen(dout(i, c)) * weight(c) - xhat * s);
    });
  }
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    row(TeamRow<typename Teams<Exec>::member_type>{team}, team.league_rank(),
        GainTerms{scratch.data(), static_cast<std::int64_t>(scratch.stride_0())});
  }
};

// dinp: (N, C) = dskip + d(rmsnorm)/d(inp)^T dout, the residual stream's gradient joining
// here as in layernorm_backward (dinp may alias dskip; an empty dskip means zero).
// dweight: (C) +=. scratch: (N, C) workspace; partials: for a device's column sums.
// inp, rstd: as the forward pass read and saved them (float or bf16); dout: fp32 or bf16.
template <class Exec, class InV, class StatV, class DV>
void rmsnorm_backward(const Exec& exec, const Mat<Exec>& dinp, const Vec<Exec>& dweight, const DV& dout,
                      const ConstMat<Exec>& dskip, const InV& inp, const ConstVec<Exec>& weight, const StatV& rstd,
                      const Mat<Exec>& scratch, const Vec<Exec>& partials) {
  const std::int64_t N = static_cast<std::int64_t>(inp.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(inp.extent(1));
  norm_backward("lamina::rmsnorm_backward", exec,
                RmsnormBackward<Exec, StoredType<InV>, StoredType<StatV>, StoredType<DV>>{
                    dinp, dout, dskip, inp, weight, rstd, scratch, C, dskip.data() != nullptr},
                N, C, scratch, dweight, Vec<Exec>(), dout, partials);
}

}  // namespace lamina
