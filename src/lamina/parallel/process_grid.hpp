#pragma once
// The dp x cp x tp x pp process grid (Megatron-Core's order). Tensor-parallel ranks are
// adjacent (same node, fastest links), then context-parallel, then data-parallel, then
// pipeline stages:
//   world rank = tp_rank + tp * (cp_rank + cp * (dp_rank + dp * pp_rank)).
// The ranks of a context-parallel group share sequences (each holds 2 of their 2 cp chunks);
// the dp x cp ranks of one (tp, pp) position hold the same parameters and see different tokens:
// the data group (data()), over which gradients sum and ZeRO shards.
// Each rank holds one communicator per group it belongs to; the "embedding" group joins
// the first and last pipeline stages of one (dp, tp) position, which both hold the tied
// token embedding. Pipeline messages travel on links (link()): over MPI the pp group
// itself; over NCCL, which matches messages by order alone and runs each communicator's
// operations one after the other on its stream, a communicator for each direction between
// two neighbouring stages, so that a message never waits behind one going the other way
// (with one stream, interleaved and modular schedules deadlock).
#include <mpi.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "lamina/comm/communicator.hpp"
#include "lamina/core/config.hpp"
#include "lamina/core/precision.hpp"
#include "lamina/model/shard_combine.hpp"

namespace lamina {

class ProcessGrid {
 public:
  // Throws InputError when dp * cp * tp * pp differs from the size of `world`, or when
  // `backend` asks for NCCL where it cannot work (no CUDA build with NCCL, ranks that share
  // a GPU). The world and pp_clock groups are always MPI (host scalars).
  ProcessGrid(MPI_Comm world, int dp, int cp, int tp, int pp, CommBackend backend = CommBackend::automatic);

  int dp_size() const { return dp_; }
  int cp_size() const { return cp_; }
  int tp_size() const { return tp_; }
  int pp_size() const { return pp_; }
  int dp_rank() const { return dp_rank_; }  // which sequences of a batch the rank sees
  int cp_rank() const { return cp_rank_; }  // which chunks of them
  int tp_rank() const { return tp_rank_; }
  int pp_rank() const { return pp_rank_; }
  // The data group's size and this rank's place in it.
  int data_size() const { return dp_ * cp_; }
  int data_rank() const { return cp_rank_ + cp_ * dp_rank_; }
  int world_rank() const { return world_rank_; }
  int world_size() const { return dp_ * cp_ * tp_ * pp_; }
  bool first_stage() const { return pp_rank_ == 0; }
  bool last_stage() const { return pp_rank_ == pp_ - 1; }

  Communicator& world() const { return *world_comm_; }
  // The data group (dp x cp ranks; named "dp"): gradient sums, ZeRO's shards.
  Communicator& data() const { return *data_comm_; }
  // The data group again, for parameter fetches (ZeRO-3 all-gathers): a stream of their own
  // beside the gradient reductions', as the simulator prices them.
  Communicator& data_fetch() const { return *data_fetch_comm_; }
  // The context-parallel ring (this rank alone without context parallelism).
  Communicator& cp() const { return *cp_comm_; }
  Communicator& tp() const { return *tp_comm_; }
  Communicator& pp() const { return *pp_comm_; }  // over MPI (NCCL messages use link())
  // First and last stage (size 2 when pp > 1, else this rank alone).
  Communicator& embedding() const { return *embedding_comm_; }
  // The pipeline group again, over MPI, for the executor's virtual-clock timestamps: host
  // scalars that must not count as pipeline traffic.
  Communicator& pp_clock() const { return *pp_clock_comm_; }
  // The communicator a pipeline message from stage `from` to stage `to` travels on (an
  // activation goes to the next stage, a gradient to the previous one) and the peer's rank
  // in it.
  struct Link {
    Communicator* comm;
    int peer;
  };
  Link link(bool activation, int from, int to) const;
  // The links that are not the pp group itself (their bytes are pipeline traffic too).
  std::vector<Communicator*> own_links() const;

  // World rank of grid position (dp, cp, tp, pp).
  int world_rank_of(int dp, int cp, int tp, int pp) const { return tp + tp_ * (cp + cp_ * (dp + dp_ * pp)); }
  // A table of which world rank holds which (dp, tp, pp) position and the backend of the
  // device groups, for the log.
  std::string describe() const;
  bool nccl() const { return nccl_; }

 private:
  int dp_, cp_, tp_, pp_;
  int dp_rank_ = 0, cp_rank_ = 0, tp_rank_ = 0, pp_rank_ = 0, world_rank_ = 0;
  bool nccl_ = false;
  std::string backend_reason_;
  std::unique_ptr<Communicator> world_comm_, data_comm_, data_fetch_comm_, cp_comm_, tp_comm_, pp_comm_,
      embedding_comm_, pp_clock_comm_;
  // NCCL: (activation?, the lower stage of the direction's pair s -> s+1) -> communicator
  std::map<std::pair<bool, int>, std::unique_ptr<Communicator>> links_;
};

// How the model's shards combine over the grid: over the tensor-parallel group sums (in bf16
// where `sums` says so), maxima, and under sequence parallelism the gathers and reduce-scatters
// of the stream's rows; over the context-parallel group the ring's passes. A group of one
// combines nothing.
ShardCombine shard_combine(const ProcessGrid& grid, Precision sums, bool sequence_parallel);

}  // namespace lamina
