#pragma once
// The double-precision reference of causal attention the attention kernels' tests share.
#include <algorithm>
#include <cmath>
#include <vector>

namespace lamina::test {

inline double identity(double x) { return x; }

// Naive double-precision causal attention on qkv (B*T, (NH + 2 NKV) hd) rows [q | k | v]
// (NKV key/value heads, each read by NH / NKV query heads; 0: NKV = NH): returns out
// (B*T, C) and, given dout, dqkv. `r` is applied where bf16 products round their operands: q, k, v, dy,
// the probabilities and the (scaled) score gradients they multiply; `saved`, when given, holds
// the probabilities the backward pass reads, (B*NH, T, T) (those a kernel saved in bf16: its
// fp32 probabilities and these double ones may round to neighbouring bf16 values), else the
// exact ones are read; `y` is applied to the output where the softmax backward's row sum is
// taken as dy . y (fused kernels), not P . dP. `probs`, when given, receives the exact
// probabilities, (B*NH, T, T), zero above the diagonal (of the scores as `sc` leaves them).
// `sc` is applied to the products' sums that staged bf16 products round as they write them:
// the unscaled scores and dP.
inline void attention_reference(const std::vector<double>& qkv, const std::vector<double>& dout, int B, int T, int C,
                                int NH, std::vector<double>& out, std::vector<double>& dqkv,
                                double (*r)(double) = identity, const std::vector<double>* saved = nullptr,
                                double (*y)(double) = nullptr, int NKV = 0, std::vector<double>* probs = nullptr,
                                double (*sc)(double) = identity) {
  const int hd = C / NH;
  if (NKV == 0) NKV = NH;
  const int G = NH / NKV, W = (NH + 2 * NKV) * hd;
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  out.assign(B * T * C, 0.0);
  dqkv.assign(B * T * W, 0.0);
  if (probs != nullptr) probs->assign(static_cast<std::size_t>(B) * NH * T * T, 0.0);
  auto at = [&](int b, int t, int part, int h, int d) {
    const int col = part == 0 ? h * hd : part == 1 ? C + h / G * hd : C + NKV * hd + h / G * hd;
    return (b * T + t) * W + col + d;
  };
  for (int b = 0; b < B; ++b) {
    for (int h = 0; h < NH; ++h) {
      std::vector<double> P(T * T, 0.0), dP(T * T, 0.0);
      for (int t = 0; t < T; ++t) {
        double mx = -1e300;
        std::vector<double> s(T, 0.0);
        for (int j = 0; j <= t; ++j) {
          for (int d = 0; d < hd; ++d) s[j] += r(qkv[at(b, t, 0, h, d)]) * r(qkv[at(b, j, 1, h, d)]);
          s[j] = sc(s[j]) * scale;
          mx = std::max(mx, s[j]);
        }
        double z = 0;
        for (int j = 0; j <= t; ++j) z += std::exp(s[j] - mx);
        for (int j = 0; j <= t; ++j) P[t * T + j] = std::exp(s[j] - mx) / z;
        for (int d = 0; d < hd; ++d) {
          double y = 0;
          for (int j = 0; j <= t; ++j) y += r(P[t * T + j]) * r(qkv[at(b, j, 2, h, d)]);
          out[(b * T + t) * C + h * hd + d] = y;
        }
      }
      const std::size_t head = static_cast<std::size_t>(b * NH + h) * T * T;
      if (probs != nullptr) std::copy(P.begin(), P.end(), probs->begin() + head);
      if (saved != nullptr) {
        for (int t = 0; t < T; ++t) {
          for (int j = 0; j <= t; ++j) P[t * T + j] = (*saved)[head + t * T + j];
        }
      }
      for (int t = 0; t < T; ++t) {
        for (int j = 0; j <= t; ++j) {
          for (int d = 0; d < hd; ++d) {
            const double dy = r(dout[(b * T + t) * C + h * hd + d]);
            dP[t * T + j] += dy * r(qkv[at(b, j, 2, h, d)]);
            dqkv[at(b, j, 2, h, d)] += r(P[t * T + j]) * dy;
          }
        }
        for (int j = 0; j <= t; ++j) dP[t * T + j] = sc(dP[t * T + j]);
        double dotp = 0;
        for (int j = 0; j <= t; ++j) dotp += P[t * T + j] * dP[t * T + j];
        if (y != nullptr) {
          dotp = 0;
          for (int d = 0; d < hd; ++d) dotp += dout[(b * T + t) * C + h * hd + d] * y(out[(b * T + t) * C + h * hd + d]);
        }
        for (int j = 0; j <= t; ++j) {
          const double dS = r(P[t * T + j] * (dP[t * T + j] - dotp) * scale);
          for (int d = 0; d < hd; ++d) {
            dqkv[at(b, t, 0, h, d)] += dS * r(qkv[at(b, j, 1, h, d)]);
            dqkv[at(b, j, 1, h, d)] += dS * r(qkv[at(b, t, 0, h, d)]);
          }
        }
      }
    }
  }
}

}  // namespace lamina::test
