#include "lamina/train/verify.hpp"

#include <algorithm>
#include <cmath>

#include "lamina/io/reference_file.hpp"
#include "lamina/train/runtime.hpp"

namespace lamina {

namespace {

double rel_error(const float* got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (std::size_t i = 0; i < want.size(); ++i) {
    const double d = static_cast<double>(got[i]) - want[i];
    num += d * d;
    den += want[i] * want[i];
  }
  return den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The run a reference file describes: one micro-batch of its batch, torch's AdamW.
Deck reference_deck(const ReferenceFile& ref) {
  Deck d;
  d.source = ref.path;
  d.model = ref.model;
  d.data.format = DataFormat::synthetic;
  d.data.batch_size = ref.batch;
  d.data.micro_batch_size = ref.batch;
  d.train.steps = 1;
  d.optimizer.lr = ref.lr;
  d.optimizer.beta1 = ref.beta1;
  d.optimizer.beta2 = ref.beta2;
  d.optimizer.eps = ref.eps;
  d.optimizer.weight_decay = ref.weight_decay;
  d.optimizer.decay_biases_and_norms = true;  // torch.optim.AdamW with one parameter group
  d.optimizer.grad_clip = 0.0;
  d.memory.defaults(ref.model.layers);
  return d;
}

}  // namespace

double VerifyReport::max_rel_error() const {
  double m = 0.0;
  for (const auto& i : items) m = std::max(m, std::isnan(i.rel_error) ? INFINITY : i.rel_error);
  return m;
}

VerifyReport verify_reference(const std::string& path) {
  ReferenceFile ref = read_reference_header(path);
  const Deck deck = reference_deck(ref);
  MemoryTracker tracker;
  Runtime rt(tracker, deck, MPI_COMM_SELF);
  ModelState& state = rt.state();
  const ParamLayout& layout = state.layout();
  std::vector<std::pair<std::string, std::vector<std::int64_t>>> expected;
  for (const auto& l : layout.layers())
    for (const auto& t : l.tensors) expected.emplace_back(t.name, t.shape);
  read_reference_tensors(ref, expected);

  for (int i = 0; i < layout.num_layers(); ++i) {
    std::vector<float> host(static_cast<std::size_t>(layout.layers()[i].numel));
    for (const auto& t : layout.layers()[i].tensors) {
      const auto& w = ref.tensors.at(t.name).weight;
      std::copy(w.begin(), w.end(), host.begin() + t.offset);
    }
    state.set_params(i, host);
  }

  const std::int64_t positions = ref.batch * ref.model.seq_len;
  const MicroBatchLoader load = [&](int, std::int32_t* inputs, std::int32_t* targets) {
    std::copy(ref.x.begin(), ref.x.end(), inputs);
    std::copy(ref.y.begin(), ref.y.end(), targets);
  };
  VerifyReport report;
  report.path = path;
  report.loss = rt.forward_backward(load, positions).loss;
  report.reference_loss = ref.loss;
  report.items.push_back({"loss", std::fabs(report.loss - ref.loss) / std::fabs(ref.loss)});
  for (int i = 0; i < layout.num_layers(); ++i) {
    const auto g = state.grads_host(i);
    for (const auto& t : layout.layers()[i].tensors) {
      report.items.push_back({"grad/" + t.name, rel_error(g.data() + t.offset, ref.tensors.at(t.name).grad)});
    }
  }
  state.set_optimizer_t(ref.adam_step - 1);
  rt.optimizer_step(ref.lr, 1.0);
  for (int i = 0; i < layout.num_layers(); ++i) {
    const auto p = state.params_host(i);
    for (const auto& t : layout.layers()[i].tensors) {
      report.items.push_back({"updated/" + t.name, rel_error(p.data() + t.offset, ref.tensors.at(t.name).updated)});
    }
  }
  return report;
}

}  // namespace lamina
