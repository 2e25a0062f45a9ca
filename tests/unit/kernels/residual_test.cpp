#include "lamina/kernels/residual.hpp"

#include "test_util.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class ResidualTest : public ::testing::Test {};
TYPED_TEST_SUITE(ResidualTest, ExecSpaces);

// The backward of a residual is the identity on both branches (no kernel); forward is
// checked here, the joined gradient through layernorm_backward's dskip in layernorm_test.
TYPED_TEST(ResidualTest, ForwardAddsExactly) {
  using Exec = TypeParam;
  const int n = 100;
  const auto a = random_vector(n, 61), b = random_vector(n, 62);
  auto da = to_device<Exec>(a), db = to_device<Exec>(b);
  Vec<Exec> out("out", n);
  residual_forward(Exec(), out, da, db);
  const auto got = to_host(out);
  for (int i = 0; i < n; ++i) EXPECT_EQ(got[i], static_cast<double>(static_cast<float>(a[i]) + static_cast<float>(b[i])));
}

}  // namespace
}  // namespace lamina::test
