#include "lamina/parallel/process_grid.hpp"

#include <Kokkos_Core.hpp>

#include "lamina/comm/mpi_communicator.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#if defined(LAMINA_HAVE_NCCL)
#include "lamina/comm/nccl_communicator.hpp"
#endif

namespace lamina {

namespace {

// NCCL for the device groups when it is built and the model runs on a CUDA device.
std::unique_ptr<Communicator> make_group(MPI_Comm comm, const std::string& name) {
#if defined(LAMINA_HAVE_NCCL) && defined(KOKKOS_ENABLE_CUDA)
  if (std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>::value) {
    auto c = std::make_unique<NcclCommunicator>(comm, name);
    MPI_Comm_free(&comm);
    return c;
  }
#endif
  return std::make_unique<MpiCommunicator>(comm, name);
}

}  // namespace

ProcessGrid::ProcessGrid(MPI_Comm world, int dp, int tp, int pp) : dp_(dp), tp_(tp), pp_(pp) {
  int size = 1;
  MPI_Comm_size(world, &size);
  MPI_Comm_rank(world, &world_rank_);
  if (dp * tp * pp != size) {
    throw InputError(strprintf("parallel.dp x tp x pp = %d x %d x %d = %d, but the job has %d rank(s); start it with "
                               "mpirun -np %d, or change the parallel section",
                               dp, tp, pp, dp * tp * pp, size, dp * tp * pp));
  }
  tp_rank_ = world_rank_ % tp;
  dp_rank_ = (world_rank_ / tp) % dp;
  pp_rank_ = world_rank_ / (tp * dp);
  MPI_Comm dup = MPI_COMM_NULL, tpc = MPI_COMM_NULL, dpc = MPI_COMM_NULL, ppc = MPI_COMM_NULL, emb = MPI_COMM_NULL;
  MPI_Comm_dup(world, &dup);
  world_comm_ = std::make_unique<MpiCommunicator>(dup, "world");
  // Colours: the coordinates that stay fixed within the group; keys order the members.
  MPI_Comm_split(world, dp_rank_ + dp * pp_rank_, tp_rank_, &tpc);
  MPI_Comm_split(world, tp_rank_ + tp * pp_rank_, dp_rank_, &dpc);
  MPI_Comm_split(world, tp_rank_ + tp * dp_rank_, pp_rank_, &ppc);
  MPI_Comm ppclock = MPI_COMM_NULL;
  MPI_Comm_dup(ppc, &ppclock);
  pp_clock_comm_ = std::make_unique<MpiCommunicator>(ppclock, "pp_clock");
  const bool ends = pp_rank_ == 0 || pp_rank_ == pp - 1;
  MPI_Comm_split(world, ends ? tp_rank_ + tp * dp_rank_ : MPI_UNDEFINED, pp_rank_, &emb);
  tp_comm_ = make_group(tpc, "tp");
  dp_comm_ = make_group(dpc, "dp");
  pp_comm_ = make_group(ppc, "pp");
  embedding_comm_ = make_group(emb == MPI_COMM_NULL ? [] {
    MPI_Comm self;
    MPI_Comm_dup(MPI_COMM_SELF, &self);
    return self;
  }() : emb, "embedding");
}

std::string ProcessGrid::describe() const {
  std::string out = strprintf("process grid dp=%d x tp=%d x pp=%d (tp innermost):", dp_, tp_, pp_);
  for (int p = 0; p < pp_; ++p) {
    out += strprintf("\n  stage %d:", p);
    for (int d = 0; d < dp_; ++d) {
      out += " [";
      for (int t = 0; t < tp_; ++t) out += strprintf("%s%d", t ? " " : "", world_rank_of(d, t, p));
      out += "]";
    }
  }
  return out + "  (ranks per data-parallel replica, in tensor-parallel order)";
}

}  // namespace lamina
