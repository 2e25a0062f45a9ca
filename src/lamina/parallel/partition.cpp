#include "lamina/parallel/partition.hpp"

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"

namespace lamina {

Partition Partition::make(std::int64_t layers, int stages, int chunks, bool round_robin) {
  if (chunks < stages || chunks % stages != 0 || layers % chunks != 0) {
    throw InputError(strprintf("model.layers = %lld cannot be cut into %d pipeline chunks over parallel.pp = %d "
                               "stages: the chunks must divide the layers and be a multiple of the stages",
                               static_cast<long long>(layers), chunks, stages));
  }
  Partition p;
  p.stages_ = stages;
  const std::int64_t per = layers / chunks;
  for (int c = 0; c < chunks; ++c) {
    Chunk k;
    k.index = c;
    k.stage = round_robin ? c % stages : c / (chunks / stages);
    k.first_block = c * per;
    k.last_block = (c + 1) * per;
    k.embedding = c == 0;
    k.head = c == chunks - 1;
    p.chunks_.push_back(k);
  }
  return p;
}

std::vector<int> Partition::chunks_of(int stage) const {
  std::vector<int> out;
  for (const auto& c : chunks_)
    if (c.stage == stage) out.push_back(c.index);
  return out;
}

std::string Partition::describe() const {
  std::string out;
  for (int s = 0; s < stages_; ++s) {
    out += strprintf("%sstage %d:", s ? "; " : "", s);
    for (int c : chunks_of(s)) {
      const Chunk& k = chunks_[static_cast<std::size_t>(c)];
      out += strprintf(" %sh.%lld-%lld%s", k.embedding ? "embedding+" : "", static_cast<long long>(k.first_block),
                       static_cast<long long>(k.last_block - 1), k.head ? "+head" : "");
    }
  }
  return out;
}

}  // namespace lamina
