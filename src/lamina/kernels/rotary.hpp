#pragma once
// Rotary position embedding (RoPE; Su et al. 2021), in HuggingFace Llama's convention: dims
// i and i + d/2 of a head form a pair (`rotate_half`, not interleaved pairs), rotated by the
// angle pos * inv_freq[i]:
//   x'[i]       = x[i] cos - x[i + d/2] sin
//   x'[i + d/2] = x[i + d/2] cos + x[i] sin
// HuggingFace checkpoints store the q and k projections' rows in this order, so their
// weights are used as they are. Applied in place to the query and key heads of the QKV
// projection's output, whose rows are [q heads | k heads | v heads], each head d wide: the
// first `heads` heads of a row are q and k. The backward pass rotates the gradient back.
#include <cmath>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/kernels/bf16.hpp"
#include "lamina/kernels/context_chunks.hpp"

namespace lamina {

// inv_freq[i] = theta^(-2i/d), i < d/2, scaled as Llama 3 does (RotaryScaling,
// core/config.hpp; HuggingFace's _compute_llama3_parameters, in double).
inline std::vector<double> rotary_inverse_frequencies(std::int64_t head_dim, double theta,
                                                      const RotaryScaling& scaling = {}) {
  constexpr double kPi = 3.14159265358979323846;
  std::vector<double> inv(static_cast<std::size_t>(head_dim / 2));
  for (std::size_t i = 0; i < inv.size(); ++i) {
    double f = std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(head_dim));
    if (scaling.factor > 0.0) {
      const double wavelen = 2.0 * kPi / f;
      const double low_wavelen = scaling.original_context / scaling.low_freq_factor;
      const double high_wavelen = scaling.original_context / scaling.high_freq_factor;
      if (wavelen > low_wavelen) {
        f /= scaling.factor;
      } else if (wavelen >= high_wavelen) {
        const double smooth = (scaling.original_context / wavelen - scaling.low_freq_factor) /
                              (scaling.high_freq_factor - scaling.low_freq_factor);
        f = (1.0 - smooth) * f / scaling.factor + smooth * f;
      }
    }
    inv[i] = f;
  }
  return inv;
}

// cos and sin of pos * inv_freq[i] for the positions of rows [0, rows) (`where`: the rows'
// positions under context parallelism; else row p is position p), computed in double and
// stored as float: (rows, d/2) each.
template <class Exec>
struct RotaryTable {
  Mat<Exec> cos, sin;
  RotaryTable() = default;
  RotaryTable(std::int64_t positions, const std::vector<double>& inv_freq) {
    const auto half = static_cast<std::int64_t>(inv_freq.size());
    cos = Mat<Exec>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lamina::rotary_cos"), positions, half);
    sin = Mat<Exec>(Kokkos::view_alloc(Kokkos::WithoutInitializing, "lamina::rotary_sin"), positions, half);
    fill(inv_freq);
  }
  // In `memory` (floats(), e.g. a run's tracked workspace) instead of its own.
  RotaryTable(float* memory, std::int64_t positions, const std::vector<double>& inv_freq,
              const ContextChunks& where = {}) {
    const auto half = static_cast<std::int64_t>(inv_freq.size());
    cos = as_mat<Exec>(memory, positions, half);
    sin = as_mat<Exec>(memory + positions * half, positions, half);
    fill(inv_freq, where);
  }
  static std::int64_t floats(std::int64_t positions, std::int64_t head_dim) { return positions * head_dim; }
  std::int64_t half() const { return static_cast<std::int64_t>(cos.extent(1)); }

 private:
  void fill(const std::vector<double>& inv_freq, const ContextChunks& where = {}) {
    auto hc = Kokkos::create_mirror_view(cos);
    auto hs = Kokkos::create_mirror_view(sin);
    for (std::int64_t p = 0; p < static_cast<std::int64_t>(cos.extent(0)); ++p) {
      for (std::int64_t i = 0; i < half(); ++i) {
        const double a = static_cast<double>(where.position(p)) * inv_freq[static_cast<std::size_t>(i)];
        hc(p, i) = static_cast<float>(std::cos(a));
        hs(p, i) = static_cast<float>(std::sin(a));
      }
    }
    Kokkos::deep_copy(cos, hc);
    Kokkos::deep_copy(sin, hs);
  }
};

// One team per row, a head per team thread and its pairs across the thread's vector lanes
// (neighbouring lanes touch neighbouring addresses; on a host, one vectorisable loop), so
// that no index is divided out per element. sign +1 rotates forward, -1 back (the
// transpose, for gradients).
template <class Exec, class T>
struct RotaryRotate {
  MatOf<Exec, T> x;
  ConstMat<Exec> cos, sin;
  std::int64_t heads, half, seq, pos0;
  float sign;
  KOKKOS_INLINE_FUNCTION void operator()(const typename Teams<Exec>::member_type& team) const {
    const std::int64_t n = team.league_rank(), p = pos0 + n % seq;
    Kokkos::parallel_for(Kokkos::TeamThreadRange(team, heads), [&](std::int64_t h) {
      Kokkos::parallel_for(Kokkos::ThreadVectorRange(team, half), [&](std::int64_t i) {
        const std::int64_t c = h * 2 * half + i;
        const float co = cos(p, i), si = sign * sin(p, i);
        const float a = widen(x(n, c)), b = widen(x(n, c + half));
        put(x(n, c), a * co - b * si);
        put(x(n, c + half), b * co + a * si);
      });
    });
  }
};

// Rotates the first `heads` heads (head_dim = 2 * table.half() wide) of each row of x in
// place; x: (N, >= heads * head_dim) as stored, rows ordered (sequence, position) with seq
// positions per sequence, the first at pos0. forward false: the transpose, for dx.
template <class Exec, class V>
void rotary_apply(const Exec& exec, const V& x, std::int64_t heads, std::int64_t seq, std::int64_t pos0,
                  const RotaryTable<Exec>& table, bool forward) {
  const std::int64_t N = static_cast<std::int64_t>(x.extent(0)), half = table.half();
  int lanes = 1;  // a device's vector length: a power of two, at most a warp
  while (lanes < 32 && 2 * lanes <= half) lanes *= 2;
  Kokkos::parallel_for("lamina::rotary", Teams<Exec>(exec, N, Kokkos::AUTO, lanes),
                       RotaryRotate<Exec, StoredType<V>>{x, table.cos, table.sin, heads, half, seq, pos0,
                                                         forward ? 1.0f : -1.0f});
}

}  // namespace lamina
