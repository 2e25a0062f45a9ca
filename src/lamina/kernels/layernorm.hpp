#pragma once
// LayerNorm over the last dimension (eps 1e-5, as GPT-2 and PyTorch):
//   out = (x - mean) * rstd * weight + bias,  rstd = 1 / sqrt(var + eps), biased variance.
#include "lamina/kernels/gemm.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

constexpr float kLayerNormEps = 1e-5f;

// One team per row.
template <class Exec>
struct LayernormForward {
  Mat<Exec> out;
  Vec<Exec> mean, rstd;
  ConstMat<Exec> inp;
  ConstVec<Exec> weight, bias;
  std::int64_t C;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    const float m = team_sum(team, C, [&](std::int64_t c) { return inp(i, c); }) / C;
    const float sq = team_sum(team, C, [&](std::int64_t c) {
      const float d = inp(i, c) - m;
      return d * d;
    });
    const float r = 1.0f / math::sqrt(sq / C + kLayerNormEps);
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                         [&](std::int64_t c) { out(i, c) = (inp(i, c) - m) * r * weight(c) + bias(c); });
    Kokkos::single(Kokkos::PerTeam(team), [&]() {
      mean(i) = m;
      rstd(i) = r;
    });
  }
};

// out: (N, C); mean, rstd: (N), saved for backward; inp: (N, C); weight, bias: (C)
template <class Exec>
void layernorm_forward(const Exec& exec, const Mat<Exec>& out, const Vec<Exec>& mean, const Vec<Exec>& rstd,
                       const ConstMat<Exec>& inp, const ConstVec<Exec>& weight, const ConstVec<Exec>& bias) {
  const std::int64_t N = static_cast<std::int64_t>(inp.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(inp.extent(1));
  Kokkos::parallel_for("lamina::layernorm_forward", Teams<Exec>(exec, N, Kokkos::AUTO),
                       LayernormForward<Exec>{out, mean, rstd, inp, weight, bias, C});
}

// One team per row; writes dinp and, into scratch, dout * xhat for the weight gradient.
template <class Exec>
struct LayernormBackward {
  Mat<Exec> dinp;
  ConstMat<Exec> dout, dskip, inp;
  ConstVec<Exec> weight, mean, rstd;
  Mat<Exec> scratch;
  std::int64_t C;
  bool has_skip;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t i = team.league_rank();
    const float m = mean(i), r = rstd(i);
    // dnorm = dout * weight; dinp = r * (dnorm - mean(dnorm) - xhat * mean(dnorm * xhat))
    const float s1 = team_sum(team, C, [&](std::int64_t c) { return dout(i, c) * weight(c); }) / C;
    const float s2 =
        team_sum(team, C, [&](std::int64_t c) { return dout(i, c) * weight(c) * (inp(i, c) - m) * r; }) / C;
    auto local = [&](std::int64_t c) {
      const float xhat = (inp(i, c) - m) * r;
      scratch(i, c) = dout(i, c) * xhat;
      return r * (dout(i, c) * weight(c) - s1 - xhat * s2);
    };
    // Two loops rather than a branch per element, so that each one vectorizes.
    if (has_skip) {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C),
                           [&](std::int64_t c) { dinp(i, c) = dskip(i, c) + local(c); });
    } else {
      Kokkos::parallel_for(Kokkos::TeamThreadRange(team, C), [&](std::int64_t c) { dinp(i, c) = local(c); });
    }
  }
};

// dinp: (N, C) = dskip + d(layernorm)/d(inp)^T dout. The residual stream's gradient
// (dskip) joins here; dinp may alias dskip, and an empty dskip means zero.
// dweight, dbias: (C) +=.
// scratch: (N, C) workspace; ones: (>=N) ones, for the column sums.
template <class Exec>
void layernorm_backward(const Exec& exec, const Mat<Exec>& dinp, const Vec<Exec>& dweight, const Vec<Exec>& dbias,
                        const ConstMat<Exec>& dout, const ConstMat<Exec>& dskip, const ConstMat<Exec>& inp,
                        const ConstVec<Exec>& weight, const ConstVec<Exec>& mean, const ConstVec<Exec>& rstd,
                        const Mat<Exec>& scratch, const ConstVec<Exec>& ones) {
  const std::int64_t N = static_cast<std::int64_t>(inp.extent(0));
  const std::int64_t C = static_cast<std::int64_t>(inp.extent(1));
  const bool has_skip = dskip.data() != nullptr;
  Kokkos::parallel_for("lamina::layernorm_backward", Teams<Exec>(exec, N, Kokkos::AUTO),
                       LayernormBackward<Exec>{dinp, dout, dskip, inp, weight, mean, rstd, scratch, C, has_skip});
  add_column_sums(exec, dweight, scratch, ones);
  add_column_sums(exec, dbias, dout, ones);
}

}  // namespace lamina
