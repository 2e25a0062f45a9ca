#include "lamina/parallel/process_grid.hpp"

#include <Kokkos_Core.hpp>
#include <algorithm>
#include <memory>
#include <vector>

#include "lamina/comm/mpi_communicator.hpp"
#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#if defined(LAMINA_HAVE_NCCL)
#include "lamina/comm/nccl_communicator.hpp"
#endif

namespace lamina {

namespace {

// The device groups' backend. NCCL needs the CUDA device space and refuses two ranks on
// one GPU ("invalid usage"), so automatic picks it only when every rank of the job has a
// GPU of its own; MPI (staging through the host where it cannot read device memory) works
// everywhere. Returns whether to use NCCL; `reason` says why, for the log.
bool choose_nccl(MPI_Comm world, CommBackend backend, std::string& reason) {
#if defined(LAMINA_HAVE_NCCL) && defined(KOKKOS_ENABLE_CUDA)
  constexpr bool cuda = std::is_same<Kokkos::DefaultExecutionSpace, Kokkos::Cuda>::value;
#else
  constexpr bool cuda = false;
#endif
  if (!cuda) {
    if (backend == CommBackend::nccl) {
      throw InputError("parallel.backend = \"nccl\" needs a CUDA build of lamina with NCCL; this one has " +
                       std::string(Kokkos::DefaultExecutionSpace::name()) +
#if defined(LAMINA_HAVE_NCCL)
                       " with NCCL"
#else
                       " without NCCL"
#endif
                       "; use parallel.backend = \"mpi\" or \"auto\"");
    }
    reason = "MPI";
    return false;
  }
  if (backend == CommBackend::mpi) {
    reason = "MPI (parallel.backend = \"mpi\")";
    return false;
  }
  int device = 0;
#if defined(KOKKOS_ENABLE_CUDA)
  device = Kokkos::Cuda().cuda_device();
#endif
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(world, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int node_size = 1;
  MPI_Comm_size(node, &node_size);
  std::vector<int> devices(static_cast<std::size_t>(node_size));
  MPI_Allgather(&device, 1, MPI_INT, devices.data(), 1, MPI_INT, node);
  MPI_Comm_free(&node);
  std::sort(devices.begin(), devices.end());
  int shared = std::adjacent_find(devices.begin(), devices.end()) != devices.end() ? 1 : 0;
  MPI_Allreduce(MPI_IN_PLACE, &shared, 1, MPI_INT, MPI_MAX, world);
  if (shared != 0 && backend == CommBackend::nccl) {
    throw InputError("parallel.backend = \"nccl\", but ranks of this job share a GPU, which NCCL refuses; give each "
                     "rank its own GPU (e.g. one rank per GPU with CUDA_VISIBLE_DEVICES) or use parallel.backend = "
                     "\"auto\"");
  }
  reason = shared != 0 ? "MPI with host staging (ranks share a GPU, which NCCL refuses)"
                       : std::string("NCCL (each rank has a GPU of its own)");
  return shared == 0;
}

std::unique_ptr<Communicator> make_group(MPI_Comm comm, const std::string& name, bool nccl) {
#if defined(LAMINA_HAVE_NCCL) && defined(KOKKOS_ENABLE_CUDA)
  if (nccl) {
    auto c = std::make_unique<NcclCommunicator>(comm, name);
    MPI_Comm_free(&comm);
    return c;
  }
#else
  (void)nccl;
#endif
  return std::make_unique<MpiCommunicator>(comm, name);
}

}  // namespace

ProcessGrid::ProcessGrid(MPI_Comm world, int dp, int cp, int tp, int pp, CommBackend backend)
    : dp_(dp), cp_(cp), tp_(tp), pp_(pp) {
  int size = 1;
  MPI_Comm_size(world, &size);
  MPI_Comm_rank(world, &world_rank_);
  if (dp * cp * tp * pp != size) {
    throw InputError(strprintf("parallel.dp x cp x tp x pp = %d x %d x %d x %d = %d, but the job has %d rank(s); start "
                               "it with mpirun -np %d, or change the parallel section",
                               dp, cp, tp, pp, dp * cp * tp * pp, size, dp * cp * tp * pp));
  }
  // Communicator creation is collective and cannot poll: a watchdog bounds it instead.
  const BlockingSection section("the other ranks to create the process grid's communicators");
  nccl_ = choose_nccl(world, backend, backend_reason_);
  tp_rank_ = world_rank_ % tp;
  cp_rank_ = (world_rank_ / tp) % cp;
  dp_rank_ = (world_rank_ / (tp * cp)) % dp;
  pp_rank_ = world_rank_ / (tp * cp * dp);
  MPI_Comm dup = MPI_COMM_NULL, tpc = MPI_COMM_NULL, cpc = MPI_COMM_NULL, datac = MPI_COMM_NULL, ppc = MPI_COMM_NULL,
           emb = MPI_COMM_NULL;
  MPI_Comm_dup(world, &dup);
  world_comm_ = std::make_unique<MpiCommunicator>(dup, "world");
  // Colours: the coordinates that stay fixed within the group; keys order the members.
  const int replica = cp_rank_ + cp * dp_rank_;  // the position in the data group
  MPI_Comm_split(world, replica + cp * dp * pp_rank_, tp_rank_, &tpc);
  MPI_Comm_split(world, tp_rank_ + tp * (dp_rank_ + dp * pp_rank_), cp_rank_, &cpc);
  MPI_Comm_split(world, tp_rank_ + tp * pp_rank_, replica, &datac);
  MPI_Comm_split(world, tp_rank_ + tp * replica, pp_rank_, &ppc);
  MPI_Comm ppclock = MPI_COMM_NULL;
  MPI_Comm_dup(ppc, &ppclock);
  pp_clock_comm_ = std::make_unique<MpiCommunicator>(ppclock, "pp_clock");
  // NCCL links: for each stage s, activations s -> s+1 and gradients s+1 -> s (mod pp),
  // each on a communicator of the pair, s first.
  std::vector<std::pair<std::pair<bool, int>, MPI_Comm>> pairs;
  if (nccl_ && pp > 1) {
    for (const bool activation : {true, false}) {
      for (int s = 0; s < pp; ++s) {
        const int next = (s + 1) % pp;
        const bool member = pp_rank_ == s || pp_rank_ == next;
        MPI_Comm pair = MPI_COMM_NULL;
        MPI_Comm_split(ppc, member ? 0 : MPI_UNDEFINED, pp_rank_ == s ? 0 : 1, &pair);
        if (member) pairs.push_back({{activation, s}, pair});
      }
    }
  }
  const bool ends = pp_rank_ == 0 || pp_rank_ == pp - 1;
  MPI_Comm_split(world, ends ? tp_rank_ + tp * replica : MPI_UNDEFINED, pp_rank_, &emb);
  MPI_Comm fetch = MPI_COMM_NULL;
  MPI_Comm_dup(datac, &fetch);
  tp_comm_ = make_group(tpc, "tp", nccl_);
  cp_comm_ = make_group(cpc, "cp", nccl_);
  data_comm_ = make_group(datac, "dp", nccl_);
  data_fetch_comm_ = make_group(fetch, "dp fetch", nccl_);
  // Pipeline messages over NCCL travel on the links; the group itself is MPI's.
  pp_comm_ = std::make_unique<MpiCommunicator>(ppc, "pp");
  for (const auto& [key, comm] : pairs) {
    const int s = key.second, next = (s + 1) % pp;
    const std::string name = key.first ? strprintf("pp activations %d->%d", s, next)
                                       : strprintf("pp gradients %d->%d", next, s);
    links_[key] = make_group(comm, name, nccl_);
  }
  embedding_comm_ = make_group(emb == MPI_COMM_NULL ? [] {
    MPI_Comm self;
    MPI_Comm_dup(MPI_COMM_SELF, &self);
    return self;
  }() : emb, "embedding", nccl_);
}

ProcessGrid::Link ProcessGrid::link(bool activation, int from, int to) const {
  if (links_.empty()) return {pp_comm_.get(), from == pp_rank_ ? to : from};
  Communicator* c = links_.at({activation, activation ? from : to}).get();
  return {c, 1 - c->rank()};
}

std::vector<Communicator*> ProcessGrid::own_links() const {
  std::vector<Communicator*> out;
  for (const auto& kv : links_) out.push_back(kv.second.get());
  return out;
}

std::string ProcessGrid::describe() const {
  std::string out = strprintf("process grid dp=%d x cp=%d x tp=%d x pp=%d (tp innermost):", dp_, cp_, tp_, pp_);
  for (int p = 0; p < pp_; ++p) {
    out += strprintf("\n  stage %d:", p);
    for (int d = 0; d < dp_; ++d) {
      out += " [";
      for (int c = 0; c < cp_; ++c) {
        if (c > 0) out += " |";
        for (int t = 0; t < tp_; ++t) out += strprintf("%s%d", t || c ? " " : "", world_rank_of(d, c, t, p));
      }
      out += "]";
    }
  }
  return out + "  (ranks per data-parallel replica, context-parallel ranks apart by |, in tensor-parallel order)" +
         "\n  communicators: " + backend_reason_;
}

ShardCombine shard_combine(const ProcessGrid& grid, Precision sums, bool sequence_parallel) {
  ShardCombine c;
  if (grid.cp_size() > 1) {
    Communicator* cp = &grid.cp();
    auto pending = std::make_shared<std::vector<Request>>();
    c.ring.size = grid.cp_size();
    c.ring.rank = grid.cp_rank();
    c.ring.pass = [cp, pending](const float* send, float* recv, std::int64_t n, int tag) {
      const int size = cp->size(), next = (cp->rank() + 1) % size, previous = (cp->rank() + size - 1) % size;
      pending->push_back(cp->isendrecv(send, recv, n, next, previous, tag));
    };
    c.ring.wait = [pending] {
      for (Request& r : *pending) r.wait();
      pending->clear();
    };
  }
  if (grid.tp_size() == 1) return c;
  Communicator* tp = &grid.tp();
  c.sum = [tp](float* data, std::int64_t n) { tp->allreduce(data, n, ReduceOp::sum); };
  c.max = [tp](float* data, std::int64_t n) { tp->allreduce(data, n, ReduceOp::max); };
  if (sums == Precision::bf16) c.sum16 = [tp](std::uint16_t* data, std::int64_t n) { tp->allreduce_bf16(data, n); };
  if (sequence_parallel) {
    c.shards = grid.tp_size();
    c.gather = [tp](const float* send, float* recv, std::int64_t n) { tp->all_gather(send, recv, n); };
    c.scatter_sum = [tp](const float* send, float* recv, std::int64_t n) { tp->reduce_scatter(send, recv, n); };
    if (sums == Precision::bf16) {
      c.scatter_sum16 = [tp](const std::uint16_t* send, std::uint16_t* recv, std::int64_t n) {
        tp->reduce_scatter_bf16(send, recv, n);
      };
    }
  }
  return c;
}

}  // namespace lamina
