#include "lamina/comm/mpi_communicator.hpp"

#include <mpi-ext.h>

#include <Kokkos_Core.hpp>
#include <climits>
#include <vector>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

namespace {

using DeviceMem = Kokkos::DefaultExecutionSpace::memory_space;
constexpr bool kHostAccessible = Kokkos::SpaceAccessibility<Kokkos::HostSpace, DeviceMem>::accessible;

int count_of(std::int64_t n) {
  if (n < 0 || n > INT_MAX) {
    throw RunError(strprintf("an MPI message of %lld elements exceeds MPI's int count; lower optimizer.subgroup_size",
                             static_cast<long long>(n)));
  }
  return static_cast<int>(n);
}

void check(int rc, const char* what) {
  if (rc != MPI_SUCCESS) {
    char msg[MPI_MAX_ERROR_STRING];
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    throw RunError(std::string(what) + " failed: " + std::string(msg, static_cast<std::size_t>(len)));
  }
}

MPI_Op op_of(ReduceOp op) { return op == ReduceOp::sum ? MPI_SUM : MPI_MAX; }

// A host copy of a device buffer for an MPI library that cannot read device memory.
class Staged {
 public:
  Staged(const float* device, std::int64_t n, bool copy_in) : device_(const_cast<float*>(device)), n_(n) {
    if (direct()) return;
    host_.resize(static_cast<std::size_t>(n));
    if (copy_in) Kokkos::deep_copy(host_view(), device_view());
  }
  float* get() { return direct() ? device_ : host_.data(); }
  void copy_out() {
    if (!direct()) Kokkos::deep_copy(device_view(), host_view());
  }

 private:
  static bool direct() { return MpiCommunicator::device_buffers_direct(); }
  using DeviceView = Kokkos::View<float*, DeviceMem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  using HostView = Kokkos::View<float*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  DeviceView device_view() const { return DeviceView(device_, static_cast<std::size_t>(n_)); }
  HostView host_view() { return HostView(host_.data(), static_cast<std::size_t>(n_)); }
  float* device_;
  std::int64_t n_;
  std::vector<float> host_;
};

class MpiRequest : public Request::Impl {
 public:
  MpiRequest(std::unique_ptr<Staged> out, std::unique_ptr<Staged> in) : out_(std::move(out)), in_(std::move(in)) {}
  MPI_Request* handle() { return &req_; }
  void wait() override {
    check(MPI_Wait(&req_, MPI_STATUS_IGNORE), "MPI_Wait");
    if (out_) out_->copy_out();
  }
  bool test() override {
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done && out_) out_->copy_out();
    return done != 0;
  }

 private:
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::unique_ptr<Staged> out_;  // copied back to the device at completion
  std::unique_ptr<Staged> in_;   // kept alive until completion
};

}  // namespace

bool MpiCommunicator::device_buffers_direct() {
  if (kHostAccessible) return true;
#if defined(MPIX_CUDA_AWARE_SUPPORT) && MPIX_CUDA_AWARE_SUPPORT
  static const bool aware = MPIX_Query_cuda_support() == 1;
  return aware;
#else
  return false;
#endif
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  owned_ = comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL;
  // Errors come back as codes and become exceptions with context, instead of aborting.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

void MpiCommunicator::allreduce(float* data, std::int64_t n, ReduceOp op) {
  Staged s(data, n, true);
  check(MPI_Allreduce(MPI_IN_PLACE, s.get(), count_of(n), MPI_FLOAT, op_of(op), comm_), "MPI_Allreduce");
  s.copy_out();
  count_allreduce(4 * n);
}

void MpiCommunicator::allreduce(double* data, std::int64_t n, ReduceOp op) {
  // Scalars (losses, norms) that the runtime keeps on the host.
  check(MPI_Allreduce(MPI_IN_PLACE, data, count_of(n), MPI_DOUBLE, op_of(op), comm_), "MPI_Allreduce");
  count_allreduce(8 * n);
}

void MpiCommunicator::reduce_scatter(const float* send, float* recv, std::int64_t count) {
  Staged in(send, count * size_, true), out(recv, count, false);
  check(MPI_Reduce_scatter_block(in.get(), out.get(), count_of(count), MPI_FLOAT, MPI_SUM, comm_),
        "MPI_Reduce_scatter_block");
  out.copy_out();
  count_ring(4 * count * size_);
}

void MpiCommunicator::all_gather(const float* send, float* recv, std::int64_t count) {
  Staged in(send, count, true), out(recv, count * size_, false);
  check(MPI_Allgather(in.get(), count_of(count), MPI_FLOAT, out.get(), count_of(count), MPI_FLOAT, comm_),
        "MPI_Allgather");
  out.copy_out();
  count_ring(4 * count * size_);
}

void MpiCommunicator::broadcast(float* data, std::int64_t n, int root) {
  Staged s(data, n, rank_ == root);
  check(MPI_Bcast(s.get(), count_of(n), MPI_FLOAT, root, comm_), "MPI_Bcast");
  s.copy_out();
  if (rank_ == root) count_send(4 * n);
}

void MpiCommunicator::send(const float* data, std::int64_t n, int peer, int tag) {
  Staged s(data, n, true);
  check(MPI_Send(s.get(), count_of(n), MPI_FLOAT, peer, tag, comm_), "MPI_Send");
  count_send(4 * n);
}

void MpiCommunicator::recv(float* data, std::int64_t n, int peer, int tag) {
  Staged s(data, n, false);
  check(MPI_Recv(s.get(), count_of(n), MPI_FLOAT, peer, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
  s.copy_out();
}

void MpiCommunicator::barrier() { check(MPI_Barrier(comm_), "MPI_Barrier"); }

Request MpiCommunicator::iallreduce(float* data, std::int64_t n, ReduceOp op) {
  auto s = std::make_unique<Staged>(data, n, true);
  float* p = s->get();
  auto r = std::make_unique<MpiRequest>(std::move(s), nullptr);
  check(MPI_Iallreduce(MPI_IN_PLACE, p, count_of(n), MPI_FLOAT, op_of(op), comm_, r->handle()), "MPI_Iallreduce");
  count_allreduce(4 * n);
  return Request(std::move(r));
}

Request MpiCommunicator::ireduce_scatter(const float* send, float* recv, std::int64_t count) {
  auto in = std::make_unique<Staged>(send, count * size_, true);
  auto out = std::make_unique<Staged>(recv, count, false);
  const float* pin = in->get();
  float* pout = out->get();
  auto r = std::make_unique<MpiRequest>(std::move(out), std::move(in));
  check(MPI_Ireduce_scatter_block(pin, pout, count_of(count), MPI_FLOAT, MPI_SUM, comm_, r->handle()),
        "MPI_Ireduce_scatter_block");
  count_ring(4 * count * size_);
  return Request(std::move(r));
}

Request MpiCommunicator::iall_gather(const float* send, float* recv, std::int64_t count) {
  auto in = std::make_unique<Staged>(send, count, true);
  auto out = std::make_unique<Staged>(recv, count * size_, false);
  const float* pin = in->get();
  float* pout = out->get();
  auto r = std::make_unique<MpiRequest>(std::move(out), std::move(in));
  check(MPI_Iallgather(pin, count_of(count), MPI_FLOAT, pout, count_of(count), MPI_FLOAT, comm_, r->handle()),
        "MPI_Iallgather");
  count_ring(4 * count * size_);
  return Request(std::move(r));
}

Request MpiCommunicator::isend(const float* data, std::int64_t n, int peer, int tag) {
  auto in = std::make_unique<Staged>(data, n, true);
  const float* p = in->get();
  auto r = std::make_unique<MpiRequest>(nullptr, std::move(in));
  check(MPI_Isend(p, count_of(n), MPI_FLOAT, peer, tag, comm_, r->handle()), "MPI_Isend");
  count_send(4 * n);
  return Request(std::move(r));
}

Request MpiCommunicator::irecv(float* data, std::int64_t n, int peer, int tag) {
  auto out = std::make_unique<Staged>(data, n, false);
  float* p = out->get();
  auto r = std::make_unique<MpiRequest>(std::move(out), nullptr);
  check(MPI_Irecv(p, count_of(n), MPI_FLOAT, peer, tag, comm_, r->handle()), "MPI_Irecv");
  return Request(std::move(r));
}

}  // namespace lamina
