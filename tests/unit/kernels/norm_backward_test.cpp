#include "lamina/kernels/norm_backward.hpp"

#include "lamina/kernels/layernorm.hpp"
#include "lamina/kernels/rmsnorm.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class NormBackwardTest : public ::testing::Test {};
TYPED_TEST_SUITE(NormBackwardTest, ExecSpaces);

// A norm backward's inputs on Exec: `Rows` rows of 40 (lane sums with a tail), an output
// gradient of bf16 values (so that it can be stored either way), a skip gradient, saved
// statistics, and the values the gain's and bias's gradients start from.
template <class Exec, int Rows = 9>
struct NormInputs {
  static constexpr int N = Rows, C = 40;
  std::vector<double> x = random_vector(N * C, 201, -2, 2), w = random_vector(C, 202, 0.5, 1.5),
                      dout = bf16_values(random_vector(N * C, 203)), skip = random_vector(N * C, 204),
                      stat = random_vector(N, 205, -0.5, 0.5), rstd = random_vector(N, 206, 0.5, 2.0),
                      w0 = random_vector(C, 207), b0 = random_vector(C, 208);
  Vec<Exec> dx = to_device<Exec>(x), dw = to_device<Exec>(w), ddout = to_device<Exec>(dout),
            dmean = to_device<Exec>(stat), drstd = to_device<Exec>(rstd);
  Vec<Exec> partials = Vec<Exec>("partials", column_partials(N, 256));
  ConstMat<Exec> xm = as_mat<Exec>(dx.data(), N, C), dom = as_mat<Exec>(ddout.data(), N, C);
};

// The norms' backward passes as norm_backward runs them (on a host: a work item per block of
// rows, each row's terms added into its block's sums as it goes) against one team per row and
// a device's column sums of the per-row terms (two stages: blocks of rows, then the blocks in
// order): the same input gradients and the same sums, bit for bit, added onto what the
// gradients held. 9 rows (one block) and 150 (three), rows of 40 (lane sums with a tail), a
// skip gradient joining, the input in fp32 and bf16.
template <class Exec, int Rows>
void expect_the_teams_bits() {
  SCOPED_TRACE(std::to_string(Rows) + " rows");
  const NormInputs<Exec, Rows> inputs;
  constexpr int N = Rows, C = NormInputs<Exec, Rows>::C;
  const auto &skip = inputs.skip, &w0 = inputs.w0, &b0 = inputs.b0;
  const auto &dw = inputs.dw, &dmean = inputs.dmean, &drstd = inputs.drstd, &partials = inputs.partials;
  const auto &xm = inputs.xm, &dom = inputs.dom;
  auto x16v = to_device_bf16<Exec>(inputs.x);
  const ConstMat16<Exec> x16(x16v.data(), N, C);
  for (const bool bf16 : {false, true}) {
    for (const bool layernorm : {true, false}) {
      SCOPED_TRACE(std::string(layernorm ? "layernorm" : "rmsnorm") + (bf16 ? ", bf16 input" : ""));
      std::vector<double> dinp[2], gw[2], gb[2];
      for (int way = 0; way < 2; ++way) {  // as run, teams
        auto gi = to_device<Exec>(skip), gwv = to_device<Exec>(w0), gbv = to_device<Exec>(b0);
        auto scratch = to_device<Exec>(std::vector<double>(N * C, NAN));
        const Mat<Exec> gim = as_mat<Exec>(gi.data(), N, C), sm = as_mat<Exec>(scratch.data(), N, C);
        auto run = [&](const auto& in) {
          using X = StoredType<std::decay_t<decltype(in)>>;
          auto teams = [&](const auto& backward) {
            Kokkos::parallel_for(Teams<Exec>(Exec(), N, Kokkos::AUTO), backward);
            lamina::detail::two_stage_column_sums(Exec(), gwv, sm, partials);
            if (layernorm) lamina::detail::two_stage_column_sums(Exec(), gbv, dom, partials);
          };
          if (layernorm) {
            if (way == 0) {
              layernorm_backward(Exec(), gim, gwv, gbv, dom, gim, in, dw, ConstVec<Exec>(dmean), ConstVec<Exec>(drstd),
                                 sm, partials);
            } else {
              teams(LayernormBackward<Exec, X, float, float>{gim, dom, gim, in, dw, dmean, drstd, sm, C, true});
            }
          } else if (way == 0) {
            rmsnorm_backward(Exec(), gim, gwv, dom, gim, in, dw, ConstVec<Exec>(drstd), sm, partials);
          } else {
            teams(RmsnormBackward<Exec, X, float, float>{gim, dom, gim, in, dw, drstd, sm, C, true});
          }
        };
        if (bf16) {
          run(x16);
        } else {
          run(xm);
        }
        dinp[way] = to_host(gi);
        gw[way] = to_host(gwv);
        gb[way] = to_host(gbv);
      }
      EXPECT_EQ(dinp[1], dinp[0]);
      EXPECT_EQ(gw[1], gw[0]);
      EXPECT_EQ(gb[1], gb[0]);
      EXPECT_NE(gw[0], w0);
      EXPECT_EQ(gb[0] != b0, layernorm);
    }
  }
}

TYPED_TEST(NormBackwardTest, SumsByBlocksOfRowsAsTheTeamsDoBitForBit) {
  expect_the_teams_bits<TypeParam, 9>();
  expect_the_teams_bits<TypeParam, 150>();
}

// An output gradient summed over the tensor-parallel shards in bf16 (parallel.tp_sums) and
// read as it is: the same bits as from an fp32 copy of its values, as norm_backward runs it
// and by teams with column sums of the bf16 gradient.
TYPED_TEST(NormBackwardTest, ABf16OutputGradientGivesTheBitsOfItsFp32Values) {
  using Exec = TypeParam;
  const NormInputs<Exec> inputs;
  constexpr int N = NormInputs<Exec>::N, C = NormInputs<Exec>::C;
  const auto &skip = inputs.skip, &w0 = inputs.w0, &b0 = inputs.b0;
  const auto &dw = inputs.dw, &dmean = inputs.dmean, &drstd = inputs.drstd, &partials = inputs.partials;
  const auto &xm = inputs.xm, &dom = inputs.dom;
  auto d16 = to_device_bf16<Exec>(inputs.dout);
  const ConstMat16<Exec> do16(d16.data(), N, C);
  for (const bool layernorm : {true, false}) {
    SCOPED_TRACE(layernorm ? "layernorm" : "rmsnorm");
    std::vector<double> dinp[3], gw[3], gb[3];
    for (int narrow = 0; narrow < 3; ++narrow) {
      auto gi = to_device<Exec>(skip), gwv = to_device<Exec>(w0), gbv = to_device<Exec>(b0);
      auto scratch = to_device<Exec>(std::vector<double>(N * C, NAN));
      const Mat<Exec> gim = as_mat<Exec>(gi.data(), N, C), sm = as_mat<Exec>(scratch.data(), N, C);
      auto run = [&](const auto& g) {
        if (layernorm) {
          layernorm_backward(Exec(), gim, gwv, gbv, g, gim, xm, dw, ConstVec<Exec>(dmean), ConstVec<Exec>(drstd), sm,
                             partials);
        } else {
          rmsnorm_backward(Exec(), gim, gwv, g, gim, xm, dw, ConstVec<Exec>(drstd), sm, partials);
        }
      };
      if (!narrow) {
        run(dom);
      } else if (narrow == 1) {
        run(do16);
      } else if (layernorm) {
        Kokkos::parallel_for(Teams<Exec>(Exec(), N, Kokkos::AUTO),
                             LayernormBackward<Exec, float, float, std::uint16_t>{gim, do16, gim, xm, dw, dmean, drstd,
                                                                                  sm, C, true});
        add_column_sums(Exec(), gwv, sm, partials);
        add_column_sums(Exec(), gbv, do16, partials);
      } else {
        Kokkos::parallel_for(Teams<Exec>(Exec(), N, Kokkos::AUTO), RmsnormBackward<Exec, float, float, std::uint16_t>{
                                                                       gim, do16, gim, xm, dw, drstd, sm, C, true});
        add_column_sums(Exec(), gwv, sm, partials);
      }
      dinp[narrow] = to_host(gi);
      gw[narrow] = to_host(gwv);
      gb[narrow] = to_host(gbv);
    }
    for (int narrow = 1; narrow < 3; ++narrow) {
      EXPECT_EQ(dinp[narrow], dinp[0]) << narrow;
      EXPECT_EQ(gw[narrow], gw[0]) << narrow;
      EXPECT_EQ(gb[narrow], gb[0]) << narrow;
    }
    EXPECT_NE(gw[0], w0);
  }
}

}  // namespace
}  // namespace lamina::test
