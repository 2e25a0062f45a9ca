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

}  // namespace
}  // namespace lamina::test
