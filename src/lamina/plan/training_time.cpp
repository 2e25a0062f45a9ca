#include "lamina/plan/training_time.hpp"

#include <algorithm>
#include <cmath>

#include "lamina/model/flops.hpp"

namespace lamina {

namespace {
// Kaplan et al. 2020: table 1 (L(N, D)) and section 5.1 (critical batch).
constexpr double kNc = 8.8e13, kDc = 5.4e13, kAlphaN = 0.076, kAlphaD = 0.095;
constexpr double kBStar = 2e8, kAlphaB = 0.21;
}  // namespace

const char* family_name(Family f) {
  switch (f) {
    case Family::any: return "any";
    case Family::standard: return "standard";
    case Family::layered_modular: return "layered_modular";
  }
  return "?";
}

double expected_loss(double n, double d) {
  return std::pow(std::pow(kNc / n, kAlphaN / kAlphaD) + kDc / d, kAlphaD);
}

double critical_batch_tokens(double loss) { return kBStar / std::pow(loss, 1.0 / kAlphaB); }

std::int64_t devices_fed(std::int64_t sequences, int tp, Family family) {
  const std::int64_t per_stage = family == Family::standard ? 4 : 1;
  return std::max<std::int64_t>(1, sequences / per_stage) * tp;
}

bool trains_faster(const SweepRow& row, const SweepRow& shortest) {
  return row.days < shortest.days * (1.0 - 1e-9);
}

ShortestTime shortest_time(const Deck& deck, const MachineSpec& machine, double tokens, int max_ranks,
                           bool deck_batch, const PlannerOptions& base,
                           const std::function<void(const SweepRow&, double seconds)>& progress) {
  const ModelConfig& m = deck.model;
  ShortestTime r;
  const double non_embedding = 12.0 * static_cast<double>(m.layers) * static_cast<double>(m.d_model) *
                               static_cast<double>(m.d_model);
  r.loss = expected_loss(non_embedding, tokens);
  r.critical_batch_tokens = critical_batch_tokens(r.loss);
  r.batch_sequences = deck_batch ? deck.data.batch_size
                                 : std::max<std::int64_t>(1, static_cast<std::int64_t>(r.critical_batch_tokens) / m.seq_len);
  std::vector<int> sizes;
  for (int n = 1; n < max_ranks; n *= 2) sizes.push_back(n);
  sizes.push_back(max_ranks);
  const double flops_per_token = training_flops_per_token(m);
  for (const Family family : {Family::standard, Family::layered_modular}) {
    for (const int n : sizes) {
      PlannerOptions o = base;
      o.ranks = n;
      o.top = 1;
      o.family = family;
      o.batch_cap = r.batch_sequences;
      o.check_races = false;
      const PlanResult p = plan_search(deck, machine, o);
      SweepRow row;
      row.ranks = n;
      row.family = family;
      row.feasible = p.feasible;
      if (p.feasible) {
        row.best = p.best.front();
        const ParallelLayout& l = row.best.plan.layout;
        row.batch_sequences = static_cast<std::int64_t>(l.dp) * l.micro_batch_size * l.micro_batches;
        row.tokens_per_s = static_cast<double>(row.batch_sequences * m.seq_len) / row.best.step_s;
        row.mfu = row.tokens_per_s * flops_per_token / (n * machine.peak_flops(deck.train.precision == Precision::bf16));
        row.days = tokens / row.tokens_per_s / 86400.0;
      }
      if (family == Family::layered_modular) {  // a superset of the standard plans
        for (const SweepRow& s : r.rows) {
          if (s.family == Family::standard && s.ranks == n && s.feasible && (!row.feasible || s.days < row.days)) {
            row = s;
            row.family = family;
          }
        }
      }
      r.rows.push_back(row);
      if (progress) progress(row, p.solve_s);
      int& shortest = family == Family::standard ? r.shortest_standard : r.shortest_layered;
      const int i = static_cast<int>(r.rows.size()) - 1;
      if (row.feasible && (shortest < 0 || trains_faster(row, r.rows[static_cast<std::size_t>(shortest)])))
        shortest = i;
    }
  }
  return r;
}

}  // namespace lamina
