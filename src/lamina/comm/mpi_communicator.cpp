#include "lamina/comm/mpi_communicator.hpp"

#include <dlfcn.h>
#include <mpi.h>

#include <Kokkos_Core.hpp>
#include <atomic>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "lamina/core/exec_instances.hpp"

#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/kernels/bf16.hpp"

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

using Exec = Kokkos::DefaultExecutionSpace;

// Where the staging copies of a library that cannot read device memory run: an instance of
// their own, so that waiting for one waits for nothing else queued on the device (a copy
// without an instance would synchronize the whole device, NCCL's streams included).
const Exec& staging_instance() {
  static const Exec e = transfer_instance<Exec>();
  return e;
}

template <class T>
using DeviceView = Kokkos::View<T*, DeviceMem, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;

template <class T>
DeviceView<T> device_view(const T* p, std::int64_t n) {
  return DeviceView<T>(const_cast<T*>(p), static_cast<std::size_t>(n));
}

// A host copy of a device buffer for an MPI library that cannot read device memory. The
// caller has waited for the work that wrote the buffer.
template <class T>
class StagedOf {
 public:
  StagedOf(const T* device, std::int64_t n, bool copy_in) : device_(const_cast<T*>(device)), n_(n) {
    if (direct()) return;
    host_.reset(new T[static_cast<std::size_t>(n)]);  // not value-initialised: MPI or the copy writes it
    if (copy_in) {
      Kokkos::deep_copy(staging_instance(), host_view(), device_view(device_, n_));
      staging_instance().fence();
    }
  }
  T* get() { return direct() ? device_ : host_.get(); }
  void copy_out() {
    if (direct()) return;
    Kokkos::deep_copy(staging_instance(), device_view(device_, n_), host_view());
    staging_instance().fence();
  }

 private:
  static bool direct() { return MpiCommunicator::device_buffers_direct(); }
  using HostView = Kokkos::View<T*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>>;
  HostView host_view() { return HostView(host_.get(), static_cast<std::size_t>(n_)); }
  T* device_;
  std::int64_t n_;
  std::unique_ptr<T[]> host_;
};
using Staged = StagedOf<float>;

// A group of one: what a collective would deliver is its own input, copied on the device
// where input and output differ; staging it through the host would move it twice for nothing.
template <class T>
Request copied_alone(const T* send, T* recv, std::int64_t n) {
  if (send != recv) {
    Kokkos::deep_copy(staging_instance(), device_view(recv, n), device_view(send, n));
    staging_instance().fence();
  }
  return Request();
}

// MPI's user function for bf16 sums: each pair in fp32, rounded to nearest even (the
// rounding of the exact sum of two bf16 values, so the order of a pair does not matter).
void bf16_sum(void* in, void* inout, int* len, MPI_Datatype*) {
  const auto* a = static_cast<const std::uint16_t*>(in);
  auto* b = static_cast<std::uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = to_bf16(from_bf16(a[i]) + from_bf16(b[i]));
}

class MpiRequest : public Request::Impl {
 public:
  MpiRequest(const MpiCommunicator& comm, const char* op, int peer, std::unique_ptr<Staged> out,
             std::unique_ptr<Staged> in)
      : comm_(comm), op_(op), peer_(peer), out_(std::move(out)), in_(std::move(in)) {}
  MPI_Request* handle() { return &req_; }
  void wait() override {
    bounded_wait([this] { return poll(); }, [this] { return comm_.describe_wait(op_, peer_); });
    if (out_) out_->copy_out();
  }
  bool test() override {
    const bool done = poll();
    if (done && out_) out_->copy_out();
    return done;
  }

 private:
  bool poll() {
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), op_);
    return done != 0;
  }
  const MpiCommunicator& comm_;
  const char* op_;
  int peer_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  std::unique_ptr<Staged> out_;  // copied back to the device at completion
  std::unique_ptr<Staged> in_;   // kept alive until completion
};

// The world ranks of a group's members, in group order.
std::vector<int> world_ranks_of(MPI_Comm comm) {
  MPI_Group group = MPI_GROUP_NULL, world = MPI_GROUP_NULL;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int n = 0;
  MPI_Group_size(group, &n);
  std::vector<int> mine(static_cast<std::size_t>(n)), out(static_cast<std::size_t>(n));
  for (int i = 0; i < n; ++i) mine[static_cast<std::size_t>(i)] = i;
  MPI_Group_translate_ranks(group, n, mine.data(), world, out.data());
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return out;
}

}  // namespace

MPI_Op bf16_sum_op() {
  static const MPI_Op op = [] {
    MPI_Op o = MPI_OP_NULL;
    check(MPI_Op_create(&bf16_sum, 1, &o), "MPI_Op_create");
    return o;
  }();
  return op;
}

void wait_bounded(MPI_Request& request, const std::string& what) {
  bounded_wait(
      [&] {
        int done = 0;
        check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
        return done != 0;
      },
      [&] { return what; });
}

int ranks_on_node(MPI_Comm comm) {
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  int n = 1;
  MPI_Comm_size(node, &n);
  MPI_Comm_free(&node);
  return n;
}

namespace {

std::atomic<int> g_device_buffers{static_cast<int>(MpiDeviceBuffers::automatic)};

// What the MPI library says of itself, where it has a way to say it.
bool library_reads_device_memory() {
#if defined(KOKKOS_ENABLE_CUDA) && defined(MPIX_GPU_SUPPORT_CUDA)
  int yes = 0;  // MPICH 4 and its derivatives (Cray MPICH, Intel MPI) declare it in mpi.h
  return MPIX_GPU_query_support(MPIX_GPU_SUPPORT_CUDA, &yes) == MPI_SUCCESS && yes != 0;
#elif defined(KOKKOS_ENABLE_HIP) && defined(MPIX_GPU_SUPPORT_HIP)
  int yes = 0;
  return MPIX_GPU_query_support(MPIX_GPU_SUPPORT_HIP, &yes) == MPI_SUCCESS && yes != 0;
#elif defined(KOKKOS_ENABLE_CUDA)
  // Open MPI declares MPIX_Query_cuda_support only in an extension header of its own, which
  // other MPIs lack: looked up by name instead, present where its CUDA extension was built.
  using Query = int (*)();
  const auto query = reinterpret_cast<Query>(::dlsym(RTLD_DEFAULT, "MPIX_Query_cuda_support"));
  return query != nullptr && query() == 1;
#else
  return false;  // no query: staged, unless the deck or LAMINA_MPI_DEVICE_BUFFERS says otherwise
#endif
}

}  // namespace

void set_mpi_device_buffers(MpiDeviceBuffers how) { g_device_buffers = static_cast<int>(how); }

MpiDeviceBuffers mpi_device_buffers_from_env(MpiDeviceBuffers deck) {
  const char* v = std::getenv("LAMINA_MPI_DEVICE_BUFFERS");
  if (v == nullptr || *v == '\0') return deck;
  if (std::strcmp(v, "direct") == 0) return MpiDeviceBuffers::direct;
  if (std::strcmp(v, "staged") == 0) return MpiDeviceBuffers::staged;
  if (std::strcmp(v, "auto") == 0) return MpiDeviceBuffers::automatic;
  throw InputError(std::string("LAMINA_MPI_DEVICE_BUFFERS=") + v + ": use direct, staged or auto");
}

bool MpiCommunicator::device_buffers_direct() {
  if (kHostAccessible) return true;
  switch (static_cast<MpiDeviceBuffers>(g_device_buffers.load())) {
    case MpiDeviceBuffers::direct: return true;
    case MpiDeviceBuffers::staged: return false;
    case MpiDeviceBuffers::automatic: break;
  }
  static const bool aware = library_reads_device_memory();
  return aware;
}

Request bounded_request(MPI_Request request, std::string what) {
  class Raw final : public Request::Impl {
   public:
    Raw(MPI_Request r, std::string what) : r_(r), what_(std::move(what)) {}
    void wait() override { wait_bounded(r_, what_); }
    bool test() override {
      int done = 0;
      check(MPI_Test(&r_, &done, MPI_STATUS_IGNORE), "MPI_Test");
      return done != 0;
    }

   private:
    MPI_Request r_;
    std::string what_;
  };
  return Request(std::make_unique<Raw>(request, std::move(what)));
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, std::string name) : comm_(comm), name_(std::move(name)) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  owned_ = comm_ != MPI_COMM_WORLD && comm_ != MPI_COMM_SELF && comm_ != MPI_COMM_NULL;
  // Errors come back as codes and become exceptions with context, instead of aborting.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  world_ranks_ = world_ranks_of(comm_);
}

MpiCommunicator::~MpiCommunicator() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owned_ && !finalized) MPI_Comm_free(&comm_);
}

std::string MpiCommunicator::describe_wait(const char* op, int peer) const {
  if (peer >= 0) {
    return strprintf("%s with world rank %d (group '%s')", op, world_ranks_[static_cast<std::size_t>(peer)], name_.c_str());
  }
  std::string ranks;
  for (int r : world_ranks_) ranks += " " + std::to_string(r);
  return strprintf("%s on group '%s' (world ranks%s)", op, name_.c_str(), ranks.c_str());
}

// The blocking calls are their non-blocking forms waited for, so that every wait is bounded.
void MpiCommunicator::allreduce(float* data, std::int64_t n, ReduceOp op) { iallreduce(data, n, op).wait(); }

void MpiCommunicator::allreduce(double* data, std::int64_t n, ReduceOp op) {
  // Scalars (losses, norms) that the runtime keeps on the host.
  auto r = std::make_unique<MpiRequest>(*this, "MPI_Iallreduce", -1, nullptr, nullptr);
  check(MPI_Iallreduce(MPI_IN_PLACE, data, count_of(n), MPI_DOUBLE, op_of(op), comm_, r->handle()), "MPI_Iallreduce");
  count_allreduce(8 * n);
  Request(std::move(r)).wait();
}

void MpiCommunicator::allreduce_bf16(std::uint16_t* data, std::int64_t n) {
  if (size_ == 1) return;
  StagedOf<std::uint16_t> s(data, n, true);
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Iallreduce(MPI_IN_PLACE, s.get(), count_of(n), MPI_UINT16_T, bf16_sum_op(), comm_, &r), "MPI_Iallreduce");
  count_allreduce(2 * n);
  wait_bounded(r, describe_wait("MPI_Iallreduce (bf16)", -1));
  s.copy_out();
}

void MpiCommunicator::reduce_scatter_bf16(const std::uint16_t* send, std::uint16_t* recv, std::int64_t count) {
  if (size_ == 1) {
    copied_alone(send, recv, count);
    return;
  }
  StagedOf<std::uint16_t> in(send, count * size_, true);
  StagedOf<std::uint16_t> out(recv, count, false);
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Ireduce_scatter_block(in.get(), out.get(), count_of(count), MPI_UINT16_T, bf16_sum_op(), comm_, &r),
        "MPI_Ireduce_scatter_block");
  count_ring(2 * count * size_);
  wait_bounded(r, describe_wait("MPI_Ireduce_scatter_block (bf16)", -1));
  out.copy_out();
}

void MpiCommunicator::reduce_scatter(const float* send, float* recv, std::int64_t count) {
  ireduce_scatter(send, recv, count).wait();
}

void MpiCommunicator::all_gather(const float* send, float* recv, std::int64_t count) {
  iall_gather(send, recv, count).wait();
}

void MpiCommunicator::broadcast(float* data, std::int64_t n, int root) {
  if (size_ == 1) return;
  auto s = std::make_unique<Staged>(data, n, rank_ == root);
  float* p = s->get();
  auto r = std::make_unique<MpiRequest>(*this, "MPI_Ibcast", -1, std::move(s), nullptr);
  check(MPI_Ibcast(p, count_of(n), MPI_FLOAT, root, comm_, r->handle()), "MPI_Ibcast");
  if (rank_ == root) count_send(4 * n);
  Request(std::move(r)).wait();
}

void MpiCommunicator::send(const float* data, std::int64_t n, int peer, int tag) { isend(data, n, peer, tag).wait(); }

void MpiCommunicator::recv(float* data, std::int64_t n, int peer, int tag) { irecv(data, n, peer, tag).wait(); }

void MpiCommunicator::barrier() {
  auto r = std::make_unique<MpiRequest>(*this, "MPI_Ibarrier", -1, nullptr, nullptr);
  check(MPI_Ibarrier(comm_, r->handle()), "MPI_Ibarrier");
  Request(std::move(r)).wait();
}

Request MpiCommunicator::iallreduce(float* data, std::int64_t n, ReduceOp op) {
  if (size_ == 1) return Request();  // the sum over a group of one is the data
  auto s = std::make_unique<Staged>(data, n, true);
  float* p = s->get();
  auto r = std::make_unique<MpiRequest>(*this, "MPI_Iallreduce", -1, std::move(s), nullptr);
  check(MPI_Iallreduce(MPI_IN_PLACE, p, count_of(n), MPI_FLOAT, op_of(op), comm_, r->handle()), "MPI_Iallreduce");
  count_allreduce(4 * n);
  return Request(std::move(r));
}

Request MpiCommunicator::ireduce_scatter(const float* send, float* recv, std::int64_t count) {
  if (size_ == 1) return copied_alone(send, recv, count);
  auto in = std::make_unique<Staged>(send, count * size_, true);
  auto out = std::make_unique<Staged>(recv, count, false);
  const float* pin = in->get();
  float* pout = out->get();
  auto r = std::make_unique<MpiRequest>(*this, "MPI_Ireduce_scatter_block", -1, std::move(out), std::move(in));
  check(MPI_Ireduce_scatter_block(pin, pout, count_of(count), MPI_FLOAT, MPI_SUM, comm_, r->handle()),
        "MPI_Ireduce_scatter_block");
  count_ring(4 * count * size_);
  return Request(std::move(r));
}

Request MpiCommunicator::iall_gather(const float* send, float* recv, std::int64_t count) {
  if (size_ == 1) return copied_alone(send, recv, count);
  auto in = std::make_unique<Staged>(send, count, true);
  auto out = std::make_unique<Staged>(recv, count * size_, false);
  const float* pin = in->get();
  float* pout = out->get();
  auto r = std::make_unique<MpiRequest>(*this, "MPI_Iallgather", -1, std::move(out), std::move(in));
  check(MPI_Iallgather(pin, count_of(count), MPI_FLOAT, pout, count_of(count), MPI_FLOAT, comm_, r->handle()),
        "MPI_Iallgather");
  count_ring(4 * count * size_);
  return Request(std::move(r));
}

Request MpiCommunicator::isend(const float* data, std::int64_t n, int peer, int tag) {
  auto in = std::make_unique<Staged>(data, n, true);
  const float* p = in->get();
  auto r = std::make_unique<MpiRequest>(*this, "MPI_Isend", peer, nullptr, std::move(in));
  check(MPI_Isend(p, count_of(n), MPI_FLOAT, peer, tag, comm_, r->handle()), "MPI_Isend");
  count_send(4 * n);
  return Request(std::move(r));
}

Request MpiCommunicator::isend_host(const double* data, std::int64_t n, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Isend(data, count_of(n), MPI_DOUBLE, peer, tag, comm_, &r), "MPI_Isend");
  return bounded_request(r, describe_wait("MPI_Isend", peer));
}

Request MpiCommunicator::irecv_host(double* data, std::int64_t n, int peer, int tag) {
  MPI_Request r = MPI_REQUEST_NULL;
  check(MPI_Irecv(data, count_of(n), MPI_DOUBLE, peer, tag, comm_, &r), "MPI_Irecv");
  return bounded_request(r, describe_wait("MPI_Irecv", peer));
}

Request MpiCommunicator::irecv(float* data, std::int64_t n, int peer, int tag) {
  auto out = std::make_unique<Staged>(data, n, false);
  float* p = out->get();
  auto r = std::make_unique<MpiRequest>(*this, "MPI_Irecv", peer, std::move(out), nullptr);
  check(MPI_Irecv(p, count_of(n), MPI_FLOAT, peer, tag, comm_, r->handle()), "MPI_Irecv");
  return Request(std::move(r));
}

Request MpiCommunicator::isendrecv(const float* send, float* recv, std::int64_t n, int to, int from, int tag) {
  class Both final : public Request::Impl {
   public:
    Both(Request a, Request b) : a_(std::move(a)), b_(std::move(b)) {}
    void wait() override {
      a_.wait();
      b_.wait();
    }
    bool test() override { return a_.test() && b_.test(); }

   private:
    Request a_, b_;
  };
  Request r = irecv(recv, n, from, tag);
  return Request(std::make_unique<Both>(std::move(r), isend(send, n, to, tag)));
}

}  // namespace lamina
