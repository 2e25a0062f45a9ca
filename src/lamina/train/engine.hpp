#pragma once
// One model replica on one execution space: parameters, gradients and AdamW state in
// per-layer flat buffers, the activations of one micro-batch, and the operations a
// training step is made of. The trainer, `lamina verify`, `lamina bench` and the tests
// all drive this same object.
#include <Kokkos_Core.hpp>
#include <cmath>
#include <cstdint>
#include <vector>

#include "lamina/core/deck.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/model/gpt.hpp"
#include "lamina/model/init.hpp"
#include "lamina/model/param_store.hpp"
#include "lamina/optim/adamw_optimizer.hpp"

namespace lamina {

template <class Exec>
class Engine {
 public:
  using Mem = typename Exec::memory_space;

  Engine(MemoryTracker& tracker, const ModelConfig& model, const OptimizerConfig& opt, std::int64_t micro_batch,
         Exec exec = Exec())
      : exec_(exec),
        model_(model),
        layout_(ParamLayout::gpt2(model)),
        params_(tracker, MemCategory::parameters, "params", layout_),
        grads_(tracker, MemCategory::gradients, "grads", layout_),
        adam_(tracker, layout_, opt),
        acts_(tracker, Dims::of(model, micro_batch), model.layers),
        w_(bind_gpt_tensors<Exec>(layout_, params_.bases())),
        g_(bind_gpt_tensors<Exec>(layout_, grads_.bases())) {}

  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  const ParamLayout& layout() const { return layout_; }
  const FlatStore<Exec>& params() const { return params_; }
  const FlatStore<Exec>& grads() const { return grads_; }
  AdamW<Exec>& optimizer() { return adam_; }
  GptActivations<Exec>& activations() { return acts_; }
  const GptTensors<Exec>& weights() const { return w_; }
  const Exec& exec() const { return exec_; }
  std::int64_t micro_batch() const { return acts_.dims().B; }

  // GPT-2 initial weights, drawn on the host and copied in.
  void init_params(std::uint64_t seed) {
    for (int i = 0; i < layout_.num_layers(); ++i) {
      auto host = Kokkos::create_mirror_view(params_.layer(i));
      initial_values(layout_, model_, seed, i, 0, layout_.layers()[i].numel, host.data());
      Kokkos::deep_copy(exec_, params_.layer(i), host);
    }
    exec_.fence();
  }

  void zero_grads() { grads_.zero(exec_); }

  // inputs, targets: host arrays of micro_batch * seq_len token ids.
  void load_tokens(const std::int32_t* inputs, const std::int32_t* targets) {
    const std::int64_t n = acts_.dims().N();
    Kokkos::View<const std::int32_t*, Kokkos::HostSpace, Kokkos::MemoryTraits<Kokkos::Unmanaged>> hi(inputs, n),
        ht(targets, n);
    Kokkos::deep_copy(exec_, acts_.inputs, hi);
    Kokkos::deep_copy(exec_, acts_.targets, ht);
  }

  // Forward and backward on the loaded micro-batch; gradients accumulate. Returns the
  // sum of the per-position losses.
  double forward_backward(float loss_scale) {
    forward();
    const double sum = loss_sum();
    backward(loss_scale);
    return sum;
  }

  void forward() { gpt_forward(exec_, w_, acts_); }
  // Sum of the per-position losses of the last forward pass (fences).
  double loss_sum() const { return sum_losses(exec_, acts_); }
  void backward(float loss_scale) { gpt_backward(exec_, g_, w_, acts_, loss_scale); }

  double grad_norm() const { return global_grad_norm(exec_, grads_); }

  void optimizer_step(double lr, double grad_scale) {
    adam_.step(exec_, params_, grads_, lr, grad_scale);
  }

  // Host slabs of every checkpointed tensor (parameters and both Adam moments); `host`
  // keeps the staging copies alive. With one process, each slab is the whole tensor.
  std::vector<TensorSlab> checkpoint_slabs(std::vector<typename Vec<Exec>::HostMirror>& host,
                                           bool copy_to_host) {
    std::vector<TensorSlab> slabs;
    const FlatStore<Exec>* stores[3] = {&params_, &adam_.exp_avg(), &adam_.exp_avg_sq()};
    const char* prefixes[3] = {"model/", "optimizer/exp_avg/", "optimizer/exp_avg_sq/"};
    host.clear();
    for (int s = 0; s < 3; ++s) {
      for (int i = 0; i < layout_.num_layers(); ++i) {
        const Vec<Exec> dev = stores[s]->layer(i);
        host.push_back(Kokkos::create_mirror_view(dev));
        if (copy_to_host) Kokkos::deep_copy(host.back(), dev);
        for (const TensorSpec& t : layout_.layers()[i].tensors) {
          TensorSlab slab;
          slab.name = prefixes[s] + t.name;
          slab.global_shape = t.shape;
          slab.offset.assign(t.shape.size(), 0);
          slab.count = t.shape;
          slab.data = host.back().data() + t.offset;
          slabs.push_back(slab);
        }
      }
    }
    return slabs;
  }

  // After slabs from checkpoint_slabs(copy_to_host = false) were filled from a file.
  void restore_from_host(const std::vector<typename Vec<Exec>::HostMirror>& host) {
    const FlatStore<Exec>* stores[3] = {&params_, &adam_.exp_avg(), &adam_.exp_avg_sq()};
    std::size_t k = 0;
    for (int s = 0; s < 3; ++s) {
      for (int i = 0; i < layout_.num_layers(); ++i) Kokkos::deep_copy(stores[s]->layer(i), host[k++]);
    }
  }

 private:
  Exec exec_;
  ModelConfig model_;
  ParamLayout layout_;
  FlatStore<Exec> params_, grads_;
  AdamW<Exec> adam_;
  GptActivations<Exec> acts_;
  GptTensors<Exec> w_, g_;
};

}  // namespace lamina
