#pragma once
// Everything of the model one rank holds: its parameter store, its gradient reducer and
// one optimizer per layer (device, host or Deep Optimizer States, from memory/), for the
// layers its pipeline stage needs, in its tensor-parallel shapes. Besides owning them, it
// moves whole layers in and out of them (initial values, checkpoints, `lamina verify`),
// gathering and scattering shards over the data-parallel group.
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"
#include "lamina/io/model_checkpoint.hpp"
#include "lamina/model/gpt_tensors.hpp"
#include "lamina/optim/layer_optimizer.hpp"
#include "lamina/parallel/grad_reducer.hpp"
#include "lamina/parallel/param_store.hpp"
#include "lamina/parallel/stage_streams.hpp"

namespace lamina {

class RankState : public ModelStateAccess {
 public:
  using Exec = DeviceExec;

  // optimizers: one per held layer (memory/optimizer_updaters.hpp makes them).
  RankState(const ModelConfig& model, const ParamLayout& layout, const ProcessGrid& grid, int zero,
            Precision precision, std::unique_ptr<ParameterStore> store, std::unique_ptr<GradientReducer> reducer,
            std::map<int, std::unique_ptr<LayerOptimizer>> optimizers, DevicePools& pools, StageStreams& streams);

  const ParamLayout& layout() const { return layout_; }
  const ModelConfig& model() const { return model_; }
  bool bf16() const { return bf16_; }  // parameters stored as bf16
  ParameterStore& store() { return *store_; }
  GradientReducer& reducer() { return *reducer_; }
  StageStreams& streams() { return streams_; }
  LayerOptimizer& optimizer(int layer) { return *optimizers_.at(layer); }
  const std::map<int, std::unique_ptr<LayerOptimizer>>& optimizers() const { return optimizers_; }

  // GPT-2 initial values (counter-based, identical for every layout).
  void init(std::uint64_t seed);
  // Whole-layer values in and out (this rank's tensor-parallel shapes; the layer whole on
  // this rank: ZeRO < 3 for parameters, < 2 for gradients).
  void set_params(int layer, const std::vector<float>& values);
  std::vector<float> params_host(int layer) const;
  std::vector<float> grads_host(int layer) const { return reducer_->full_host(layer); }

  // What the compute reads of a layer's parameters (held, where they are not resident). A
  // bf16 layer's norm gains and biases are widened into `vectors` first, on the compute
  // instance (workspace: activation_sizes().param_vectors).
  EmbeddingWeights<Exec> embedding_weights() const { return bind_embedding_weights<Exec>(layout_, store_->params(0)); }
  BlockWeights<Exec> block_weights(std::int64_t b, const Vec<Exec>& vectors) const {
    return bind_block_weights<Exec>(layout_, b, widened(layout_.block_layer(b), vectors));
  }
  FinalWeights<Exec> final_weights(const Vec<Exec>& vectors) const {
    return bind_final_norm_weights<Exec>(layout_, widened(layout_.final_layer(), vectors));
  }
  EmbeddingTensors<Exec> embedding_grads() const { return bind_embedding<Exec>(layout_, reducer_->grads(0)); }
  BlockTensors<Exec> block_grads(std::int64_t b) const {
    return bind_block<Exec>(layout_, b, reducer_->grads(layout_.block_layer(b)));
  }
  FinalNormTensors<Exec> final_grads() const {
    return bind_final_norm<Exec>(layout_, reducer_->grads(layout_.final_layer()));
  }

  // ModelStateAccess (checkpoints).
  bool holds(int layer) const override { return store_->holds(layer); }
  bool writes(int layer) const override;
  std::int64_t padded(int layer) const override { return store_->shard(layer).padded; }
  const float* assemble(int layer, CheckpointPart part, std::vector<float>& out) override;
  void scatter(int layer, CheckpointPart part, const std::vector<float>& full) override;

 private:
  LayerParams widened(int layer, const Vec<Exec>& vectors) const;

  ModelConfig model_;
  const ParamLayout& layout_;
  const ProcessGrid& grid_;
  int zero_;
  bool bf16_;
  std::unique_ptr<ParameterStore> store_;
  std::unique_ptr<GradientReducer> reducer_;
  std::map<int, std::unique_ptr<LayerOptimizer>> optimizers_;
  DevicePools& pools_;
  StageStreams& streams_;
};

}  // namespace lamina
