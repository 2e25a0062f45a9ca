#pragma once
// The gradients one rank accumulates and their data-parallel reduction, by ZeRO stage
// (Rajbhandari et al. 2020):
//   stage 0  full gradients, all-reduced in subgroup-sized buckets as soon as a layer is
//            done (the bucket reductions overlap the backward of earlier layers)
//   stage 1  full gradients, reduce-scattered: the owned shard is reduced in place
//   stage 2+ only the owned shard is kept; full-size accumulators come from a pool for
//            the micro-batches between two reductions and return to it once reduce-scattered
// From ZeRO-2 on one block's reduce-scatter is in flight at a time (it holds a full-size
// buffer), the embedding's and the final layer's beside it; ZeRO-1's hold a shard-sized
// staging buffer each until they complete. The first and last pipeline stages both hold
// the tied token embedding and add their halves in sync().
// A piece that several tensor-parallel ranks hold (a K/V head where tp exceeds kv_heads)
// has on each holder the gradient of its own query heads alone: the holders add theirs
// before the data-parallel reduction, so that every copy updates alike.
// Under sequence parallelism a norm's gain and bias have on each tensor-parallel rank the
// gradient of its own rows: the group adds them at the same point.
#include <cstdint>
#include <map>
#include <vector>

#include "lamina/comm/communicator.hpp"
#include "lamina/kernels/reduction.hpp"
#include "lamina/model/param_layout.hpp"
#include "lamina/parallel/completion.hpp"
#include "lamina/parallel/param_store.hpp"

namespace lamina {

// Elements of a layer's gradient buffers: the full one (below ZeRO-2) or the shard.
struct StoredGrads {
  std::int64_t full = 0, shard = 0;
  static StoredGrads of(const LayerShard& s, int zero) {
    return zero < 2 ? StoredGrads{s.padded, 0} : StoredGrads{0, s.shard};
  }
};

// A layer's pieces that several tensor-parallel ranks hold, as rows of its flat buffer.
struct ReplicatedPiece {
  std::int64_t offset = 0;               // flat index of the first row's first element
  std::int64_t rows = 0, cols = 0, stride = 0;
  int piece = 0, pieces = 1;             // this rank's piece, of how many distinct ones
  std::int64_t packed() const { return pieces * rows * cols; }
};
std::vector<ReplicatedPiece> replicated_pieces(const LayerSpec& layer);
// Elements of the buffer in which a layer's replicated pieces are summed: every piece of
// the group in its place, so that one all-reduce over the tensor-parallel group adds the
// copies of each.
std::int64_t replica_sum_elements(const LayerSpec& layer);

class GradientReducer {
 public:
  using Exec = DeviceExec;

  // bucket: elements per ZeRO-0 all-reduce.
  GradientReducer(MemoryTracker& tracker, const ParamLayout& layout, const ProcessGrid& grid,
                  const std::vector<int>& held, int zero, Precision precision, std::int64_t bucket,
                  DevicePools& pools, bool sequence_parallel = false);
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  void zero_grads();
  // The full-size accumulator of a layer (ZeRO >= 2 starts one on the first backward after
  // a reduction); gradients accumulate into grads().
  void begin(int layer);
  float* grads(int layer) const;

  // Starts the data-parallel reduction of a layer's gradients (non-blocking), whose
  // backward the caller has waited for, after adding the copies of its replicated pieces
  // (blocking); the completion adds a reduce-scattered shard into the accumulator and
  // gives the buffers back.
  Completion reduce(int layer);
  // Adds the tied embedding's two halves (pp > 1, tied), once every reduction is done.
  void sync_embedding();
  // The reduced gradients of the owned elements, device memory, at the first owned element.
  const float* owned(int layer) const;
  // Sum of squares of the gradients this rank is the one owner of (each element of the
  // model counted on exactly one rank), in one reduction; the caller sums it over the world.
  double sq_norm_local() const;
  // A layer's full gradients on the host (below ZeRO-2, one data-parallel rank's view).
  std::vector<float> full_host(int layer) const;

 private:
  struct Slot {
    LayerShard shard;
    Buffer<float, DeviceMem> grads, grad_shard;
    float* full_grads = nullptr;  // ZeRO >= 2: the accumulator until reduced
  };
  Slot& slot(int layer) { return slots_.at(layer); }
  void sum_replicas(int layer, float* full);
  void sum_norms(int layer, float* full);
  const Slot& slot(int layer) const { return slots_.at(layer); }

  const ParamLayout& layout_;
  const ProcessGrid& grid_;
  int zero_;
  std::int64_t bucket_;
  std::map<int, Slot> slots_;
  std::map<int, std::vector<ReplicatedPiece>> replicated_;
  // Sequence parallelism: per layer, the runs [offset, end) of its norms' tensors.
  std::map<int, std::vector<std::pair<std::int64_t, std::int64_t>>> norms_;
  Buffer<float, DeviceMem> replica_sums_;
  DevicePools& pools_;
  Exec follow_up_;  // where a reduce-scatter's shard is added into the accumulator
  SpansSumOfSquares<Exec> norm_;
};

}  // namespace lamina
