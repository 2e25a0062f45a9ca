#include "lamina/train/verify.hpp"

#include <algorithm>
#include <cmath>

#include "lamina/io/reference_file.hpp"
#include "lamina/train/engine.hpp"

namespace lamina {

namespace {

using Exec = Kokkos::DefaultExecutionSpace;

double rel_error(const float* got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

}  // namespace

double VerifyReport::max_rel_error() const {
  double m = 0.0;
  for (const auto& i : items) m = std::max(m, std::isnan(i.rel_error) ? INFINITY : i.rel_error);
  return m;
}

VerifyReport verify_reference(const std::string& path) {
  ReferenceFile ref = read_reference_header(path);
  OptimizerConfig opt;
  opt.lr = ref.lr;
  opt.beta1 = ref.beta1;
  opt.beta2 = ref.beta2;
  opt.eps = ref.eps;
  opt.weight_decay = ref.weight_decay;
  opt.decay_biases_and_norms = true;  // torch.optim.AdamW with one parameter group
  opt.grad_clip = 0.0;

  MemoryTracker tracker;
  Engine<Exec> engine(tracker, ref.model, opt, ref.batch);
  const ParamLayout& layout = engine.layout();
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected;
  for (const auto& l : layout.layers())
    for (const auto& t : l.tensors) expected.emplace_back(t.name, t.shape);
  read_reference_tensors(ref, expected);

  auto stage = [&](const FlatStore<Exec>& store, int layer) { return Kokkos::create_mirror_view(store.layer(layer)); };
  for (int i = 0; i < layout.num_layers(); ++i) {
    auto host = stage(engine.params(), i);
    for (const auto& t : layout.layers()[i].tensors) {
      const auto& w = ref.tensors.at(t.name).weight;
      std::copy(w.begin(), w.end(), host.data() + t.offset);
    }
    Kokkos::deep_copy(engine.params().layer(i), host);
  }

  const std::int64_t positions = ref.batch * ref.model.seq_len;
  engine.load_tokens(ref.x.data(), ref.y.data());
  engine.zero_grads();
  VerifyReport report;
  report.path = path;
  report.loss = engine.forward_backward(static_cast<float>(1.0 / static_cast<double>(positions))) /
                static_cast<double>(positions);
  report.reference_loss = ref.loss;
  report.items.push_back({"loss", std::fabs(report.loss - ref.loss) / std::fabs(ref.loss)});
  engine.optimizer().set_t(ref.adam_step - 1);
  for (int i = 0; i < layout.num_layers(); ++i) {
    auto g = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), engine.grads().layer(i));
    for (const auto& t : layout.layers()[i].tensors) {
      report.items.push_back({"grad/" + t.name, rel_error(g.data() + t.offset, ref.tensors.at(t.name).grad)});
    }
  }
  engine.optimizer_step(ref.lr, 1.0);
  for (int i = 0; i < layout.num_layers(); ++i) {
    auto p = Kokkos::create_mirror_view_and_copy(Kokkos::HostSpace(), engine.params().layer(i));
    for (const auto& t : layout.layers()[i].tensors) {
      report.items.push_back({"updated/" + t.name, rel_error(p.data() + t.offset, ref.tensors.at(t.name).updated)});
    }
  }
  return report;
}

}  // namespace lamina
