#pragma once
// Softmax cross-entropy over the vocabulary, per position:
//   loss_i = logsumexp(logits_i) - logits_i[target_i]
#include "lamina/kernels/fast_math.hpp"
#include "lamina/kernels/reduction.hpp"

namespace lamina {

// losses: (N) per-position loss; lse: (N) log-sum-exp, saved for backward
// logits: (N, V); targets: (N)
template <class Exec>
void cross_entropy_forward(const Exec& exec, const Vec<Exec>& losses, const Vec<Exec>& lse,
                           const ConstMat<Exec>& logits, const Tokens<Exec>& targets) {
  using member = typename Teams<Exec>::member_type;
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  Kokkos::parallel_for(
      "lamina::cross_entropy_forward", Teams<Exec>(exec, N, Kokkos::AUTO), KOKKOS_LAMBDA(const member& team) {
        const std::int64_t i = team.league_rank();
        const float mx = team_max(team, V, [&](std::int64_t j) { return logits(i, j); });
        const float sum = team_sum(team, V, [&](std::int64_t j) { return fast_exp(logits(i, j) - mx); });
        Kokkos::single(Kokkos::PerTeam(team), [&]() {
          const float l = mx + math::log(sum);
          lse(i) = l;
          losses(i) = l - logits(i, targets(i));
        });
      });
}

// dlogits: (N, V) overwritten with scale * (softmax(logits) - onehot(target)); it may
// alias logits (the usual case: the logits are not needed afterwards). `scale` is
// d(total loss)/d(loss_i), 1 / (number of positions) for a mean.
template <class Exec>
void cross_entropy_backward(const Exec& exec, const Mat<Exec>& dlogits, const ConstMat<Exec>& logits,
                            const ConstVec<Exec>& lse, const Tokens<Exec>& targets, float scale) {
  using member = typename Teams<Exec>::member_type;
  const std::int64_t N = static_cast<std::int64_t>(logits.extent(0));
  const std::int64_t V = static_cast<std::int64_t>(logits.extent(1));
  Kokkos::parallel_for(
      "lamina::cross_entropy_backward", Teams<Exec>(exec, N, Kokkos::AUTO), KOKKOS_LAMBDA(const member& team) {
        const std::int64_t i = team.league_rank();
        const float l = lse(i);
        const std::int64_t y = targets(i);
        Kokkos::parallel_for(Kokkos::TeamThreadRange(team, V), [&](std::int64_t j) {
          dlogits(i, j) = scale * (fast_exp(logits(i, j) - l) - (j == y ? 1.0f : 0.0f));
        });
      });
}

}  // namespace lamina
