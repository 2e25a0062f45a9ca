#include "lamina/train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <utility>

#include "lamina/core/random.hpp"
#include "lamina/kernels/gemm.hpp"
#include "lamina/model/gpt.hpp"

namespace lamina {

namespace {

// One sequence through the whole model with activations of its own, so the training
// buffers stay as they were, computed as training computes them: the residual stream
// stored as the run stores it (bf16 in bf16 runs), the run's products, the parameters as
// stored (bf16 ones read through the workspace).
class OneSequence {
 public:
  using Exec = RankState::Exec;
  OneSequence(RankState& state, MemoryTracker& tracker)
      : state_(state),
        dims_(dims_of(state)),
        acts_(tracker, dims_, 0, state.model().layers, true, true,
              std::vector<ActivationPolicy>(static_cast<std::size_t>(state.model().layers), ActivationPolicy::recompute),
              state.bf16()),
        ws_(tracker, dims_) {
    const std::int64_t n = activation_sizes(dims_).inner;
    if (dims_.bf16) {
      inner16_ = Buffer<std::uint16_t, Exec::memory_space>(tracker, MemCategory::activations, "lamina::sample_inner", n);
    } else {
      inner_ = Buffer<float, Exec::memory_space>(tracker, MemCategory::activations, "lamina::sample_inner", n);
    }
  }

  // Logits (T x V, row-major) of the first T tokens (fewer: zero padding after them, which
  // causal attention keeps from the positions before).
  Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> forward(const std::int32_t* tokens, std::int64_t len) {
    const ModelConfig& model = state_.model();
    const std::int64_t T = model.seq_len;
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(T), 0), targets(inputs.size(), 0);
    std::copy_n(tokens, std::min(len, T), inputs.begin());
    const Exec exec;
    acts_.set_tokens(exec, inputs.data(), targets.data());
    // Parameters as training uses them: gathered (or widened from bf16) per layer.
    const int last = state_.layout().final_layer();
    const ShardCombine whole;
    const Workspace<Exec>& ws = ws_.ws;
    state_.store().hold(0).wait();
    range_embed_forward(exec, state_.embedding_weights(), acts_, ws, whole);
    for (std::int64_t b = 0; b < model.layers; ++b) {
      const int l = state_.layout().block_layer(b);
      state_.store().hold(l).wait();
      range_block_forward(exec, state_.block_weights(b, ws.vectors), acts_, b, {inner_.data(), inner16_.data()}, true,
                          ws, whole);
      exec.fence();  // the gathered copy is read before it goes back
      state_.store().release(l);
    }
    state_.store().hold(last).wait();
    range_head_forward(exec, state_.embedding_weights(), state_.final_weights(ws.vectors), acts_, ws, whole,
                       std::nullopt);  // the logits, not their gradient
    exec.fence();
    state_.store().release(last);
    state_.store().release(0);
    Kokkos::View<float**, Kokkos::LayoutRight, Kokkos::HostSpace> out("logits", T, model.vocab_size);
    Kokkos::deep_copy(exec, out, acts_.head.logits);
    exec.fence();
    return out;
  }

 private:
  // The run's storage and the run's products: bf16 parameters go to the bf16 engine where
  // training sends them there (never to a host BLAS that cannot read device memory).
  static Dims dims_of(const RankState& state) {
    Dims d = Dims::of(state.model(), 1);
    d.loss_chunk = 0;  // sampling reads the logits of every row
    d.bf16 = state.bf16();
    d.products = product_math<Exec>(state.bf16() ? Precision::bf16 : Precision::fp32);
    return d;
  }
  RankState& state_;
  Dims dims_;
  LayerRangeActs<Exec> acts_;
  WorkspaceBuffers<Exec> ws_;
  // a block's inner activations, dropped once it has run (bf16 runs: inner16_)
  Buffer<float, Exec::memory_space> inner_;
  Buffer<std::uint16_t, Exec::memory_space> inner16_;
};

}  // namespace

std::vector<float> sequence_logits(RankState& state, MemoryTracker& tracker, const std::vector<std::int32_t>& tokens) {
  OneSequence one(state, tracker);
  const auto logits = one.forward(tokens.data(), static_cast<std::int64_t>(tokens.size()));
  const std::int64_t rows = std::min<std::int64_t>(static_cast<std::int64_t>(tokens.size()), state.model().seq_len);
  return std::vector<float>(logits.data(), logits.data() + rows * state.model().vocab_size);
}

std::vector<std::int32_t> generate_tokens(RankState& state, MemoryTracker& tracker,
                                          std::vector<std::int32_t> prompt, std::int64_t count, double temperature,
                                          std::uint64_t seed) {
  const std::int64_t T = state.model().seq_len, V = state.model().vocab_size;
  OneSequence one(state, tracker);
  std::vector<double> p(static_cast<std::size_t>(V));
  std::vector<std::int32_t> out;
  if (prompt.empty()) prompt.push_back(0);
  for (std::int64_t n = 0; n < count; ++n) {
    // The last T tokens.
    const std::int64_t len = std::min<std::int64_t>(T, static_cast<std::int64_t>(prompt.size()));
    const auto logits = one.forward(prompt.data() + prompt.size() - len, len);
    double mx = -INFINITY, z = 0.0;
    for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits(len - 1, v)));
    for (std::int64_t v = 0; v < V; ++v) z += p[v] = std::exp((logits(len - 1, v) - mx) / temperature);
    double u = uniform01(seed, static_cast<std::uint64_t>(n)) * z;
    std::int32_t pick = static_cast<std::int32_t>(V - 1);
    for (std::int64_t v = 0; v < V; ++v) {
      if ((u -= p[v]) <= 0.0) {
        pick = static_cast<std::int32_t>(v);
        break;
      }
    }
    prompt.push_back(pick);
    out.push_back(pick);
  }
  return out;
}

std::string bytes_to_text(const std::vector<std::int32_t>& tokens) {
  std::string s;
  for (const auto t : tokens) s += (t == '\n' || (t >= 32 && t < 127)) ? static_cast<char>(t) : '?';
  return s;
}

}  // namespace lamina
