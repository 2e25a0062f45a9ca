#pragma once
// The MPI backend. Device buffers go straight to MPI when the library reads device memory
// (asked where the library has a query: Open MPI's MPIX_Query_cuda_support, MPICH 4's
// MPIX_GPU_query_support; or as the deck's parallel.mpi_device_buffers or the environment's
// LAMINA_MPI_DEVICE_BUFFERS say), otherwise through host staging. A group of one calls no MPI
// for float collectives and stages nothing: its input is the result. Every wait is bounded by
// parallel.timeout (core/bounded_wait.hpp).
#include <mpi.h>

#include <vector>

#include "lamina/comm/communicator.hpp"
#include "lamina/core/config.hpp"

namespace lamina {

// Waits for a request of a raw MPI call within parallel.timeout; `what` names it in the
// timeout's message ("MPI_Ibcast of the plan on world").
void wait_bounded(MPI_Request& request, const std::string& what);

// How many ranks of `comm` run on this rank's node (collective over comm).
int ranks_on_node(MPI_Comm comm);

// The reduction allreduce_bf16 applies: bf16 values (MPI_UINT16_T) summed pairwise in fp32
// and rounded to nearest even. Created on first use, after MPI_Init.
MPI_Op bf16_sum_op();

// A raw MPI request as a Request, each wait bounded and described by `what`.
Request bounded_request(MPI_Request request, std::string what);

// Whether device buffers go to MPI as they are (before the first communicator is made; the
// environment's LAMINA_MPI_DEVICE_BUFFERS = direct | staged | auto overrides the deck).
void set_mpi_device_buffers(MpiDeviceBuffers how);
MpiDeviceBuffers mpi_device_buffers_from_env(MpiDeviceBuffers deck);

class MpiCommunicator : public Communicator {
 public:
  // Takes ownership of comm (freed on destruction) unless it is MPI_COMM_WORLD/SELF.
  MpiCommunicator(MPI_Comm comm, std::string name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  MPI_Comm comm() const { return comm_; }

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

  // "MPI_Irecv with world rank 3 (group 'pp')", "MPI_Iallreduce on group 'dp' (world ranks 0 2)".
  std::string describe_wait(const char* op, int peer) const;

  // Whether buffers in the default execution space's memory can be handed to MPI as is.
  static bool device_buffers_direct();

 private:
  MPI_Comm comm_;
  std::string name_;
  int rank_ = 0, size_ = 1;
  bool owned_ = false;
  std::vector<int> world_ranks_;  // of this group's ranks, for messages
};

}  // namespace lamina
