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

// The run a reference file describes: one micro-batch of its batch on one rank, torch's
// AdamW (one parameter group: every tensor decays), no clipping.
Plan reference_plan(const ReferenceFile& ref) {
  Plan p;
  p.layout.micro_batch_size = ref.batch;
  p.blocks.assign(static_cast<std::size_t>(ref.model.layers), LayerPolicy{});
  return p;
}

OptimizerConfig reference_optimizer(const ReferenceFile& ref) {
  OptimizerConfig o;
  o.lr = ref.lr;
  o.beta1 = ref.beta1;
  o.beta2 = ref.beta2;
  o.eps = ref.eps;
  o.weight_decay = ref.weight_decay;
  o.decay_biases_and_norms = true;
  o.grad_clip = 0.0;
  return o;
}

}  // namespace

double VerifyReport::max_rel_error() const {
  double m = 0.0;
  for (const auto& i : items) m = std::max(m, std::isnan(i.rel_error) ? INFINITY : i.rel_error);
  return m;
}

VerifyReport verify_reference(const std::string& path, std::optional<AttentionProducts> attention) {
  ReferenceFile ref = read_reference_header(path);
  ref.model.attention = attention;
  MemoryTracker tracker;
  Runtime rt(tracker, ref.model, reference_optimizer(ref), reference_plan(ref), RunExtras{}, MPI_COMM_SELF);
  RankState& state = rt.state();
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
  rt.set_optimizer_t(ref.adam_step - 1);
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
