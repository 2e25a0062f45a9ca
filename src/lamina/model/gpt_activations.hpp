#pragma once
// What a GPT-2 forward pass keeps for backward (per block: one flat buffer, so a block's
// activations can be dropped, recomputed or moved as a unit), and the scratch space that
// one block at a time uses. Sizes come from activation_sizes(), which the memory
// estimate shares, so predicted and allocated bytes cannot drift apart.
#include <cstdint>
#include <vector>

#include "lamina/core/buffer.hpp"
#include "lamina/core/deck.hpp"
#include "lamina/kernels/common.hpp"

namespace lamina {

struct Dims {
  std::int64_t B = 0, T = 0, C = 0, NH = 0, V = 0;
  std::int64_t N() const { return B * T; }
  std::int64_t hd() const { return C / NH; }
  static Dims of(const ModelConfig& m, std::int64_t micro_batch) {
    return {micro_batch, m.seq_len, m.d_model, m.heads, m.vocab_size};
  }
};

// Elements (floats unless noted) of each activation buffer of a micro-batch of B sequences.
struct ActivationSizes {
  std::int64_t embed = 0;      // embedding output
  std::int64_t block = 0;      // saved by one transformer block
  std::int64_t head = 0;       // final norm, logits, losses
  std::int64_t workspace = 0;  // scratch shared by all blocks (forward and backward overlap)
  std::int64_t ones = 0;       // a row of ones for column sums
  std::int64_t tokens = 0;     // int32 inputs + targets
};
ActivationSizes activation_sizes(const Dims& d);

template <class Exec>
struct BlockActs {
  Mat<Exec> ln1;                 // (N, C)
  Vec<Exec> ln1_mean, ln1_rstd;  // (N)
  Mats<Exec> q, k, v;            // (B*NH, T, hd)
  Mats<Exec> att;                // (B*NH, T, T) softmax probabilities
  Mat<Exec> atty;                // (N, C) attention output before projection
  Mat<Exec> x2;                  // (N, C) residual after attention
  Mat<Exec> ln2;                 // (N, C)
  Vec<Exec> ln2_mean, ln2_rstd;  // (N)
  Mat<Exec> fch, fch_gelu;       // (N, 4C)
  Mat<Exec> out;                 // (N, C) block output: residual after the MLP
};

template <class Exec>
struct HeadActs {
  Mat<Exec> lnf;                 // (N, C)
  Vec<Exec> lnf_mean, lnf_rstd;  // (N)
  Mat<Exec> logits;              // (N, V); holds dlogits during backward
  Vec<Exec> losses, lse;         // (N)
};

template <class Exec>
struct Workspace {
  // forward
  Mat<Exec> qkv;              // (N, 3C)
  Mats<Exec> y;               // (B*NH, T, hd)
  Mat<Exec> attproj, fcproj;  // (N, C)
  // backward (same memory as forward)
  Mat<Exec> dres;             // (N, C) gradient of the residual stream
  Mat<Exec> dln;              // (N, C) gradient of a layernorm output
  Mat<Exec> dfch;             // (N, 4C)
  Mat<Exec> dqkv;             // (N, 3C)
  Mats<Exec> dq, dk, dv, dy;  // (B*NH, T, hd)
  Mats<Exec> datt;            // (B*NH, T, T)
  Mat<Exec> datty;            // (N, C)
  Mat<Exec> scratch;          // (N, C)
  Vec<Exec> qkv_bias_sums;    // (3C)
  Vec<Exec> ones;             // (N)
};

// Owns every activation and workspace buffer of one model replica, allocated once.
template <class Exec>
class GptActivations {
 public:
  using Mem = typename Exec::memory_space;
  using TokenView = Kokkos::View<std::int32_t*, Kokkos::LayoutRight, Mem>;

  GptActivations(MemoryTracker& tracker, const Dims& d, std::int64_t blocks) : dims_(d) {
    const ActivationSizes s = activation_sizes(d);
    const std::int64_t N = d.N(), C = d.C, BNH = d.B * d.NH, T = d.T, hd = d.hd();
    embed_buf_ = Buffer<float, Mem>(tracker, MemCategory::activations, "lamina::acts_embed", s.embed);
    embed_out = as_mat<Exec>(embed_buf_.data(), N, C);
    for (std::int64_t l = 0; l < blocks; ++l) {
      block_bufs_.emplace_back(tracker, MemCategory::activations, "lamina::acts_h" + std::to_string(l), s.block);
      float* p = block_bufs_.back().data();
      BlockActs<Exec> a;
      auto take = [&p](std::int64_t n) {
        float* q = p;
        p += n;
        return q;
      };
      a.ln1 = as_mat<Exec>(take(N * C), N, C);
      a.ln1_mean = as_vec<Exec>(take(N), N);
      a.ln1_rstd = as_vec<Exec>(take(N), N);
      a.q = as_mats<Exec>(take(N * C), BNH, T, hd);
      a.k = as_mats<Exec>(take(N * C), BNH, T, hd);
      a.v = as_mats<Exec>(take(N * C), BNH, T, hd);
      a.att = as_mats<Exec>(take(BNH * T * T), BNH, T, T);
      a.atty = as_mat<Exec>(take(N * C), N, C);
      a.x2 = as_mat<Exec>(take(N * C), N, C);
      a.ln2 = as_mat<Exec>(take(N * C), N, C);
      a.ln2_mean = as_vec<Exec>(take(N), N);
      a.ln2_rstd = as_vec<Exec>(take(N), N);
      a.fch = as_mat<Exec>(take(4 * N * C), N, 4 * C);
      a.fch_gelu = as_mat<Exec>(take(4 * N * C), N, 4 * C);
      a.out = as_mat<Exec>(take(N * C), N, C);
      block.push_back(a);
    }
    head_buf_ = Buffer<float, Mem>(tracker, MemCategory::activations, "lamina::acts_head", s.head);
    {
      float* p = head_buf_.data();
      head.lnf = as_mat<Exec>(p, N, C);
      head.lnf_mean = as_vec<Exec>(p += N * C, N);
      head.lnf_rstd = as_vec<Exec>(p += N, N);
      head.logits = as_mat<Exec>(p += N, N, d.V);
      head.losses = as_vec<Exec>(p += N * d.V, N);
      head.lse = as_vec<Exec>(p += N, N);
    }
    ws_buf_ = Buffer<float, Mem>(tracker, MemCategory::workspace, "lamina::workspace", s.workspace);
    {
      float* p = ws_buf_.data();
      ws.qkv = as_mat<Exec>(p, N, 3 * C);
      ws.y = as_mats<Exec>(p += 3 * N * C, BNH, T, hd);
      ws.attproj = as_mat<Exec>(p += N * C, N, C);
      ws.fcproj = as_mat<Exec>(p += N * C, N, C);
      p = ws_buf_.data();
      ws.dres = as_mat<Exec>(p, N, C);
      ws.dln = as_mat<Exec>(p += N * C, N, C);
      ws.dfch = as_mat<Exec>(p += N * C, N, 4 * C);
      ws.dqkv = as_mat<Exec>(p += 4 * N * C, N, 3 * C);
      ws.dq = as_mats<Exec>(p += 3 * N * C, BNH, T, hd);
      ws.dk = as_mats<Exec>(p += N * C, BNH, T, hd);
      ws.dv = as_mats<Exec>(p += N * C, BNH, T, hd);
      ws.dy = as_mats<Exec>(p += N * C, BNH, T, hd);
      ws.datt = as_mats<Exec>(p += N * C, BNH, T, T);
      ws.datty = as_mat<Exec>(p += BNH * T * T, N, C);
      ws.scratch = as_mat<Exec>(p += N * C, N, C);
      ws.qkv_bias_sums = as_vec<Exec>(p += N * C, 3 * C);
    }
    ones_buf_ = Buffer<float, Mem>(tracker, MemCategory::workspace, "lamina::ones", s.ones);
    Kokkos::deep_copy(ones_buf_.view(), 1.0f);
    ws.ones = ones_buf_.view();
    tokens_buf_ = Buffer<std::int32_t, Mem>(tracker, MemCategory::workspace, "lamina::tokens", s.tokens);
    inputs = Kokkos::subview(tokens_buf_.view(), std::pair<std::int64_t, std::int64_t>(0, N));
    targets = Kokkos::subview(tokens_buf_.view(), std::pair<std::int64_t, std::int64_t>(N, 2 * N));
  }

  const Dims& dims() const { return dims_; }

  Mat<Exec> embed_out;  // (N, C) block 0's input
  std::vector<BlockActs<Exec>> block;
  HeadActs<Exec> head;
  Workspace<Exec> ws;
  TokenView inputs, targets;  // (N) int32

 private:
  Dims dims_;
  Buffer<float, Mem> embed_buf_;
  std::vector<Buffer<float, Mem>> block_bufs_;
  Buffer<float, Mem> head_buf_, ws_buf_, ones_buf_;
  Buffer<std::int32_t, Mem> tokens_buf_;
};

}  // namespace lamina
