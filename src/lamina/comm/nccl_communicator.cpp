#include "lamina/comm/nccl_communicator.hpp"

#include <cuda_bf16.h>  // before nccl.h: older NCCL releases declare ncclBfloat16 only after it
#include <cuda_runtime.h>
#include <nccl.h>

#include "lamina/comm/mpi_communicator.hpp"
#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw RunError(std::string(what) + " failed: " + cudaGetErrorString(rc));
}

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw RunError(std::string(what) + " failed: " + ncclGetErrorString(rc));
}

ncclRedOp_t op_of(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

}  // namespace

// Communicators are non-blocking (NCCL's config.blocking = 0): no NCCL call blocks the host
// thread, which polls instead and, past parallel.timeout, aborts the communicator
// (ncclCommAbort) and ends the job; a rank that never arrives cannot hang the others.
struct NcclCommunicator::State {
  MPI_Comm mpi = MPI_COMM_NULL;
  ncclComm_t nccl = nullptr;
  cudaStream_t stream = nullptr;
  std::string name;
  int rank = 0, size = 1;

  std::string describe(const char* op) const {
    return strprintf("%s on NCCL group '%s' (%d ranks)", op, name.c_str(), size);
  }
  // Raises NCCL's asynchronous errors (a peer failed, a network error) as RunError.
  void check_async(const char* op) const {
    ncclResult_t state = ncclSuccess;
    check_nccl(ncclCommGetAsyncError(nccl, &state), "ncclCommGetAsyncError");
    if (state != ncclSuccess && state != ncclInProgress) check_nccl(state, op);
  }
  // Polls done() within parallel.timeout; on a timeout aborts the communicator first.
  template <class Done>
  void wait(Done&& done, const char* op) const {
    try {
      bounded_wait(
          [&] {
            check_async(op);
            return done();
          },
          [&] { return describe(op); });
    } catch (const TimeoutError&) {
      ncclCommAbort(nccl);
      throw;
    }
  }
  // A call on a non-blocking communicator returns ncclInProgress until it is enqueued.
  void enqueued(ncclResult_t rc, const char* op) const {
    if (rc == ncclInProgress) {
      wait(
          [&] {
            ncclResult_t state = ncclInProgress;
            check_nccl(ncclCommGetAsyncError(nccl, &state), "ncclCommGetAsyncError");
            return state != ncclInProgress;
          },
          op);
      rc = ncclSuccess;
    }
    check_nccl(rc, op);
  }
  Request event(const char* op) const;
  void sync(const char* op) const {
    wait([&] {
      const cudaError_t rc = cudaStreamQuery(stream);
      if (rc == cudaErrorNotReady) return false;
      check_cuda(rc, "cudaStreamQuery");
      return true;
    }, op);
  }
};

namespace {

// Completion of work queued on the communicator's stream: an event recorded after it.
class StreamEvent : public Request::Impl {
 public:
  StreamEvent(const NcclCommunicator::State& s, const char* op) : s_(s), op_(op) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event_, s.stream), "cudaEventRecord");
  }
  ~StreamEvent() override { cudaEventDestroy(event_); }
  void wait() override {
    s_.wait([this] { return test(); }, op_);
  }
  bool test() override {
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    check_cuda(rc, "cudaEventQuery");
    return true;
  }

 private:
  const NcclCommunicator::State& s_;
  const char* op_;
  cudaEvent_t event_ = nullptr;
};

}  // namespace

std::string nccl_backend_info() {
  int nccl = 0, cuda = 0;
  ncclGetVersion(&nccl);
  cudaRuntimeGetVersion(&cuda);
  return "NCCL " + std::to_string(nccl / 10000) + "." + std::to_string(nccl / 100 % 100) + "." +
         std::to_string(nccl % 100) + ", CUDA runtime " + std::to_string(cuda / 1000) + "." +
         std::to_string(cuda / 10 % 100);
}

Request NcclCommunicator::State::event(const char* op) const { return Request(std::make_unique<StreamEvent>(*this, op)); }

NcclCommunicator::NcclCommunicator(MPI_Comm comm, std::string name) : s_(std::make_unique<State>()) {
  MPI_Comm_dup(comm, &s_->mpi);
  MPI_Comm_rank(s_->mpi, &s_->rank);
  MPI_Comm_size(s_->mpi, &s_->size);
  s_->name = std::move(name);
  ncclUniqueId id;
  if (s_->rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, s_->mpi, &r);
  wait_bounded(r, "MPI_Ibcast of the NCCL id on group '" + s_->name + "'");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  s_->enqueued(ncclCommInitRankConfig(&s_->nccl, s_->size, id, s_->rank, &config), "ncclCommInitRankConfig");
  check_cuda(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

NcclCommunicator::~NcclCommunicator() {
  // Finalize first (it flushes the communicator's outstanding work and, on a non-blocking
  // communicator, completes asynchronously), then destroy it, and only then the stream its
  // operations ran on. A communicator whose job is failing is aborted instead.
  if (s_->nccl != nullptr) {
    ncclResult_t rc = ncclCommFinalize(s_->nccl);
    if (rc == ncclInProgress) {
      try {
        s_->wait(
            [&] {
              ncclResult_t state = ncclInProgress;
              ncclCommGetAsyncError(s_->nccl, &state);
              rc = state;
              return state != ncclInProgress;
            },
            "ncclCommFinalize");
      } catch (const std::exception&) {
        rc = ncclInternalError;  // timed out: wait() aborted the communicator
        s_->nccl = nullptr;
      }
    }
    if (s_->nccl != nullptr) {
      if (rc == ncclSuccess) {
        ncclCommDestroy(s_->nccl);
      } else {
        ncclCommAbort(s_->nccl);
      }
    }
  }
  if (s_->stream != nullptr) cudaStreamDestroy(s_->stream);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && s_->mpi != MPI_COMM_NULL) MPI_Comm_free(&s_->mpi);
}

int NcclCommunicator::rank() const { return s_->rank; }
int NcclCommunicator::size() const { return s_->size; }
const std::string& NcclCommunicator::name() const { return s_->name; }

Request NcclCommunicator::iallreduce(float* data, std::int64_t n, ReduceOp op) {
  s_->enqueued(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32, op_of(op), s_->nccl, s_->stream),
             "ncclAllReduce");
  count_allreduce(4 * n);
  return s_->event("ncclAllReduce");
}

Request NcclCommunicator::ireduce_scatter(const float* send, float* recv, std::int64_t count) {
  s_->enqueued(ncclReduceScatter(send, recv, static_cast<size_t>(count), ncclFloat32, ncclSum, s_->nccl, s_->stream),
             "ncclReduceScatter");
  count_ring(4 * count * s_->size);
  return s_->event("ncclReduceScatter");
}

Request NcclCommunicator::iall_gather(const float* send, float* recv, std::int64_t count) {
  s_->enqueued(ncclAllGather(send, recv, static_cast<size_t>(count), ncclFloat32, s_->nccl, s_->stream),
             "ncclAllGather");
  count_ring(4 * count * s_->size);
  return s_->event("ncclAllGather");
}

// NCCL matches point-to-point messages by order per peer, so tags are not needed: the
// schedules issue sends and receives between two ranks in the same order on both.
Request NcclCommunicator::isend(const float* data, std::int64_t n, int peer, int) {
  s_->enqueued(ncclSend(data, static_cast<size_t>(n), ncclFloat32, peer, s_->nccl, s_->stream), "ncclSend");
  count_send(4 * n);
  return s_->event("ncclSend");
}

Request NcclCommunicator::irecv(float* data, std::int64_t n, int peer, int) {
  s_->enqueued(ncclRecv(data, static_cast<size_t>(n), ncclFloat32, peer, s_->nccl, s_->stream), "ncclRecv");
  return s_->event("ncclRecv");
}

Request NcclCommunicator::isendrecv(const float* send, float* recv, std::int64_t n, int to, int from, int) {
  s_->enqueued(ncclGroupStart(), "ncclGroupStart");
  s_->enqueued(ncclSend(send, static_cast<size_t>(n), ncclFloat32, to, s_->nccl, s_->stream), "ncclSend");
  s_->enqueued(ncclRecv(recv, static_cast<size_t>(n), ncclFloat32, from, s_->nccl, s_->stream), "ncclRecv");
  s_->enqueued(ncclGroupEnd(), "ncclGroupEnd");
  count_send(4 * n);
  return s_->event("ncclSend/ncclRecv");
}

// Host memory travels over MPI on the same ranks, never through the device.
Request NcclCommunicator::isend_host(const double* data, std::int64_t n, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Isend(data, static_cast<int>(n), MPI_DOUBLE, peer, tag, s_->mpi, &r);
  return bounded_request(r, s_->describe("MPI_Isend of host values"));
}

Request NcclCommunicator::irecv_host(double* data, std::int64_t n, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Irecv(data, static_cast<int>(n), MPI_DOUBLE, peer, tag, s_->mpi, &r);
  return bounded_request(r, s_->describe("MPI_Irecv of host values"));
}

void NcclCommunicator::allreduce(float* data, std::int64_t n, ReduceOp op) { iallreduce(data, n, op).wait(); }

void NcclCommunicator::allreduce(double* data, std::int64_t n, ReduceOp op) {
  // Host scalars: MPI over the same ranks.
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_DOUBLE, op == ReduceOp::sum ? MPI_SUM : MPI_MAX, s_->mpi,
                 &r);
  wait_bounded(r, "MPI_Iallreduce on group '" + s_->name + "'");
  count_allreduce(8 * n);
}

void NcclCommunicator::allreduce_bf16(std::uint16_t* data, std::int64_t n) {
  s_->enqueued(ncclAllReduce(data, data, static_cast<size_t>(n), ncclBfloat16, ncclSum, s_->nccl, s_->stream),
               "ncclAllReduce");
  count_allreduce(2 * n);
  s_->event("ncclAllReduce").wait();
}

void NcclCommunicator::reduce_scatter_bf16(const std::uint16_t* send, std::uint16_t* recv, std::int64_t count) {
  s_->enqueued(ncclReduceScatter(send, recv, static_cast<size_t>(count), ncclBfloat16, ncclSum, s_->nccl, s_->stream),
               "ncclReduceScatter");
  count_ring(2 * count * s_->size);
  s_->event("ncclReduceScatter").wait();
}

void NcclCommunicator::reduce_scatter(const float* send, float* recv, std::int64_t count) {
  ireduce_scatter(send, recv, count).wait();
}

void NcclCommunicator::all_gather(const float* send, float* recv, std::int64_t count) {
  iall_gather(send, recv, count).wait();
}

void NcclCommunicator::broadcast(float* data, std::int64_t n, int root) {
  s_->enqueued(ncclBroadcast(data, data, static_cast<size_t>(n), ncclFloat32, root, s_->nccl, s_->stream),
             "ncclBroadcast");
  if (s_->rank == root) count_send(4 * n);
  s_->sync("ncclBroadcast");
}

void NcclCommunicator::send(const float* data, std::int64_t n, int peer, int tag) { isend(data, n, peer, tag).wait(); }

void NcclCommunicator::recv(float* data, std::int64_t n, int peer, int tag) { irecv(data, n, peer, tag).wait(); }

void NcclCommunicator::barrier() {
  s_->sync("the stream before a barrier");
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Ibarrier(s_->mpi, &r);
  wait_bounded(r, "MPI_Ibarrier on group '" + s_->name + "'");
}

}  // namespace lamina
