#include "lamina/kernels/ring_attention.hpp"

#include "lamina/kernels/bf16.hpp"

#include "attention_reference.hpp"
#include "test_util.hpp"

namespace lamina::test {
namespace {

double bf16(double x) { return from_bf16(to_bf16(static_cast<float>(x))); }

template <class Exec>
class RingAttentionTest : public ::testing::Test {};
TYPED_TEST_SUITE(RingAttentionTest, ExecSpaces);

TEST(ContextChunks, EachRankHoldsAnEarlyAndTheMirroredLateChunk) {
  // T = 16 over cp 2: chunks of 4, rank 0 holds positions 0-3 and 12-15, rank 1 4-7 and 8-11.
  const ContextChunks r0{16, 2, 0}, r1{16, 2, 1};
  EXPECT_EQ(r0.rows(), 8);
  const std::vector<std::int64_t> want0{0, 1, 2, 3, 12, 13, 14, 15}, want1{4, 5, 6, 7, 8, 9, 10, 11};
  for (std::int64_t t = 0; t < 8; ++t) {
    EXPECT_EQ(r0.position(t), want0[t]);
    EXPECT_EQ(r1.position(t), want1[t]);
  }
  const ContextChunks whole{7, 1, 0};
  for (std::int64_t t = 0; t < 7; ++t) EXPECT_EQ(whole.position(t), t);
}

// Every rank of a context-parallel group of cp, its keys and values met one source at a time
// in the ring's order (the source's packed rows, as they would arrive), against the
// whole-sequence double reference at each rank's positions: the outputs, and the gradients of
// q (the rank's own) and of k and v (summed on their owner's buffer as it travels the ring).
// A chunk of 40 positions spans two key blocks of the fused kernels, the second partial.
template <class Exec, class T>
void check_ring(int cp, int NKV, bool stored_bf16) {
  SCOPED_TRACE("cp " + std::to_string(cp) + ", " + std::to_string(NKV) + " key/value heads" +
               (stored_bf16 ? ", bf16" : ""));
  const int B = 2, C = 8, NH = 2, hd = C / NH, Tn = 2 * cp * 40, Tl = Tn / cp, N = B * Tn, n = B * Tl;
  const int W = C + 2 * NKV * hd, KV = 2 * NKV * hd;
  auto qkv = random_vector(N * W, 61, -2.0, 2.0);
  if (stored_bf16) qkv = bf16_values(qkv);
  const auto dout = random_vector(N * C, 62);
  std::vector<double> want, want_dqkv;
  attention_reference(qkv, dout, B, Tn, C, NH, want, want_dqkv, identity, nullptr, stored_bf16 ? bf16 : nullptr, NKV);

  // Rank r's rows of a (B*T, width) matrix.
  auto rows_of = [&](const std::vector<double>& whole, int width, int r) {
    const ContextChunks chunks{Tn, cp, r};
    std::vector<double> local(static_cast<std::size_t>(n) * width);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        const std::int64_t from = (b * Tn + chunks.position(t)) * width;
        std::copy(whole.begin() + from, whole.begin() + from + width, local.begin() + (b * Tl + t) * width);
      }
    }
    return local;
  };
  auto stored = [&](const std::vector<double>& v) {
    Kokkos::View<T*, Kokkos::LayoutRight, typename Exec::memory_space> d("stored", v.size());
    auto h = Kokkos::create_mirror_view(d);
    for (std::size_t i = 0; i < v.size(); ++i) put(h(i), static_cast<float>(v[i]));
    Kokkos::deep_copy(d, h);
    return d;
  };
  auto widened = [&](const auto& d) {
    auto h = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), d);
    std::vector<double> v(h.extent(0));
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = widen(h(i));
    return v;
  };
  using Stored = Kokkos::View<T*, Kokkos::LayoutRight, typename Exec::memory_space>;
  std::vector<Stored> q(cp), kv(cp), out(cp), lse(cp);
  std::vector<Vec<Exec>> dqkv(cp), dkv(cp), dd(cp);
  for (int r = 0; r < cp; ++r) {
    q[r] = stored(rows_of(qkv, W, r));
    kv[r] = Stored("kv", n * KV);
    out[r] = Stored("out", n * C);
    lse[r] = Stored("lse", B * NH * Tl * 2);
    dqkv[r] = Vec<Exec>("dqkv", n * W);
    dkv[r] = Vec<Exec>("dkv", n * KV);
    dd[r] = to_device<Exec>(rows_of(dout, C, r));
    ring_pack_keys_values(Exec(), as_mat_of<Exec>(kv[r].data(), n, KV), as_mat_of<Exec>(q[r].data(), n, W));
  }
  const Exec exec;
  for (int r = 0; r < cp; ++r) {
    const ContextChunks chunks{Tn, cp, r};
    const Vec<Exec> y("y", n * C), running("lse", B * NH * Tl);
    const RingAttentionState<Exec> acc{as_mat<Exec>(y.data(), n, C), as_mats<Exec>(running.data(), B * NH, Tl, 1)};
    ring_attention_begin(exec, acc);
    for (int step = 0; step < cp; ++step) {
      const int source = (r - step + cp) % cp;
      ring_attention_forward(exec, acc, as_mat_of<Exec>(q[r].data(), n, W), as_mat_of<Exec>(kv[source].data(), n, KV),
                             NH, chunks, source);
    }
    ring_attention_end(exec, as_mat_of<Exec>(out[r].data(), n, C), as_mats_of<Exec>(lse[r].data(), B * NH, Tl, 2),
                       acc);
    const auto got = widened(out[r]), wanted = rows_of(want, C, r);
    if (stored_bf16) {
      for (int i = 0; i < n * C; ++i) EXPECT_NEAR(got[i], wanted[i], std::abs(wanted[i]) / 128 + 1e-5) << i;
    } else {
      EXPECT_LT(rel_error(got, wanted), 1e-5) << "rank " << r;
    }
  }
  for (int r = 0; r < cp; ++r) {
    const ContextChunks chunks{Tn, cp, r};
    for (int step = 0; step < cp; ++step) {
      const int source = (r - step + cp) % cp;
      ring_attention_backward(exec, as_mat<Exec>(dqkv[r].data(), n, W), as_mat<Exec>(dkv[source].data(), n, KV),
                              as_mat<Exec>(dd[r].data(), n, C), as_mat_of<Exec>(q[r].data(), n, W),
                              as_mat_of<Exec>(kv[source].data(), n, KV), as_mat_of<Exec>(out[r].data(), n, C),
                              as_mats_of<Exec>(lse[r].data(), B * NH, Tl, 2), NH, chunks, source);
    }
  }
  for (int r = 0; r < cp; ++r) {
    ring_unpack_key_value_gradients(exec, as_mat<Exec>(dqkv[r].data(), n, W), as_mat<Exec>(dkv[r].data(), n, KV));
    EXPECT_LT(rel_error(to_host(dqkv[r]), rows_of(want_dqkv, W, r)), stored_bf16 ? 1e-4 : 1e-5) << "rank " << r;
  }
}

TYPED_TEST(RingAttentionTest, EveryRanksChunksMatchWholeSequenceAttention) {
  using Exec = TypeParam;
  for (const int cp : {1, 2, 4}) {
    for (const int NKV : {2, 1}) check_ring<Exec, float>(cp, NKV, false);
  }
}

// bf16 storage (bf16 runs): q, k, v read and travelling as stored, the merged output and the
// log-sum-exps rounded once at the end, as the fused kernels' tests take them.
TYPED_TEST(RingAttentionTest, Bf16StorageTravelsAndIsWrittenAsStored) {
  using Exec = TypeParam;
  for (const int NKV : {2, 1}) check_ring<Exec, std::uint16_t>(2, NKV, true);
}

// Staged products under context parallelism: every rank places each source's packed keys and
// values at their positions, its queries meet them all in one batched product, and its
// gradients of every position are taken into each source's travelling buffer. Returns the
// whole sequences' output and dqkv, each rank's rows put back at their positions.
template <class Exec, class T>
std::pair<std::vector<double>, std::vector<double>> staged_ring(int cp, int NKV, ProductMath math,
                                                                const std::vector<double>& qkv,
                                                                const std::vector<double>& dout, int B, int Tn) {
  const int C = 8, NH = 2, hd = C / NH, Tl = Tn / cp, n = B * Tl, W = C + 2 * NKV * hd, KV = 2 * NKV * hd;
  const int BNH = B * NH, BKV = B * NKV;
  using Stored = Kokkos::View<T*, Kokkos::LayoutRight, typename Exec::memory_space>;
  auto nans = [](std::int64_t count) {
    return to_device<Exec>(std::vector<double>(static_cast<std::size_t>(std::max<std::int64_t>(1, count)),
                                               std::nan("")));
  };
  std::vector<Stored> q(cp), kv(cp), out(cp), att(cp);
  std::vector<Vec<Exec>> dqkv(cp), dkv(cp), dd(cp), heads(cp), copies(cp);
  std::vector<AttentionWorkspace<Exec>> ws(cp);
  const Exec exec;
  for (int r = 0; r < cp; ++r) {
    const ContextChunks chunks{Tn, cp, r};
    std::vector<double> rows(static_cast<std::size_t>(n) * W), drows(static_cast<std::size_t>(n) * C);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        const std::int64_t p = b * Tn + chunks.position(t);
        std::copy_n(qkv.begin() + p * W, W, rows.begin() + (b * Tl + t) * W);
        std::copy_n(dout.begin() + p * C, C, drows.begin() + (b * Tl + t) * C);
      }
    }
    Kokkos::View<T*, Kokkos::LayoutRight, typename Exec::memory_space> d("qkv", rows.size());
    auto h = Kokkos::create_mirror_view(d);
    for (std::size_t i = 0; i < rows.size(); ++i) put(h(i), static_cast<float>(rows[i]));
    Kokkos::deep_copy(d, h);
    q[r] = d;
    kv[r] = Stored("kv", n * KV);
    out[r] = Stored("out", n * C);
    att[r] = Stored("att", BNH * Tl * Tn);
    dqkv[r] = nans(n * W);
    dkv[r] = Vec<Exec>("dkv", n * KV);
    dd[r] = to_device<Exec>(drows);
    // q, y, dq: (B*NH, Tl, hd); k, v, dk, dv: (B*NKV, Tn, hd), of every position.
    heads[r] = nans(3 * BNH * Tl * hd + 4 * BKV * Tn * hd);
    float* p = heads[r].data();
    auto take = [&](std::int64_t count, std::int64_t rows_) {
      const Mats<Exec> m = as_mats<Exec>(p, count, rows_, hd);
      p += count * rows_ * hd;
      return m;
    };
    ws[r].q = take(BNH, Tl);
    ws[r].y = take(BNH, Tl);
    ws[r].dq = take(BNH, Tl);
    ws[r].k = take(BKV, Tn);
    ws[r].v = take(BKV, Tn);
    ws[r].dk = take(BKV, Tn);
    ws[r].dv = take(BKV, Tn);
    if constexpr (std::is_same<T, std::uint16_t>::value) {
      copies[r] = nans(attention_copies<Exec>(AttentionProducts::staged, math, B, Tl, NH, hd, NKV, Tn));
      place_attention_copies(ws[r], copies[r].data(), AttentionProducts::staged, math, B, Tl, NH, hd, NKV, Tn);
    }
    ring_pack_keys_values(exec, as_mat_of<Exec>(kv[r].data(), n, KV), as_mat_of<Exec>(q[r].data(), n, W));
  }
  auto place_all = [&](int r) {
    for (int step = 0; step < cp; ++step) {
      const int source = (r - step + cp) % cp;
      ring_place_keys_values(exec, ws[r], as_mat_of<Exec>(kv[source].data(), n, KV), ContextChunks{Tn, cp, r}, source,
                             math);
    }
  };
  for (int r = 0; r < cp; ++r) {
    place_all(r);
    attention_forward(exec, as_mat_of<Exec>(out[r].data(), n, C), as_mats_of<Exec>(att[r].data(), BNH, Tl, Tn),
                      as_mat_of<Exec>(q[r].data(), n, W), ws[r], NH, AttentionProducts::staged, math,
                      ContextChunks{Tn, cp, r});
  }
  for (int r = 0; r < cp; ++r) {
    const ContextChunks chunks{Tn, cp, r};
    place_all(r);
    const auto datt = nans(BNH * Tl * Tn);
    attention_backward(exec, as_mat<Exec>(dqkv[r].data(), n, W), as_mats<Exec>(datt.data(), BNH, Tl, Tn),
                       as_mat<Exec>(dd[r].data(), n, C), as_mat_of<Exec>(q[r].data(), n, W),
                       as_mat_of<Exec>(out[r].data(), n, C), as_mats_of<Exec>(att[r].data(), BNH, Tl, Tn), ws[r], NH,
                       AttentionProducts::staged, math, chunks);
    for (int step = 0; step < cp; ++step) {
      const int source = (r - step + cp) % cp;
      ring_take_key_value_gradients(exec, as_mat<Exec>(dkv[source].data(), n, KV), ws[r].dk, ws[r].dv, chunks, source);
    }
  }
  std::vector<double> whole_out(static_cast<std::size_t>(B) * Tn * C), whole_dqkv(static_cast<std::size_t>(B) * Tn * W);
  for (int r = 0; r < cp; ++r) {
    ring_unpack_key_value_gradients(exec, as_mat<Exec>(dqkv[r].data(), n, W), as_mat<Exec>(dkv[r].data(), n, KV));
    const ContextChunks chunks{Tn, cp, r};
    auto o = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), out[r]);
    const auto g = to_host(dqkv[r]);
    for (int b = 0; b < B; ++b) {
      for (int t = 0; t < Tl; ++t) {
        const std::int64_t p = b * Tn + chunks.position(t), i = b * Tl + t;
        for (int c = 0; c < C; ++c) whole_out[p * C + c] = widen(o(i * C + c));
        std::copy_n(g.begin() + i * W, W, whole_dqkv.begin() + p * W);
      }
    }
  }
  return {whole_out, whole_dqkv};
}

// fp32: every rank's rows against the whole-sequence double reference (chunks of 40
// positions, as check_ring's).
TYPED_TEST(RingAttentionTest, StagedProductsOfEveryRankMatchWholeSequenceAttention) {
  using Exec = TypeParam;
  const int B = 2, C = 8, NH = 2, hd = C / NH;
  for (const int cp : {1, 2, 4}) {
    for (const int NKV : {2, 1}) {
      SCOPED_TRACE("cp " + std::to_string(cp) + ", " + std::to_string(NKV) + " key/value heads");
      const int Tn = 2 * cp * 40, W = C + 2 * NKV * hd;
      const auto qkv = random_vector(B * Tn * W, 63, -2.0, 2.0), dout = random_vector(B * Tn * C, 64);
      std::vector<double> want, want_dqkv;
      attention_reference(qkv, dout, B, Tn, C, NH, want, want_dqkv, identity, nullptr, nullptr, NKV);
      const auto [out, dqkv] = staged_ring<Exec, float>(cp, NKV, ProductMath::fp32, qkv, dout, B, Tn);
      EXPECT_LT(rel_error(out, want), 1e-5);
      EXPECT_LT(rel_error(dqkv, want_dqkv), 1e-5);
    }
  }
}

// bf16 storage, staged products in bf16 (where the space has a bf16 engine) and in fp32 (on
// fp32 copies): cp 2 and 4 as the whole sequence on one rank, which AttentionTest checks
// against the reference: outputs within a bf16 step, gradients within what a rounded
// probability's flip moves (AttentionTest's 1e-4).
TYPED_TEST(RingAttentionTest, StagedProductsOnBf16StorageAsOneRanks) {
  using Exec = TypeParam;
  const int B = 2, C = 8, NH = 2, hd = C / NH, NKV = 1, Tn = 160, W = C + 2 * NKV * hd;
  const auto qkv = bf16_values(random_vector(B * Tn * W, 65, -2.0, 2.0)), dout = random_vector(B * Tn * C, 66);
  for (const ProductMath math : {ProductMath::bf16, ProductMath::fp32}) {
    const auto [one, one_dqkv] = staged_ring<Exec, std::uint16_t>(1, NKV, math, qkv, dout, B, Tn);
    for (const int cp : {2, 4}) {
      SCOPED_TRACE("cp " + std::to_string(cp) + (math == ProductMath::bf16 ? ", bf16 products" : ", fp32 products"));
      const auto [out, dqkv] = staged_ring<Exec, std::uint16_t>(cp, NKV, math, qkv, dout, B, Tn);
      for (std::size_t i = 0; i < out.size(); ++i) EXPECT_NEAR(out[i], one[i], std::abs(one[i]) / 128 + 1e-6) << i;
      EXPECT_LT(rel_error(dqkv, one_dqkv), 1e-4);
    }
  }
}

}  // namespace
}  // namespace lamina::test
