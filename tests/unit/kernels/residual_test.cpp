#include "lamina/kernels/residual.hpp"

#include "test_util.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class ResidualTest : public ::testing::Test {};
TYPED_TEST_SUITE(ResidualTest, ExecSpaces);

// The backward of a residual is the identity on both branches (no kernel); forward is
// checked here, the joined gradient through layernorm_backward's dskip in layernorm_test.
TYPED_TEST(ResidualTest, ForwardAddsTheBranchAndItsBiasExactly) {
  using Exec = TypeParam;
  const int N = 7, C = 37;
  const auto a = random_vector(N * C, 61), b = random_vector(N * C, 62), bias = random_vector(C, 63);
  auto da = to_device<Exec>(a), db = to_device<Exec>(b), dbias = to_device<Exec>(bias);
  Vec<Exec> out("out", N * C);
  residual_forward(Exec(), as_mat<Exec>(out.data(), N, C), as_mat<Exec>(da.data(), N, C),
                   as_mat<Exec>(db.data(), N, C), dbias);
  const auto got = to_host(out);
  for (int i = 0; i < N; ++i) {
    for (int j = 0; j < C; ++j) {
      const float want = static_cast<float>(a[i * C + j]) +
                         (static_cast<float>(b[i * C + j]) + static_cast<float>(bias[j]));
      EXPECT_EQ(got[i * C + j], static_cast<double>(want)) << i << ", " << j;
    }
  }
}

// bf16 runs: the stream read and written as stored, the sum in fp32 rounded once.
TYPED_TEST(ResidualTest, Bf16StreamIsReadAndWrittenAsStored) {
  using Exec = TypeParam;
  const int N = 7, C = 37;
  const auto a = bf16_values(random_vector(N * C, 64)), b = random_vector(N * C, 65), bias = random_vector(C, 66);
  auto da = to_device_bf16<Exec>(a);
  auto db = to_device<Exec>(b), dbias = to_device<Exec>(bias);
  Bf16Vec<Exec> out("out", N * C);
  residual_forward(Exec(), Mat16<Exec>(out.data(), N, C), Mat16<Exec>(da.data(), N, C), as_mat<Exec>(db.data(), N, C),
                   dbias);
  const auto got = widened_to_host(out);
  for (int i = 0; i < N * C; ++i) {
    const float sum = static_cast<float>(a[i]) + (static_cast<float>(b[i]) + static_cast<float>(bias[i % C]));
    EXPECT_EQ(got[i], static_cast<double>(from_bf16(to_bf16(sum)))) << i;
  }
}

// A branch summed over the tensor-parallel shards in bf16 (parallel.tp_sums) is read as it is:
// the bits of an fp32 branch holding its values, into a stream stored in fp32 and in bf16.
TYPED_TEST(ResidualTest, ABf16BranchGivesTheBitsOfItsFp32Values) {
  using Exec = TypeParam;
  const int N = 7, C = 37;
  const auto a = bf16_values(random_vector(N * C, 67)), b = bf16_values(random_vector(N * C, 68));
  const auto bias = random_vector(C, 69);
  auto da = to_device<Exec>(a), db = to_device<Exec>(b), dbias = to_device<Exec>(bias);
  auto da16 = to_device_bf16<Exec>(a), db16 = to_device_bf16<Exec>(b);
  const ConstMat<Exec> bm = as_mat<Exec>(db.data(), N, C);
  const ConstMat16<Exec> b16(db16.data(), N, C);
  Vec<Exec> out("out", N * C), out_b16("out_b16", N * C);
  residual_forward(Exec(), as_mat<Exec>(out.data(), N, C), as_mat<Exec>(da.data(), N, C), bm, dbias);
  residual_forward(Exec(), as_mat<Exec>(out_b16.data(), N, C), as_mat<Exec>(da.data(), N, C), b16, dbias);
  EXPECT_EQ(to_host(out_b16), to_host(out));
  Bf16Vec<Exec> s("s", N * C), s_b16("s_b16", N * C);
  residual_forward(Exec(), Mat16<Exec>(s.data(), N, C), Mat16<Exec>(da16.data(), N, C), bm, dbias);
  residual_forward(Exec(), Mat16<Exec>(s_b16.data(), N, C), Mat16<Exec>(da16.data(), N, C), b16, dbias);
  EXPECT_EQ(widened_to_host(s_b16), widened_to_host(s));
  EXPECT_NE(widened_to_host(s), a);
}

}  // namespace
}  // namespace lamina::test
