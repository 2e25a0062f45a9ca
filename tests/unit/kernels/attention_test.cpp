#include "lamina/kernels/attention.hpp"

#include "lamina/kernels/bf16.hpp"

#include "attention_reference.hpp"
#include "fd_check.hpp"

namespace lamina::test {
namespace {

double bf16(double x) { return from_bf16(to_bf16(static_cast<float>(x))); }

// Attention's workspace, NaN-filled: what a path reads before it writes it shows.
template <class Exec>
struct HeadsScratch {
  std::int64_t BNH, T, hd;
  Vec<Exec> buf;
  HeadsScratch(std::int64_t bnh, std::int64_t t, std::int64_t d)
      : BNH(bnh), T(t), hd(d), buf(to_device<Exec>(std::vector<double>(bnh * t * (7 * d + t), std::nan("")))) {}
  AttentionWorkspace<Exec> heads() const {
    auto at = [&](int i) { return as_mats<Exec>(buf.data() + i * BNH * T * hd, BNH, T, hd); };
    AttentionWorkspace<Exec> w;
    w.q = at(0);
    w.k = at(1);
    w.v = at(2);
    w.y = at(3);
    w.dq = at(4);
    w.dk = at(5);
    w.dv = at(6);
    w.probs = as_mats<Exec>(buf.data() + 7 * BNH * T * hd, BNH, T, T);
    return w;
  }
};

template <class Exec>
class AttentionTest : public ::testing::Test {};
TYPED_TEST_SUITE(AttentionTest, ExecSpaces);

constexpr AttentionProducts kPaths[] = {AttentionProducts::in_place, AttentionProducts::staged,
                                        AttentionProducts::fused};

// Multi-head (NKV = NH) and multi-query (NKV = 1) attention.
TYPED_TEST(AttentionTest, ForwardAndBackwardMatchDoubleReferenceAndFiniteDifferences) {
  using Exec = TypeParam;
  const int B = 2, T = 5, C = 8, NH = 2, hd = C / NH, N = B * T, BNH = B * NH;
  for (const int NKV : {NH, 1}) {
    const int W = C + 2 * NKV * hd;
    const auto qkv = random_vector(N * W, 41, -1.5, 1.5), dout = random_vector(N * C, 42);
    std::vector<double> want, want_dqkv;
    attention_reference(qkv, dout, B, T, C, NH, want, want_dqkv, identity, nullptr, nullptr, NKV);
    for (const AttentionProducts how : kPaths) {
      SCOPED_TRACE(std::string(attention_products_name(how)) + ", " + std::to_string(NKV) + " key/value heads");
      const HeadsScratch<Exec> scratch(BNH, T, hd);
      Vec<Exec> att("att", BNH * T * T), out("out", N * C), saved("qkv", N * W);
      const Mats<Exec> saved_att = as_mats<Exec>(att.data(), BNH, T, saved_attention_columns(how, T));
      auto run = [&](const std::vector<double>& in) {
        saved = to_device<Exec>(in);
        attention_forward(Exec(), as_mat<Exec>(out.data(), N, C), saved_att, as_mat<Exec>(saved.data(), N, W),
                          scratch.heads(), NH, how);
        return to_host(out);
      };
      EXPECT_LT(rel_error(run(qkv), want), 1e-6);
      auto dd = to_device<Exec>(dout);
      Vec<Exec> dqkv("dqkv", N * W), datt("datt", BNH * T * T);
      attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, W), as_mats<Exec>(datt.data(), BNH, T, T),
                         as_mat<Exec>(dd.data(), N, C), as_mat<Exec>(saved.data(), N, W),
                         as_mat<Exec>(out.data(), N, C), saved_att, scratch.heads(), NH, how);
      const auto got = to_host(dqkv);
      EXPECT_LT(rel_error(got, want_dqkv), 1e-5);
      expect_fd_matches([&](const std::vector<double>& in) { return dot(run(in), dout); }, qkv, got, "dqkv", 30);
    }
  }
}

// Every path against the double reference on (B, T, C, NH); the score buffers start as NaN,
// so reading any entry the causal products skip, or that fused products never write, would
// show.
template <class Exec>
void expect_every_path_matches(int B, int T, int C, int NH, std::uint32_t seed, int NKV = 0) {
  const int hd = C / NH, N = B * T, BNH = B * NH, KV = NKV == 0 ? NH : NKV, W = C + 2 * KV * hd;
  const auto qkv = random_vector(N * W, seed, -1.5, 1.5), dout = random_vector(N * C, seed + 1);
  std::vector<double> want, want_dqkv;
  attention_reference(qkv, dout, B, T, C, NH, want, want_dqkv, identity, nullptr, nullptr, NKV);
  const std::vector<double> nan(BNH * T * T, std::nan(""));
  for (const AttentionProducts how : kPaths) {
    SCOPED_TRACE(attention_products_name(how));
    const HeadsScratch<Exec> scratch(BNH, T, hd);
    auto att = to_device<Exec>(nan), datt = to_device<Exec>(nan), saved = to_device<Exec>(qkv),
         dd = to_device<Exec>(dout);
    const Mats<Exec> saved_att = as_mats<Exec>(att.data(), BNH, T, saved_attention_columns(how, T));
    Vec<Exec> out("out", N * C), dqkv("dqkv", N * W);
    // As in the workspace: the staged backward's copies of q, k, v share dqkv's memory.
    AttentionWorkspace<Exec> dheads = scratch.heads();
    dheads.q = as_mats<Exec>(dqkv.data(), BNH, T, hd);
    dheads.k = as_mats<Exec>(dqkv.data() + N * C, B * KV, T, hd);
    dheads.v = as_mats<Exec>(dqkv.data() + N * (C + KV * hd), B * KV, T, hd);
    attention_forward(Exec(), as_mat<Exec>(out.data(), N, C), saved_att, as_mat<Exec>(saved.data(), N, W),
                      scratch.heads(), NH, how);
    EXPECT_LT(rel_error(to_host(out), want), 1e-5);
    attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, W), as_mats<Exec>(datt.data(), BNH, T, T),
                       as_mat<Exec>(dd.data(), N, C), as_mat<Exec>(saved.data(), N, W),
                       as_mat<Exec>(out.data(), N, C), saved_att, dheads, NH, how);
    EXPECT_LT(rel_error(to_host(dqkv), want_dqkv), 1e-5);
    EXPECT_LT(rel_error(to_host(saved), qkv), 1e-7) << "the saved qkv rows changed";
  }
  // A device's fused kernels, which team scratch runs on every execution space.
  SCOPED_TRACE("team scratch");
  auto lse = to_device<Exec>(std::vector<double>(BNH * T * 2, std::nan(""))), saved = to_device<Exec>(qkv),
       dd = to_device<Exec>(dout);
  Vec<Exec> out("out", N * C), dqkv("dqkv", N * W);
  flash_attention_forward(Exec(), as_mat<Exec>(out.data(), N, C), as_mats<Exec>(lse.data(), BNH, T, 2),
                          as_mat<Exec>(saved.data(), N, W), NH);
  EXPECT_LT(rel_error(to_host(out), want), 1e-5);
  flash_attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, W), as_mat<Exec>(dd.data(), N, C),
                           as_mat<Exec>(saved.data(), N, W), as_mat<Exec>(out.data(), N, C),
                           as_mats<Exec>(lse.data(), BNH, T, 2), NH);
  EXPECT_LT(rel_error(to_host(dqkv), want_dqkv), 1e-5);
}

// Long enough for row blocks of 32 (four whole, one partial).
TYPED_TEST(AttentionTest, LongSequencesMatchDoubleReferenceWithoutReadingMaskedScores) {
  expect_every_path_matches<TypeParam>(2, 150, 16, 2, 45);
}

// Grouped-query attention (two query heads per key/value head, Llama 3's kind) and
// multi-query attention (one key/value head for four query heads): every path reads each
// key/value head for its query heads in place and sums their gradients into it.
TYPED_TEST(AttentionTest, GroupedAndMultiQueryAttentionMatchDoubleReference) {
  expect_every_path_matches<TypeParam>(2, 70, 32, 4, 56, 2);
  expect_every_path_matches<TypeParam>(2, 40, 32, 4, 57, 1);
}

// GPT-2's head width: the fused backward passes' scratch exceeds a host team's level 0
// (32 KiB) and comes from level 1, as on a GPU.
TYPED_TEST(AttentionTest, WideHeadsMatchDoubleReference) { expect_every_path_matches<TypeParam>(1, 70, 128, 2, 47); }

// Fused products save each row's log-sum-exp in two parts so that storing the saved
// activations in bf16 (mixed precision) leaves the recomputed probabilities accurate; the
// high part alone would not. Both implementations: host BLAS and team scratch.
TYPED_TEST(AttentionTest, FusedLogSumExpSurvivesBf16Storage) {
  using Exec = TypeParam;
  const int B = 1, T = 40, C = 16, NH = 2, hd = C / NH, N = B * T, BNH = B * NH;
  // Large scores, as in a trained model: log-sum-exps far from zero.
  const auto qkv = random_vector(N * 3 * C, 48, -3.0, 3.0), dout = random_vector(N * C, 49);
  std::vector<double> want, want_dqkv;
  attention_reference(qkv, dout, B, T, C, NH, want, want_dqkv);
  for (const bool team : {false, true}) {
    SCOPED_TRACE(team ? "team scratch" : "attention_forward/backward");
    auto saved = to_device<Exec>(qkv), dd = to_device<Exec>(dout);
    Vec<Exec> out("out", N * C), lse("lse", BNH * T * 2), dqkv("dqkv", N * 3 * C), datt("datt", BNH * T * T);
    const Mat<Exec> o = as_mat<Exec>(out.data(), N, C), rows = as_mat<Exec>(saved.data(), N, 3 * C);
    const Mats<Exec> saved_lse = as_mats<Exec>(lse.data(), BNH, T, 2);
    const HeadsScratch<Exec> scratch(BNH, T, hd);
    if (team) {
      flash_attention_forward(Exec(), o, saved_lse, rows, NH);
    } else {
      attention_forward(Exec(), o, saved_lse, rows, scratch.heads(), NH, AttentionProducts::fused);
    }
    round_to_bf16(Exec(), lse);
    auto backward_error = [&] {
      const Mat<Exec> g = as_mat<Exec>(dqkv.data(), N, 3 * C), dy = as_mat<Exec>(dd.data(), N, C);
      if (team) {
        flash_attention_backward(Exec(), g, dy, rows, o, saved_lse, NH);
      } else {
        attention_backward(Exec(), g, as_mats<Exec>(datt.data(), BNH, T, T), dy, rows, o, saved_lse, scratch.heads(),
                           NH, AttentionProducts::fused);
      }
      return rel_error(to_host(dqkv), want_dqkv);
    };
    EXPECT_LT(backward_error(), 1e-4);
    auto host = to_host(lse);
    for (int r = 0; r < BNH * T; ++r) host[2 * r + 1] = 0.0;
    Kokkos::deep_copy(lse, to_device<Exec>(host));
    EXPECT_GT(backward_error(), 1e-3) << "the high part alone should be visibly worse (the test would not see a loss)";
  }
}

// Staged products in bf16 read rounded operands where the device's BLAS runs them (visibly
// off the double reference, within bf16's rounding) and are fp32 products elsewhere.
TYPED_TEST(AttentionTest, StagedProductsInBf16RoundOperandsOnlyWhereTheDeviceRunsThem) {
  using Exec = TypeParam;
  const int B = 2, T = 40, C = 16, NH = 2, hd = C / NH, N = B * T, BNH = B * NH;
  const auto qkv = random_vector(N * 3 * C, 50, -1.5, 1.5), dout = random_vector(N * C, 51);
  std::vector<double> want, want_dqkv;
  attention_reference(qkv, dout, B, T, C, NH, want, want_dqkv);
  const HeadsScratch<Exec> scratch(BNH, T, hd);
  auto saved = to_device<Exec>(qkv), dd = to_device<Exec>(dout);
  Vec<Exec> att("att", BNH * T * T), out("out", N * C), dqkv("dqkv", N * 3 * C), datt("datt", BNH * T * T);
  const Mats<Exec> probs = as_mats<Exec>(att.data(), BNH, T, T);
  attention_forward(Exec(), as_mat<Exec>(out.data(), N, C), probs, as_mat<Exec>(saved.data(), N, 3 * C),
                    scratch.heads(), NH, AttentionProducts::staged, ProductMath::bf16);
  attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, 3 * C), as_mats<Exec>(datt.data(), BNH, T, T),
                     as_mat<Exec>(dd.data(), N, C), as_mat<Exec>(saved.data(), N, 3 * C),
                     as_mat<Exec>(out.data(), N, C), probs, scratch.heads(), NH, AttentionProducts::staged,
                     ProductMath::bf16);
  for (const auto& [got, ref, name] : {std::make_tuple(to_host(out), want, "out"),
                                       std::make_tuple(to_host(dqkv), want_dqkv, "dqkv")}) {
    const double e = rel_error(got, ref);
    if (kDeviceBlas<Exec>) {
      EXPECT_GT(e, 1e-5) << name << ": the products did not round their operands";
      EXPECT_LT(e, 3e-2) << name;
    } else {
      EXPECT_LT(e, 1e-5) << name;
    }
  }
}

// Attention on bf16 storage (bf16 runs): qkv, the output and what is saved (probabilities,
// or log-sum-exps) in bf16. With bf16 products the in-place and fused ways run on a host's
// oneDNN (a CPU with bf16 instructions) and the staged way on the bf16 engine (cuBLAS or
// oneDNN) reading the storage as it is: against a double reference that rounds the same
// operands (the staged way's score gradients with attention's scale), visibly off the exact
// one. The backward
// reference reads the probabilities as the kernel saved them, each checked within a bf16
// step of the exact one: a probability computed in fp32 and in double may round to
// neighbouring bf16 values (on an H100 that moved the staged fp32 way's dqkv 1.8e-5 with one
// key/value head when the reference rounded its own). Operands rounded inside the products
// (a probability, a score gradient) can flip the same way: each flip moves a result by up to
// 2^-8 of one term, 1e-5 measured, so 1e-4 is tight next to the 3e-3 between bf16 and exact
// operands. A device's fused kernels read and write the storage as they are, every other way
// (fp32 products) runs on fp32 copies of it: against the reference of the stored q, k, v and
// saved probabilities, fp32 products. Three row
// blocks (the last partial); score, probability and copy buffers start as NaN, so a read
// of anything not written shows. The output, rounded into storage, within a bf16 step (a
// flip moves it to the neighbouring value).
TYPED_TEST(AttentionTest, Bf16StorageMatchesAReferenceOfTheStoredAndRoundedOperands) {
  using Exec = TypeParam;
  const int B = 2, T = 150, C = 16, NH = 2, hd = C / NH, N = B * T, BNH = B * NH;
  for (const int NKV : {NH, 1}) {  // multi-head and multi-query
  const int W = C + 2 * NKV * hd;
  const auto qkv = random_vector(N * W, 52, -1.5, 1.5), dout = random_vector(N * C, 53);
  const auto stored_qkv = bf16_values(qkv);
  std::vector<double> exact, exact_dqkv;
  attention_reference(qkv, dout, B, T, C, NH, exact, exact_dqkv, identity, nullptr, nullptr, NKV);
  for (const ProductMath math : {ProductMath::bf16, ProductMath::fp32}) {
    for (const AttentionProducts how : {AttentionProducts::in_place, AttentionProducts::fused, AttentionProducts::staged}) {
      if (how == AttentionProducts::in_place && !kAttentionInPlace<Exec>) continue;
      SCOPED_TRACE(std::string(attention_products_name(how)) + (math == ProductMath::bf16 ? ", bf16" : ", fp32") +
                   ", " + std::to_string(NKV) + " key/value heads");
      const bool native = attention_stores_bf16<Exec>(how, math);
      // Products that read bf16 operands: on a host's oneDNN, or staged on a bf16 engine.
      const bool rounds = attention_on_host_bf16<Exec>(how, math) || attention_staged_bf16<Exec>(how, math);
      const bool saved_probabilities = how != AttentionProducts::fused;
      HeadsScratch<Exec> scratch(BNH, T, hd);
      AttentionWorkspace<Exec> heads = scratch.heads();
      const std::int64_t cols = saved_attention_columns(how, T);
      auto nan_vec = [](std::int64_t n) {
        return to_device<Exec>(std::vector<double>(static_cast<std::size_t>(std::max<std::int64_t>(1, n)), std::nan("")));
      };
      heads.narrowed = nan_vec(attention_scratch<Exec>(how, math, B, T, NH, hd));
      const auto copies = nan_vec(attention_copies<Exec>(how, math, B, T, NH, hd, NKV, T));
      place_attention_copies(heads, copies.data(), how, math, B, T, NH, hd, NKV, T);
      auto qkv16 = to_device_bf16<Exec>(qkv);
      Bf16Vec<Exec> att("att", BNH * T * cols), out("out", N * C);
      Kokkos::deep_copy(att, std::uint16_t{0x7fc0});  // NaN
      auto datt = nan_vec(BNH * T * T), dd = to_device<Exec>(dout), dqkv = nan_vec(N * W);
      const Mat16<Exec> q16(qkv16.data(), N, W), o16(out.data(), N, C);
      const Mats16<Exec> saved(att.data(), BNH, T, cols);
      attention_forward(Exec(), o16, saved, q16, heads, NH, how, math);
      attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, W), as_mats<Exec>(datt.data(), BNH, T, T),
                         as_mat<Exec>(dd.data(), N, C), q16, o16, saved, heads, NH, how, math);
      // The backward reference reads the probabilities as saved (in the reference's (b, h)
      // order; staged products keep staged_head's); they are checked against the exact ones
      // here, each within a bf16 step.
      std::vector<double> got_probs;
      if (saved_probabilities) {
        const auto stored = widened_to_host(att);
        got_probs.resize(stored.size());
        for (int b = 0; b < B; ++b) {
          for (int h = 0; h < NH; ++h) {
            const std::int64_t from =
                how == AttentionProducts::staged ? lamina::detail::staged_head(QkvLayout{NH, NKV, hd}, B, b, h)
                                                 : b * NH + h;
            std::copy_n(stored.begin() + from * T * T, T * T, got_probs.begin() + (b * NH + h) * T * T);
          }
        }
      }
      std::vector<double> want, want_dqkv, exact_probs;
      // A device's fused kernels take the softmax backward's row sums from the stored output.
      // Staged products on a bf16 engine write the scores and dP in bf16.
      attention_reference(stored_qkv, dout, B, T, C, NH, want, want_dqkv, rounds ? bf16 : identity,
                          saved_probabilities ? &got_probs : nullptr, native && !rounds ? bf16 : nullptr, NKV,
                          &exact_probs, attention_staged_bf16<Exec>(how, math) ? bf16 : identity);
      if (saved_probabilities) {
        double worst = 0;  // error over the allowed error, largest
        for (std::int64_t bh = 0; bh < BNH; ++bh) {
          for (int t = 0; t < T; ++t) {
            for (int j = 0; j <= t; ++j) {
              const std::size_t i = static_cast<std::size_t>((bh * T + t) * T + j);
              worst = std::max(worst, std::abs(got_probs[i] - exact_probs[i]) / (exact_probs[i] / 128 + 1e-7));
            }
          }
        }
        EXPECT_LE(worst, 1.0) << "saved probabilities";
      }
      const auto got = widened_to_host(out);
      for (int i = 0; i < N * C; ++i) EXPECT_NEAR(got[i], want[i], std::abs(want[i]) / 128 + 1e-5) << i;
      const auto got_dqkv = to_host(dqkv);
      if (rounds) {
        // Fused: the probabilities recomputed from log-sum-exps saved in bf16 (2^-18 relative).
        EXPECT_LT(rel_error(got_dqkv, want_dqkv), how == AttentionProducts::fused ? 3e-4 : 1e-4);
        EXPECT_GT(rel_error(got_dqkv, exact_dqkv), 1e-3) << "the products did not round their operands";
      } else {
        // fp32 products, or a device's fused kernels (fp32 whatever the products' math), which
        // recompute the probabilities from log-sum-exps whose low part was rounded (2^-18
        // relative).
        EXPECT_LT(rel_error(got_dqkv, want_dqkv), how == AttentionProducts::fused ? 1e-4 : 1e-5);
      }
      // dout already in bf16 (as a block's output projection writes it) is read as it is, where
      // it lies (the workspace refilled with NaN): dqkv bit for bit the path that rounds dout
      // into the workspace. Only attention on a host's oneDNN takes it.
      auto dout16 = to_device_bf16<Exec>(dout);
      auto dqkv16 = nan_vec(N * W);
      const auto backward16 = [&] {
        attention_backward(Exec(), as_mat<Exec>(dqkv16.data(), N, W), ConstMat16<Exec>(dout16.data(), N, C), q16, o16,
                           saved, heads, NH, how, math);
      };
      if (attention_on_host_bf16<Exec>(how, math)) {
        Kokkos::deep_copy(heads.narrowed, std::nanf(""));
        backward16();
        EXPECT_EQ(to_host(dqkv16), got_dqkv);
      } else {
        EXPECT_THROW(backward16(), std::logic_error);
      }
    }
  }
  }
}

// Grouped-query attention on bf16 storage is multi-head attention with each key/value head
// repeated for the query heads that read it: the same output, and key/value gradients that
// are the sums of the repeated heads' (a bf16 step apart at most where fp32 sums in another
// order round differently). Four query heads on two key/value heads, two row blocks (the
// last partial), every way: the host's oneDNN products batch member j of each group over
// the key/value heads, which a wrong head order or stride would mix up.
TYPED_TEST(AttentionTest, GroupedQueryHeadsAreRepeatedKeyValueHeads) {
  using Exec = TypeParam;
  const int B = 2, T = 150, C = 32, NH = 4, NKV = 2, G = NH / NKV, hd = C / NH, N = B * T, BNH = B * NH;
  const int Wg = C + 2 * NKV * hd, Wm = 3 * C;
  const auto qkv = random_vector(N * Wg, 56, -1.5, 1.5), dout = random_vector(N * C, 57);
  std::vector<double> repeated(static_cast<std::size_t>(N * Wm));
  for (int n = 0; n < N; ++n) {
    for (int c = 0; c < C; ++c) repeated[n * Wm + c] = qkv[n * Wg + c];
    for (int h = 0; h < NH; ++h) {
      for (int d = 0; d < hd; ++d) {
        for (int part = 1; part <= 2; ++part) {
          repeated[n * Wm + part * C + h * hd + d] = qkv[n * Wg + C + (part - 1) * NKV * hd + h / G * hd + d];
        }
      }
    }
  }
  for (const ProductMath math : {ProductMath::bf16, ProductMath::fp32}) {
    for (const AttentionProducts how : {AttentionProducts::in_place, AttentionProducts::fused, AttentionProducts::staged}) {
      if (how == AttentionProducts::in_place && !kAttentionInPlace<Exec>) continue;
      SCOPED_TRACE(std::string(attention_products_name(how)) + (math == ProductMath::bf16 ? ", bf16" : ", fp32"));
      // out, dqkv of attention with `kv` key/value heads on the rows `rows` (W wide)
      const auto run = [&](const std::vector<double>& rows, int kv) {
        const int W = C + 2 * kv * hd;
        HeadsScratch<Exec> scratch(BNH, T, hd);
        AttentionWorkspace<Exec> heads = scratch.heads();
        const std::int64_t cols = saved_attention_columns(how, T);
        auto vec = [](std::int64_t n) { return to_device<Exec>(std::vector<double>(std::max<std::int64_t>(1, n), 0.0)); };
        heads.narrowed = vec(attention_scratch<Exec>(how, math, B, T, NH, hd));
        const auto copies = vec(attention_copies<Exec>(how, math, B, T, NH, hd, kv, T));
        place_attention_copies(heads, copies.data(), how, math, B, T, NH, hd, kv, T);
        auto qkv16 = to_device_bf16<Exec>(rows);
        Bf16Vec<Exec> att("att", BNH * T * cols), out("out", N * C);
        auto datt = vec(BNH * T * T), dd = to_device<Exec>(dout), dqkv = vec(N * W);
        const Mat16<Exec> q16(qkv16.data(), N, W), o16(out.data(), N, C);
        const Mats16<Exec> saved(att.data(), BNH, T, cols);
        attention_forward(Exec(), o16, saved, q16, heads, NH, how, math);
        attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, W), as_mats<Exec>(datt.data(), BNH, T, T),
                           as_mat<Exec>(dd.data(), N, C), q16, o16, saved, heads, NH, how, math);
        return std::pair{widened_to_host(out), to_host(dqkv)};
      };
      const auto [grouped_out, grouped_d] = run(qkv, NKV);
      const auto [multi_out, multi_d] = run(repeated, NH);
      EXPECT_LT(rel_error(grouped_out, multi_out), 1e-3) << "output";
      std::vector<double> summed(static_cast<std::size_t>(N * Wg), 0.0);
      for (int n = 0; n < N; ++n) {
        for (int c = 0; c < C; ++c) summed[n * Wg + c] = multi_d[n * Wm + c];
        for (int h = 0; h < NH; ++h) {
          for (int d = 0; d < hd; ++d) {
            for (int part = 1; part <= 2; ++part) {
              summed[n * Wg + C + (part - 1) * NKV * hd + h / G * hd + d] += multi_d[n * Wm + part * C + h * hd + d];
            }
          }
        }
      }
      EXPECT_LT(rel_error(grouped_d, summed), 1e-4) << "dqkv";
    }
  }
}

// The fused kernels of a device (run here by the host's teams) on bf16 storage: q, k, v read
// as stored, the output and the log-sum-exps rounded into it, computing in fp32: against the
// reference of the stored q, k, v and output (the softmax backward's row sums dy . y read the
// stored y, as FlashAttention's do; the probabilities are recomputed from the two-part bf16
// log-sum-exps, 2^-18 relative).
TYPED_TEST(AttentionTest, FlashKernelsReadAndWriteBf16Storage) {
  using Exec = TypeParam;
  const int B = 2, C = 16, NH = 2, hd = C / NH, BNH = B * NH;
  // T = 150: several blocks of keys per row block, each key/value head read by two query heads.
  for (const auto& [T, NKV] : {std::pair{70, NH}, std::pair{70, 1}, std::pair{150, 1}}) {
    SCOPED_TRACE(std::to_string(NKV) + " key/value heads, " + std::to_string(T) + " positions");
    const int N = B * T;
    const int W = C + 2 * NKV * hd;
    const auto qkv = random_vector(N * W, 54, -3.0, 3.0), dout = random_vector(N * C, 55);
    std::vector<double> want, want_dqkv;
    attention_reference(bf16_values(qkv), dout, B, T, C, NH, want, want_dqkv, identity, nullptr, bf16, NKV);
    auto qkv16 = to_device_bf16<Exec>(qkv);
    auto dd = to_device<Exec>(dout);
    Bf16Vec<Exec> out("out", N * C), lse("lse", BNH * T * 2);
    Vec<Exec> dqkv("dqkv", N * W);
    const Mat16<Exec> q16(qkv16.data(), N, W), o16(out.data(), N, C);
    const Mats16<Exec> saved(lse.data(), BNH, T, 2);
    flash_attention_forward(Exec(), o16, saved, q16, NH);
    flash_attention_backward(Exec(), as_mat<Exec>(dqkv.data(), N, W), as_mat<Exec>(dd.data(), N, C), q16, o16, saved,
                             NH);
    const auto got = widened_to_host(out);
    for (int i = 0; i < N * C; ++i) EXPECT_NEAR(got[i], want[i], std::abs(want[i]) / 128 + 1e-5) << i;
    EXPECT_LT(rel_error(to_host(dqkv), want_dqkv), 1e-4);
  }
}

TYPED_TEST(AttentionTest, QkvBiasGradientSumsQAndVAndLeavesKExactlyZero) {
  using Exec = TypeParam;
  const int B = 2, T = 5, C = 8, NH = 2, N = B * T;
  const auto qkv = random_vector(N * 3 * C, 43, -1.5, 1.5), dout = random_vector(N * C, 44);
  std::vector<double> out, dqkv;
  attention_reference(qkv, dout, B, T, C, NH, out, dqkv);
  std::vector<double> want(3 * C, 0.25);
  for (int i = 0; i < N; ++i)
    for (int j = 0; j < 3 * C; ++j) want[j] += dqkv[i * 3 * C + j];
  for (int j = C; j < 2 * C; ++j) EXPECT_NEAR(want[j], 0.25, 1e-12) << "k bias gradient is not zero in the reference";
  auto dd = to_device<Exec>(dqkv);
  Vec<Exec> partials("partials", column_partials(N, 256));
  auto dbias = to_device<Exec>(std::vector<double>(3 * C, 0.25));
  Vec<Exec> sums("sums", 3 * C);  // zeroed
  add_column_sums(Exec(), sums, as_mat<Exec>(dd.data(), N, 3 * C), partials);
  qkv_bias_backward(Exec(), dbias, sums, NH, C / NH);
  const auto got = to_host(dbias);
  EXPECT_LT(rel_error(got, want), 1e-6);
  for (int j = C; j < 2 * C; ++j) EXPECT_EQ(got[j], 0.25);
}

}  // namespace
}  // namespace lamina::test
