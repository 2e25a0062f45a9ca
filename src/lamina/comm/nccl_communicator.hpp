#pragma once
// The NCCL backend (NVIDIA GPUs): collectives and point-to-point on device buffers, on
// a CUDA stream of its own. Its communicators are created over an MPI communicator of
// the same ranks, which also carries the few host-side scalars (losses, norms). No call
// blocks the host thread: waits poll within parallel.timeout, then abort the communicator.
// Built with LAMINA_ENABLE_NCCL; only ever constructed when the default execution space
// is CUDA.
#include <mpi.h>

#include <memory>
#include <string>

#include "lamina/comm/communicator.hpp"

namespace lamina {

// "NCCL <version>, CUDA runtime <version>" of the libraries this build links.
std::string nccl_backend_info();

class NcclCommunicator : public Communicator {
 public:
  NcclCommunicator(MPI_Comm comm, std::string name);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override;
  int size() const override;
  const std::string& name() const override;

  void allreduce(float* data, std::int64_t n, ReduceOp op) override;
  void allreduce(double* data, std::int64_t n, ReduceOp op) override;
  void allreduce_bf16(std::uint16_t* data, std::int64_t n) override;
  void reduce_scatter_bf16(const std::uint16_t* send, std::uint16_t* recv, std::int64_t count) override;
  void reduce_scatter(const float* send, float* recv, std::int64_t count) override;
  void all_gather(const float* send, float* recv, std::int64_t count) override;
  void broadcast(float* data, std::int64_t n, int root) override;
  void send(const float* data, std::int64_t n, int peer, int tag) override;
  void recv(float* data, std::int64_t n, int peer, int tag) override;
  void barrier() override;

  Request iallreduce(float* data, std::int64_t n, ReduceOp op) override;
  Request ireduce_scatter(const float* send, float* recv, std::int64_t count) override;
  Request iall_gather(const float* send, float* recv, std::int64_t count) override;
  Request isend(const float* data, std::int64_t n, int peer, int tag) override;
  Request irecv(float* data, std::int64_t n, int peer, int tag) override;
  Request isendrecv(const float* send, float* recv, std::int64_t n, int to, int from, int tag) override;
  Request isend_host(const double* data, std::int64_t n, int peer, int tag) override;
  Request irecv_host(double* data, std::int64_t n, int peer, int tag) override;

  struct State;  // the NCCL and CUDA handles (nccl_communicator.cpp)

 private:
  std::unique_ptr<State> s_;
};

}  // namespace lamina
