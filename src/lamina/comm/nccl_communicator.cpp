#include "lamina/comm/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include "lamina/core/error.hpp"

namespace lamina {

namespace {

void check_cuda(cudaError_t rc, const char* what) {
  if (rc != cudaSuccess) throw RunError(std::string(what) + " failed: " + cudaGetErrorString(rc));
}

void check_nccl(ncclResult_t rc, const char* what) {
  if (rc != ncclSuccess) throw RunError(std::string(what) + " failed: " + ncclGetErrorString(rc));
}

ncclRedOp_t op_of(ReduceOp op) { return op == ReduceOp::sum ? ncclSum : ncclMax; }

// Completion of work queued on the communicator's stream: an event recorded after it.
class StreamEvent : public Request::Impl {
 public:
  explicit StreamEvent(cudaStream_t stream) {
    check_cuda(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(event_, stream), "cudaEventRecord");
  }
  ~StreamEvent() override { cudaEventDestroy(event_); }
  void wait() override { check_cuda(cudaEventSynchronize(event_), "cudaEventSynchronize"); }
  bool test() override {
    const cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    check_cuda(rc, "cudaEventQuery");
    return true;
  }

 private:
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

struct NcclCommunicator::State {
  MPI_Comm mpi = MPI_COMM_NULL;
  ncclComm_t nccl = nullptr;
  cudaStream_t stream = nullptr;
  std::string name;
  int rank = 0, size = 1;

  Request event() const { return Request(std::make_unique<StreamEvent>(stream)); }
  void sync() const { check_cuda(cudaStreamSynchronize(stream), "cudaStreamSynchronize"); }
};

NcclCommunicator::NcclCommunicator(MPI_Comm comm, std::string name) : s_(std::make_unique<State>()) {
  MPI_Comm_dup(comm, &s_->mpi);
  MPI_Comm_rank(s_->mpi, &s_->rank);
  MPI_Comm_size(s_->mpi, &s_->size);
  s_->name = std::move(name);
  ncclUniqueId id;
  if (s_->rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
  MPI_Bcast(&id, sizeof(id), MPI_BYTE, 0, s_->mpi);
  check_nccl(ncclCommInitRank(&s_->nccl, s_->size, id, s_->rank), "ncclCommInitRank");
  check_cuda(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
}

NcclCommunicator::~NcclCommunicator() {
  if (s_->stream != nullptr) cudaStreamDestroy(s_->stream);
  if (s_->nccl != nullptr) ncclCommDestroy(s_->nccl);
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized && s_->mpi != MPI_COMM_NULL) MPI_Comm_free(&s_->mpi);
}

int NcclCommunicator::rank() const { return s_->rank; }
int NcclCommunicator::size() const { return s_->size; }
const std::string& NcclCommunicator::name() const { return s_->name; }

Request NcclCommunicator::iallreduce(float* data, std::int64_t n, ReduceOp op) {
  check_nccl(ncclAllReduce(data, data, static_cast<size_t>(n), ncclFloat32, op_of(op), s_->nccl, s_->stream),
             "ncclAllReduce");
  count_allreduce(4 * n);
  return s_->event();
}

Request NcclCommunicator::ireduce_scatter(const float* send, float* recv, std::int64_t count) {
  check_nccl(ncclReduceScatter(send, recv, static_cast<size_t>(count), ncclFloat32, ncclSum, s_->nccl, s_->stream),
             "ncclReduceScatter");
  count_ring(4 * count * s_->size);
  return s_->event();
}

Request NcclCommunicator::iall_gather(const float* send, float* recv, std::int64_t count) {
  check_nccl(ncclAllGather(send, recv, static_cast<size_t>(count), ncclFloat32, s_->nccl, s_->stream),
             "ncclAllGather");
  count_ring(4 * count * s_->size);
  return s_->event();
}

// NCCL matches point-to-point messages by order per peer, so tags are not needed: the
// schedules issue sends and receives between two ranks in the same order on both.
Request NcclCommunicator::isend(const float* data, std::int64_t n, int peer, int) {
  check_nccl(ncclSend(data, static_cast<size_t>(n), ncclFloat32, peer, s_->nccl, s_->stream), "ncclSend");
  count_send(4 * n);
  return s_->event();
}

Request NcclCommunicator::irecv(float* data, std::int64_t n, int peer, int) {
  check_nccl(ncclRecv(data, static_cast<size_t>(n), ncclFloat32, peer, s_->nccl, s_->stream), "ncclRecv");
  return s_->event();
}

void NcclCommunicator::allreduce(float* data, std::int64_t n, ReduceOp op) { iallreduce(data, n, op).wait(); }

void NcclCommunicator::allreduce(double* data, std::int64_t n, ReduceOp op) {
  // Host scalars: MPI over the same ranks.
  MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_DOUBLE, op == ReduceOp::sum ? MPI_SUM : MPI_MAX,
                s_->mpi);
  count_allreduce(8 * n);
}

void NcclCommunicator::reduce_scatter(const float* send, float* recv, std::int64_t count) {
  ireduce_scatter(send, recv, count).wait();
}

void NcclCommunicator::all_gather(const float* send, float* recv, std::int64_t count) {
  iall_gather(send, recv, count).wait();
}

void NcclCommunicator::broadcast(float* data, std::int64_t n, int root) {
  check_nccl(ncclBroadcast(data, data, static_cast<size_t>(n), ncclFloat32, root, s_->nccl, s_->stream),
             "ncclBroadcast");
  if (s_->rank == root) count_send(4 * n);
  s_->sync();
}

void NcclCommunicator::send(const float* data, std::int64_t n, int peer, int tag) { isend(data, n, peer, tag).wait(); }

void NcclCommunicator::recv(float* data, std::int64_t n, int peer, int tag) { irecv(data, n, peer, tag).wait(); }

void NcclCommunicator::barrier() {
  s_->sync();
  MPI_Barrier(s_->mpi);
}

}  // namespace lamina
