// Attention's per-head bf16 products on oneDNN with q, k and v read where lamina's host
// attention reads them, in the QKV projection's rows (row stride 3 C, head h at column h hd),
// against per-head dense copies: which implementation oneDNN picks for each layout and its
// rate, and what making the copies costs (README, bf16 on CPUs). On a CPU with AMX, oneDNN 2.6
// runs its AMX kernels (brg:avx512_core_amx_bf16) only on dense operands; strided ones get
// gemm:jit. Shapes of GPT-2 124M: 12 heads of 64, a block of 128 query rows against N keys.
// Then the backward products that write fp32 gradients (dq = dS k, dk += dS^T q): into the
// rows or into a dense block, with dS read transposed or copied so. oneDNN 2.x API.
//   g++ -O2 -std=c++17 onednn_attention_layouts.cpp -o onednn_attention_layouts -ldnnl
//   OMP_NUM_THREADS=2 ./onednn_attention_layouts
#include <oneapi/dnnl/dnnl.hpp>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

using namespace dnnl;
using dt = memory::data_type;

namespace {

constexpr long kHeads = 12, kWidth = 64, kRows = 128, kC = kHeads * kWidth, kRowStride = 3 * kC;

template <class F>
double best_us(F f) {  // best of five means of 200 calls, after a warm-up
  double best = 1e30;
  for (int round = 0; round < 6; ++round) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < 200; ++r) f();
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / 200;
    if (round > 0) best = std::min(best, us);
  }
  return best;
}

// (heads, rows, kWidth) dense <- rows of the QKV layout from column `col`
void copy_heads(std::uint16_t* dst, const std::uint16_t* qkv, long rows, long col) {
  for (long h = 0; h < kHeads; ++h)
    for (long t = 0; t < rows; ++t)
      std::memcpy(dst + (h * rows + t) * kWidth, qkv + t * kRowStride + col + h * kWidth, kWidth * sizeof(std::uint16_t));
}

}  // namespace

int main() {
  engine eng(engine::kind::cpu, 0);
  stream s(eng);
  std::vector<std::uint16_t> qkv(1024 * kRowStride, 0x3c00), qd(kHeads * kRows * kWidth), kd(kHeads * 1024 * kWidth),
      vd(kHeads * 1024 * kWidth), p(kHeads * kRows * 1024, 0x3c00);
  std::vector<float> scores(kHeads * kRows * 1024);
  std::vector<std::uint16_t> out(kRows * kC);
  std::printf("%-7s %5s  %-26s %9s %8s  %-26s %9s %8s  %s\n", "product", "keys", "in the QKV rows", "us", "GFLOP/s",
              "per-head copies", "us", "GFLOP/s", "copies us");
  for (long n : {128L, 256L, 512L, 1024L}) {
    const double flops = 2.0 * kHeads * kRows * kWidth * n;
    // Scores: (1, H, M, hd) x (1, H, hd, N) -> fp32 (1, H, M, N). Output: (1, H, M, N) x (1, H, N, hd) -> bf16 in the
    // attention output's rows (1, M, H, hd), strided, which both layouts allow.
    const memory::desc q_rows({1, kHeads, kRows, kWidth}, dt::bf16, memory::dims{kRows * kRowStride, kWidth, kRowStride, 1});
    const memory::desc k_rows({1, kHeads, kWidth, n}, dt::bf16, memory::dims{n * kRowStride, kWidth, 1, kRowStride});
    const memory::desc v_rows({1, kHeads, n, kWidth}, dt::bf16, memory::dims{n * kRowStride, kWidth, kRowStride, 1});
    const memory::desc q_dense({1, kHeads, kRows, kWidth}, dt::bf16, memory::format_tag::abcd);
    const memory::desc k_dense({1, kHeads, kWidth, n}, dt::bf16, memory::format_tag::abdc);
    const memory::desc v_dense({1, kHeads, n, kWidth}, dt::bf16, memory::format_tag::abcd);
    const memory::desc s_desc({1, kHeads, kRows, n}, dt::f32, memory::format_tag::abcd);
    const memory::desc p_desc({1, kHeads, kRows, n}, dt::bf16, memory::format_tag::abcd);
    const memory::desc o_desc({1, kHeads, kRows, kWidth}, dt::bf16, memory::dims{kRows * kC, kWidth, kC, 1});
    struct Way {
      memory::desc a, b, c;
      void *pa, *pb, *pc;
    };
    auto time = [&](const Way& w, const char** impl) {
      const matmul::primitive_desc pd(matmul::desc(w.a, w.b, w.c), eng);
      *impl = pd.impl_info_str();
      const matmul prim(pd);
      const memory a(w.a, eng, w.pa), b(w.b, eng, w.pb), c(w.c, eng, w.pc);
      return best_us([&] {
        prim.execute(s, {{DNNL_ARG_SRC, a}, {DNNL_ARG_WEIGHTS, b}, {DNNL_ARG_DST, c}});
        s.wait();
      });
    };
    const Way ways[2][2] = {
        {{q_rows, k_rows, s_desc, qkv.data(), qkv.data() + kC, scores.data()},
         {q_dense, k_dense, s_desc, qd.data(), kd.data(), scores.data()}},
        {{p_desc, v_rows, o_desc, p.data(), qkv.data() + 2 * kC, out.data()},
         {p_desc, v_dense, o_desc, p.data(), vd.data(), out.data()}},
    };
    // What the dense way adds per block: the block's q per head (scores), and k or v per head
    // for all n keys (an upper bound: a sequence's k and v would be copied once for its blocks).
    const double copy_scores = best_us([&] {
      copy_heads(qd.data(), qkv.data(), kRows, 0);
      copy_heads(kd.data(), qkv.data(), n, kC);
    });
    const double copy_values = best_us([&] { copy_heads(vd.data(), qkv.data(), n, 2 * kC); });
    const char* names[2] = {"scores", "output"};
    const double copies[2] = {copy_scores, copy_values};
    for (int k = 0; k < 2; ++k) {
      const char *impl_rows, *impl_dense;
      const double rows_us = time(ways[k][0], &impl_rows), dense_us = time(ways[k][1], &impl_dense);
      std::printf("%-7s %5ld  %-26s %9.1f %8.0f  %-26s %9.1f %8.0f  %.1f\n", names[k], n, impl_rows, rows_us,
                  flops / rows_us / 1e3, impl_dense, dense_us, flops / dense_us / 1e3, copies[k]);
    }
  }
  // Gradients: A (dS, or dS^T for dk) of a block's rows against N keys, dense; B (k, or the
  // block's q) dense; C fp32 into the rows (row stride 3 C) or a dense block; dk sums (+=).
  std::vector<std::uint16_t> ds(kHeads * kRows * 1024, 0x3c00), dense(kHeads * 1024 * kWidth, 0x3c00);
  std::vector<float> grads(1024 * kRowStride), block(kHeads * 1024 * kWidth);
  std::printf("\n%-7s %5s  %-26s %9s %8s  %-26s %9s %8s\n", "product", "keys", "into the rows", "us", "GFLOP/s",
              "into a dense block", "us", "GFLOP/s");
  for (long n : {128L, 256L, 512L, 1024L}) {
    const double flops = 2.0 * kHeads * kRows * kWidth * n;
    const memory::desc dq_rows({1, kHeads, kRows, kWidth}, dt::f32, memory::dims{kRows * kRowStride, kWidth, kRowStride, 1});
    const memory::desc dq_dense({1, kHeads, kRows, kWidth}, dt::f32, memory::format_tag::abcd);
    const memory::desc dk_rows({1, kHeads, n, kWidth}, dt::f32, memory::dims{n * kRowStride, kWidth, kRowStride, 1});
    const memory::desc dk_dense({1, kHeads, n, kWidth}, dt::f32, memory::format_tag::abcd);
    const memory::desc ds_desc({1, kHeads, kRows, n}, dt::bf16, memory::format_tag::abcd);
    const memory::desc ds_t({1, kHeads, n, kRows}, dt::bf16, memory::dims{kRows * n, kRows * n, 1, n});  // read transposed
    const memory::desc ds_copied({1, kHeads, n, kRows}, dt::bf16, memory::format_tag::abcd);            // copied so
    const memory::desc keys({1, kHeads, n, kWidth}, dt::bf16, memory::format_tag::abcd);
    const memory::desc rows_q({1, kHeads, kRows, kWidth}, dt::bf16, memory::format_tag::abcd);
    auto time = [&](const memory::desc& a, const memory::desc& b, const memory::desc& c, void* pc, bool sum,
                    const char** impl) {
      primitive_attr attr;
      post_ops ops;
      if (sum) ops.append_sum(1.0f);
      attr.set_post_ops(ops);
      const matmul::primitive_desc pd(matmul::desc(a, b, c), attr, eng);
      *impl = pd.impl_info_str();
      const matmul prim(pd);
      const memory ma(a, eng, ds.data()), mb(b, eng, dense.data()), mc(c, eng, pc);
      return best_us([&] {
        prim.execute(s, {{DNNL_ARG_SRC, ma}, {DNNL_ARG_WEIGHTS, mb}, {DNNL_ARG_DST, mc}});
        s.wait();
      });
    };
    struct Row {
      const char* name;
      memory::desc a, b, rows, dense;
      bool sum;
    };
    const Row rows[] = {{"dq", ds_desc, keys, dq_rows, dq_dense, false},
                        {"dk, dS^T", ds_t, rows_q, dk_rows, dk_dense, true},
                        {"dk, copy", ds_copied, rows_q, dk_rows, dk_dense, true}};
    for (const Row& r : rows) {
      const char *impl_rows, *impl_dense;
      const double rows_us = time(r.a, r.b, r.rows, grads.data(), r.sum, &impl_rows);
      const double dense_us = time(r.a, r.b, r.dense, block.data(), r.sum, &impl_dense);
      std::printf("%-8s %4ld  %-26s %9.1f %8.0f  %-26s %9.1f %8.0f\n", r.name, n, impl_rows, rows_us,
                  flops / rows_us / 1e3, impl_dense, dense_us, flops / dense_us / 1e3);
    }
  }
}
