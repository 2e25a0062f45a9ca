#include "lamina/train/memory_estimate.hpp"

#include <Kokkos_Core.hpp>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/memory_tracker.hpp"
#include "lamina/model/gpt_activations.hpp"
#include "lamina/model/param_layout.hpp"

namespace lamina {

std::int64_t MemoryEstimate::total(const std::string& space) const {
  std::int64_t t = 0;
  const auto it = bytes.find(space);
  if (it != bytes.end())
    for (const auto& kv : it->second) t += kv.second;
  return t;
}

MemoryEstimate estimate_memory(const Deck& deck) {
  const std::string space = Kokkos::DefaultExecutionSpace::memory_space::name();
  const std::int64_t params = ParamLayout::gpt2(deck.model).total_numel();
  const ActivationSizes a = activation_sizes(Dims::of(deck.model, deck.data.micro_batch_size));
  MemoryEstimate e;
  auto& m = e.bytes[space];
  m[mem_category_name(MemCategory::parameters)] = 4 * params;
  m[mem_category_name(MemCategory::gradients)] = 4 * params;
  m[mem_category_name(MemCategory::optimizer_state)] = 8 * params;
  std::int64_t acts = a.embed + deck.model.layers * a.block + a.head;
  std::int64_t ws = a.workspace + a.ones + a.tokens;
  if (deck.output.sample_tokens > 0) {  // a one-sequence replica for the text sample at the end
    const ActivationSizes s = activation_sizes(Dims::of(deck.model, 1));
    acts += s.embed + deck.model.layers * s.block + s.head;
    ws += s.workspace + s.ones + s.tokens;
  }
  m[mem_category_name(MemCategory::activations)] = 4 * acts;
  m[mem_category_name(MemCategory::workspace)] = 4 * ws;
  return e;
}

void check_memory_budget(const Deck& deck, const MemoryEstimate& estimate) {
  const std::string device = Kokkos::DefaultExecutionSpace::memory_space::name();
  const std::string host = Kokkos::HostSpace::name();
  auto check = [&](const std::string& space, std::int64_t budget, const char* key) {
    if (budget <= 0) return;
    const std::int64_t need = estimate.total(space);
    if (need <= budget) return;
    std::string parts;
    for (const auto& kv : estimate.bytes.at(space)) {
      parts += strprintf("\n    %-16s %s", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
    }
    throw InputError(strprintf(
        "%s: memory.%s = %s, but the run needs %s in %s (%s over):%s\n"
        "  activations and workspace scale with data.micro_batch_size (gradient accumulation keeps the global "
        "batch); parameters, gradients and optimizer state with the model size",
        deck.source.c_str(), key, human_bytes(static_cast<double>(budget)).c_str(),
        human_bytes(static_cast<double>(need)).c_str(), space.c_str(),
        human_bytes(static_cast<double>(need - budget)).c_str(), parts.c_str()));
  };
  check(device, deck.memory.device_budget, "device_budget");
  check(host, deck.memory.host_budget, "host_budget");
}

std::string format_memory_estimate(const MemoryEstimate& estimate) {
  std::string out;
  for (const auto& [space, cats] : estimate.bytes) {
    out += strprintf("memory estimate, %s: %s\n", space.c_str(), human_bytes(static_cast<double>(estimate.total(space))).c_str());
    for (const auto& kv : cats) {
      out += strprintf("  %-16s %12s\n", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
    }
  }
  return out;
}

}  // namespace lamina
