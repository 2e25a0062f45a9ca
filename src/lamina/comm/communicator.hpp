#pragma once
// The collectives and point-to-point messages the parallel runtime needs, behind one
// interface with an MPI backend (any machine) and an NCCL backend (NVIDIA GPUs). Buffers
// are float arrays in the default execution space's memory; the backend moves them as
// it must (CUDA-aware MPI, or a staging copy). Every call counts the bytes this rank
// sends, per communicator, so that traffic per parallel group can be reported.
//
// Byte counts use the ring algorithms' per-rank volume (what nccl-tests calls bus
// bytes): allreduce 2 (p-1)/p S, reduce-scatter and all-gather (p-1)/p S for S bytes of
// full data, broadcast S, send S. They depend on what is called, not on how a library
// happens to implement it, so they compare with the analytic counts in the papers.
#include <cstdint>
#include <memory>
#include <string>

namespace lamina {

enum class ReduceOp { sum, max };

// A non-blocking operation in flight. wait() completes it (a no-op once completed).
class Request {
 public:
  class Impl {
   public:
    virtual ~Impl() = default;
    virtual void wait() = 0;
    virtual bool test() = 0;  // completed (then it is finished, as by wait)?
  };
  Request() = default;
  explicit Request(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
  void wait() {
    if (impl_) impl_->wait();
    impl_.reset();
  }
  // True when the operation has completed (and finishes it); never blocks.
  bool test() {
    if (impl_ && impl_->test()) impl_.reset();
    return !impl_;
  }
  bool pending() const { return static_cast<bool>(impl_); }

 private:
  std::unique_ptr<Impl> impl_;
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual const std::string& name() const = 0;  // "dp", "tp", "pp", "world", ...

  // In place over all ranks.
  virtual void allreduce(float* data, std::int64_t n, ReduceOp op) = 0;
  virtual void allreduce(double* data, std::int64_t n, ReduceOp op) = 0;
  // Sum in place of bf16 values (their bits), each pair summed in fp32 and rounded to
  // nearest even: what a bf16 run's tensor-parallel partial results take, half the bytes.
  virtual void allreduce_bf16(std::uint16_t* data, std::int64_t n) = 0;
  // The same sum as a reduce-scatter (sequence parallelism's, in bf16 runs): send holds
  // size() * count values, rank r receives the summed block r.
  virtual void reduce_scatter_bf16(const std::uint16_t* send, std::uint16_t* recv, std::int64_t count) = 0;
  // send: size() * count elements; rank r receives the reduced block r.
  virtual void reduce_scatter(const float* send, float* recv, std::int64_t count) = 0;
  // send: count elements; recv: size() * count, rank r's block at r * count.
  virtual void all_gather(const float* send, float* recv, std::int64_t count) = 0;
  virtual void broadcast(float* data, std::int64_t n, int root) = 0;
  virtual void send(const float* data, std::int64_t n, int peer, int tag) = 0;
  virtual void recv(float* data, std::int64_t n, int peer, int tag) = 0;
  virtual void barrier() = 0;

  virtual Request iallreduce(float* data, std::int64_t n, ReduceOp op) = 0;
  virtual Request ireduce_scatter(const float* send, float* recv, std::int64_t count) = 0;
  virtual Request iall_gather(const float* send, float* recv, std::int64_t count) = 0;
  virtual Request isend(const float* data, std::int64_t n, int peer, int tag) = 0;
  virtual Request irecv(float* data, std::int64_t n, int peer, int tag) = 0;
  // One step of a ring: n elements to rank `to` and n from rank `from` at once (with NCCL,
  // one group, so that a ring of such calls cannot deadlock).
  virtual Request isendrecv(const float* send, float* recv, std::int64_t n, int to, int from, int tag) = 0;
  // Host memory (a rank's scalars, the executor's virtual-clock stamps): never staged
  // through the device, never counted as traffic of the group.
  virtual Request isend_host(const double* data, std::int64_t n, int peer, int tag) = 0;
  virtual Request irecv_host(double* data, std::int64_t n, int peer, int tag) = 0;

  std::int64_t bytes_sent() const { return bytes_; }
  void reset_bytes() { bytes_ = 0; }

 protected:
  void count_allreduce(std::int64_t bytes) { bytes_ += ring(2 * bytes); }
  void count_ring(std::int64_t full_bytes) { bytes_ += ring(full_bytes); }
  void count_send(std::int64_t bytes) { bytes_ += bytes; }

 private:
  std::int64_t ring(std::int64_t bytes) const { return size() > 1 ? bytes * (size() - 1) / size() : 0; }
  std::int64_t bytes_ = 0;
};

}  // namespace lamina
