#include "lamina/train/generate.hpp"

#include <algorithm>
#include <cmath>

#include "lamina/core/random.hpp"
#include "lamina/model/gpt.hpp"

namespace lamina {

std::vector<std::int32_t> generate_tokens(RankState& state, MemoryTracker& tracker,
                                          std::vector<std::int32_t> prompt, std::int64_t count, double temperature,
                                          std::uint64_t seed) {
  using Exec = RankState::Exec;
  const ModelConfig& model = state.model();
  const std::int64_t T = model.seq_len, V = model.vocab_size;
  // fp32 activations; the parameters as stored (bf16 ones read through the workspace).
  Dims dims = Dims::of(model, 1);
  dims.bf16 = state.bf16();
  LayerRangeActs<Exec> acts(tracker, dims, 0, model.layers, true, true,
                            std::vector<ActivationPolicy>(static_cast<std::size_t>(model.layers),
                                                          ActivationPolicy::keep));
  WorkspaceBuffers<Exec> ws(tracker, dims);
  const ShardCombine whole;
  auto inputs = Kokkos::create_mirror_view(acts.inputs);
  const Exec exec;
  std::vector<double> p(static_cast<std::size_t>(V));
  std::vector<std::int32_t> out;
  if (prompt.empty()) prompt.push_back(0);
  for (std::int64_t n = 0; n < count; ++n) {
    // The last T tokens; causal attention makes the zero padding after them irrelevant.
    const std::int64_t len = std::min<std::int64_t>(T, static_cast<std::int64_t>(prompt.size()));
    for (std::int64_t t = 0; t < T; ++t) inputs(t) = t < len ? prompt[prompt.size() - len + t] : 0;
    Kokkos::deep_copy(exec, acts.inputs, inputs);
    Kokkos::deep_copy(exec, acts.targets, 0);
    // Parameters as training uses them: gathered (or widened from bf16) per layer.
    const int last = state.layout().final_layer();
    state.store().hold(0).wait();
    embed_forward(exec, state.embedding_weights(), acts.input.f32, acts.inputs, dims, whole);
    for (std::int64_t b = 0; b < model.layers; ++b) {
      const int l = state.layout().block_layer(b);
      state.store().hold(l).wait();
      block_forward(exec, state.block_weights(b, ws.ws.vectors),
                    acts.block(acts.kept_inner(b), acts.block_output(b).f32), acts.block_input(b).f32, dims.NH,
                    ws.ws, whole);
      exec.fence();  // the gathered copy is read before it goes back
      state.store().release(l);
    }
    state.store().hold(last).wait();
    head_forward(exec, state.embedding_weights(), state.final_weights(ws.ws.vectors), acts.head, acts.output().f32,
                 acts.targets, dims, ws.ws, whole);
    exec.fence();
    state.store().release(last);
    state.store().release(0);
    auto row = Kokkos::subview(acts.head.logits, len - 1, Kokkos::ALL);
    auto logits = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), row);
    double mx = -INFINITY, z = 0.0;
    for (std::int64_t v = 0; v < V; ++v) mx = std::max(mx, static_cast<double>(logits(v)));
    for (std::int64_t v = 0; v < V; ++v) z += p[v] = std::exp((logits(v) - mx) / temperature);
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
