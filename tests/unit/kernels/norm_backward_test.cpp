#include "lamina/kernels/norm_backward.hpp"

#include "lamina/kernels/layernorm.hpp"
#include "lamina/kernels/rmsnorm.hpp"

#include "fd_check.hpp"

namespace lamina::test {
namespace {

template <class Exec>
class NormBackwardTest : public ::testing::Test {};
TYPED_TEST_SUITE(NormBackwardTest, ExecSpaces);

// A norm backward's inputs on Exec: rows of 40 (lane sums with a tail), an output gradient
// of bf16 values (so that it can be stored either way), a skip gradient, saved statistics,
// and the values the gain's and bias's gradients start from.
template <class Exec>
struct NormInputs {
  static constexpr int N = 9, C = 40;
  std::vector<double> x = random_vector(N * C, 201, -2, 2), w = random_vector(C, 202, 0.5, 1.5),
                      dout = bf16_values(random_vector(N * C, 203)), skip = random_vector(N * C, 204),
                      stat = random_vector(N, 205, -0.5, 0.5), rstd = random_vector(N, 206, 0.5, 2.0),
                      w0 = random_vector(C, 207), b0 = random_vector(C, 208);
  Vec<Exec> dx = to_device<Exec>(x), dw = to_device<Exec>(w), ddout = to_device<Exec>(dout),
            dmean = to_device<Exec>(stat), drstd = to_device<Exec>(rstd);
  Vec<Exec> partials = Vec<Exec>("partials", column_partials(N, 256));
  ConstMat<Exec> xm = as_mat<Exec>(dx.data(), N, C), dom = as_mat<Exec>(ddout.data(), N, C);
};

// The norms' backward passes as norm_backward runs them (on one host thread: every row in
// one work item, the gain's and bias's gradients summed as it goes) against one team per row
// and column sums of the per-row terms, and (a host) against the rows' pass followed by the
// sums in blocks of 16 columns and of all 40 (several threads' way): the same input gradients
// and the same sums, bit for bit, added onto what the gradients held. Rows of 40 (lane sums
// with a tail), a skip gradient joining, the input in fp32 and bf16.
TYPED_TEST(NormBackwardTest, OneThreadSumsAsItGoesAndEqualsTheTeamsBitForBit) {
  using Exec = TypeParam;
  const NormInputs<Exec> inputs;
  constexpr int N = NormInputs<Exec>::N, C = NormInputs<Exec>::C;
  const auto &skip = inputs.skip, &w0 = inputs.w0, &b0 = inputs.b0;
  const auto &dw = inputs.dw, &dmean = inputs.dmean, &drstd = inputs.drstd, &partials = inputs.partials;
  const auto &xm = inputs.xm, &dom = inputs.dom;
  auto x16v = to_device_bf16<Exec>(inputs.x);
  const ConstMat16<Exec> x16(x16v.data(), N, C);
  for (const bool bf16 : {false, true}) {
    for (const bool layernorm : {true, false}) {
      SCOPED_TRACE(std::string(layernorm ? "layernorm" : "rmsnorm") + (bf16 ? ", bf16 input" : ""));
      constexpr int kWays = lamina::detail::kOnHost<Exec> ? 4 : 2;  // as run, teams, blocks of 16, one block
      std::vector<double> dinp[kWays], gw[kWays], gb[kWays];
      for (int way = 0; way < kWays; ++way) {
        auto gi = to_device<Exec>(skip), gwv = to_device<Exec>(w0), gbv = to_device<Exec>(b0);
        auto scratch = to_device<Exec>(std::vector<double>(N * C, NAN));
        const Mat<Exec> gim = as_mat<Exec>(gi.data(), N, C), sm = as_mat<Exec>(scratch.data(), N, C);
        auto run = [&](const auto& in) {
          using X = StoredType<std::decay_t<decltype(in)>>;
          const Vec<Exec> gbias = layernorm ? gbv : Vec<Exec>();
          auto other_ways = [&](const auto& backward) {
            if (way == 1) {
              Kokkos::parallel_for(Teams<Exec>(Exec(), N, Kokkos::AUTO), backward);
              add_column_sums(Exec(), gwv, sm, partials);
              if (layernorm) add_column_sums(Exec(), gbv, dom, partials);
            } else if constexpr (lamina::detail::kOnHost<Exec>) {
              norm_backward_by_columns("by_columns", Exec(), backward, NormSums<Exec, float>{sm, gwv, gbias, dom, C}, N,
                                       way == 2 ? 16 : C);
            }
          };
          if (layernorm) {
            if (way == 0) {
              layernorm_backward(Exec(), gim, gwv, gbv, dom, gim, in, dw, ConstVec<Exec>(dmean), ConstVec<Exec>(drstd),
                                 sm, partials);
            } else {
              other_ways(LayernormBackward<Exec, X, float, float>{gim, dom, gim, in, dw, dmean, drstd, sm, C, true});
            }
          } else if (way == 0) {
            rmsnorm_backward(Exec(), gim, gwv, dom, gim, in, dw, ConstVec<Exec>(drstd), sm, partials);
          } else {
            other_ways(RmsnormBackward<Exec, X, float, float>{gim, dom, gim, in, dw, drstd, sm, C, true});
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
      for (int way = 1; way < kWays; ++way) {
        EXPECT_EQ(dinp[way], dinp[0]) << way;
        EXPECT_EQ(gw[way], gw[0]) << way;
        EXPECT_EQ(gb[way], gb[0]) << way;
      }
      EXPECT_NE(gw[0], w0);
      EXPECT_EQ(gb[0] != b0, layernorm);
    }
  }
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
