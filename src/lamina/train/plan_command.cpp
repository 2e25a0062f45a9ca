#include "lamina/train/plan_command.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <thread>

#include "lamina/comm/mpi_communicator.hpp"
#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/json.hpp"
#include "lamina/kernels/host_blas.hpp"
#include "lamina/model/flops.hpp"
#include "lamina/plan/training_time.hpp"
#include "lamina/train/profile.hpp"

namespace lamina {

namespace {

int world_size(MPI_Comm comm) {
  int n = 1;
  MPI_Comm_size(comm, &n);
  return n;
}

// The keys the planner chooses: unset or "auto" (plan command), only "auto" (train).
std::vector<std::string> free_keys(const Deck& deck, bool unset_too) {
  std::vector<std::string> out;
  for (const std::string& k : planner_keys()) {
    if (deck.automatic.count(k) || (unset_too && !deck.sets(k))) out.push_back(k);
  }
  return out;
}

int ranks_for(const Deck& deck, const std::vector<std::string>& free, int requested, MPI_Comm comm) {
  if (requested > 0) return requested;
  const bool fixed = std::none_of(free.begin(), free.end(), [](const std::string& k) {
    return k == "parallel.dp" || k == "parallel.cp" || k == "parallel.tp" || k == "parallel.pp";
  });
  if (fixed) return static_cast<int>(deck.parallel.dp * deck.parallel.cp * deck.parallel.tp * deck.parallel.pp);
  return world_size(comm);
}

// This machine, measured on every rank of `comm` at once, with the model's own times at the
// micro-batch sizes the search may pick (small ones; larger ones follow the calibrated
// roofline), the slowest rank's.
MachineSpec measure_for(const Deck& deck, const std::vector<std::string>& free, std::vector<MeasuredCosts>& measured,
                        const Log& log, MPI_Comm comm) {
  MachineSpec m = measure_machine(comm, log, deck.comm.backend);
  std::vector<std::int64_t> sizes;
  if (std::find(free.begin(), free.end(), "data.micro_batch_size") != free.end()) {
    for (std::int64_t b = 1; b <= std::min<std::int64_t>(deck.data.batch_size, 8); b *= 2) sizes.push_back(b);
  } else {
    sizes.push_back(deck.data.micro_batch_size);
  }
  measured = profile_model(deck.model, deck.train.precision, sizes);
  const std::size_t whole = measured.size() - 1;  // the largest micro-batch on one rank's whole block
  // The tensor- and context-parallel degrees (and sequence parallelism) the search may pick,
  // each timed with its groups' collectives on all the ranks at once. The slowest rank's median
  // of six timed runs: of two (the default), a rank that the others' collectives held once
  // set the time, and on 2 and 4 ranks of 2 cores the predicted cp 2 steps ran 5-67 % over
  // the measured ones from one planning run to the next; of six, within 4 %.
  constexpr int kShardedReps = 7;
  const int ranks = world_size(comm);
  auto is_free = [&free](const char* key) { return std::find(free.begin(), free.end(), key) != free.end(); };
  const bool tp_free = is_free("parallel.tp"), sp_free = is_free("parallel.sequence_parallel");
  const bool cp_free = is_free("parallel.cp");
  const ModelConfig& model = deck.model;
  for (int cp = 1; cp <= ranks; ++cp) {
    if (ranks % cp != 0 || (cp_free ? !searched_context_parallel(model, cp) : cp != deck.parallel.cp)) continue;
    for (int tp = 1; tp * cp <= ranks; ++tp) {
      if (tp * cp == 1 || ranks % (tp * cp) != 0 || (!tp_free && tp != deck.parallel.tp) || !model.splits_over(tp)) {
        continue;
      }
      for (const bool sp : {false, true}) {
        if ((!sp_free && sp != deck.parallel.sequence_parallel) || (sp && tp == 1)) continue;
        std::vector<std::int64_t> split;  // micro-batch sizes whose rows on a rank split over tp
        for (const std::int64_t b : sizes) {
          if (!sp || b * model.seq_len / cp % tp == 0) split.push_back(b);
        }
        if (split.empty()) continue;
        for (const MeasuredCosts& c :
             profile_sharded(model, deck.train.precision, split, tp, sp, cp, comm, deck.comm.backend, kShardedReps)) {
          measured.push_back(c);
        }
      }
    }
  }
  for (MeasuredCosts& c : measured) {
    double t[] = {c.block_forward, c.block_backward, c.embed_forward, c.embed_backward, c.head_forward, c.head_backward};
    MPI_Request r = MPI_REQUEST_NULL;
    MPI_Iallreduce(MPI_IN_PLACE, t, 6, MPI_DOUBLE, MPI_MAX, comm, &r);
    wait_bounded(r, "MPI_Iallreduce of the measured layer times");
    c.block_forward = t[0];
    c.block_backward = t[1];
    c.embed_forward = t[2];
    c.embed_backward = t[3];
    c.head_forward = t[4];
    c.head_backward = t[5];
  }
  calibrate(m, deck.model, deck.train.precision, measured[whole]);
  log.info(strprintf("measured %s: one block forward + backward at micro-batch %lld takes %.2f ms; kernels reach "
                     "%.0f%% of the GEMM and memory rates",
                     deck.source.c_str(), static_cast<long long>(measured[whole].micro_batch_size),
                     1e3 * (measured[whole].block_forward + measured[whole].block_backward),
                     100.0 * m.gemm_efficiency));
  for (const MeasuredCosts& c : measured) {
    if (c.tp == 1 && c.cp == 1) continue;
    log.info(strprintf("measured at tp %d%s%s, micro-batch %lld: one block forward + backward %.2f ms (collectives "
                       "included)",
                       c.tp, c.sequence_parallel ? " with sequence parallelism" : "",
                       c.cp > 1 ? strprintf(" and cp %d", c.cp).c_str() : "",
                       static_cast<long long>(c.micro_batch_size), 1e3 * (c.block_forward + c.block_backward)));
  }
  return m;
}

// This process and ranks it started (MPI_Comm_spawn), joined in one communicator.
struct MeasuringRanks {
  MPI_Comm inter = MPI_COMM_NULL, all = MPI_COMM_NULL;
  // Frees the joined communicator and disconnects from the others, so that each side ends on its own.
  void close() {
    MPI_Comm_free(&all);
    MPI_Comm_disconnect(&inter);
  }
};

MPI_Comm joined(MPI_Comm inter, bool started) {
  const BlockingSection section("the ranks started for the measurement to join it");
  MPI_Comm all = MPI_COMM_NULL;
  MPI_Intercomm_merge(inter, started ? 1 : 0, &all);
  std::string ignored;
  configure_host_blas(ignored, ranks_on_node(all));  // each rank's share of the cores, as under mpirun
  return all;
}

// Planning n ranks of this machine from one process: the ranks that would share it are
// started beside this one and the machine and the model are measured with all of them
// running at once, as under `mpirun -np n` (one process alone would measure every core as
// its own). Where they cannot be started (or are far more than the cores), says so and
// measures this process alone.
MachineSpec measure_with_ranks(const PlanCommand& cmd, const Deck& deck, PlannerOptions& options, const Log& log) {
  const int n = options.ranks;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  char exe[4096];
  const ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
  std::string why;
  if (n > 8 * cores) why = strprintf("%d ranks are more than 8 per core of this machine", n);
  if (len <= 0) why = "this process cannot find its own executable";
  MeasuringRanks m;
  if (why.empty()) {
    exe[len] = '\0';
    std::vector<std::string> args = {"-q", "plan", cmd.deck, "--ranks", std::to_string(n)};
    for (const auto& s : cmd.sets) args.insert(args.end(), {"--set", s});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<int> errors(static_cast<std::size_t>(n - 1), MPI_SUCCESS);
    MPI_Comm_set_errhandler(MPI_COMM_SELF, MPI_ERRORS_RETURN);
    const BlockingSection section("the ranks started for the measurement");
    const int rc = MPI_Comm_spawn(exe, argv.data(), n - 1, MPI_INFO_NULL, 0, MPI_COMM_SELF, &m.inter, errors.data());
    if (rc != MPI_SUCCESS) why = "MPI could not start them (MPI_Comm_spawn failed)";
  }
  if (!why.empty()) {
    log.warn(strprintf("planning %d ranks of this machine measured by one process, as if each rank had all of it: %s; "
                       "run `lamina plan` under `mpirun -np %d` instead, or pass --machine",
                       n, why.c_str(), n));
    return measure_for(deck, options.free_keys, options.measured, log, MPI_COMM_SELF);
  }
  log.info(strprintf("measuring this machine with the %d ranks the plan is for running at once (%d started beside this one)",
                     n, n - 1));
  m.all = joined(m.inter, false);
  const MachineSpec machine = measure_for(deck, options.free_keys, options.measured, log, m.all);
  m.close();
  std::string ignored;
  configure_host_blas(ignored, 1);
  return machine;
}

// "blocks 0-11: recompute/device/host, blocks 12-95: keep/device/device"
std::string policies(const Plan& p) {
  std::string out;
  const auto& b = p.blocks;
  for (std::size_t i = 0; i < b.size();) {
    std::size_t j = i;
    while (j < b.size() && b[j].activations == b[i].activations && b[j].params == b[i].params &&
           b[j].optimizer == b[i].optimizer)
      ++j;
    out += strprintf("%sblocks %zu-%zu: activations %s, params %s, optimizer %s", out.empty() ? "" : "; ", i, j - 1,
                     activation_policy_name(b[i].activations), mem_tier_name(b[i].params),
                     optimizer_placement_name(b[i].optimizer));
    i = j;
  }
  return out;
}

std::string layout_name(const ParallelLayout& o) {
  std::string s = strprintf("dp %d x %stp %d%s x pp %d, ZeRO %d, %s", o.dp,
                            o.cp > 1 ? strprintf("cp %d x ", o.cp).c_str() : "", o.tp,
                            o.sequence_parallel ? " (sequence parallel)" : "", o.pp, o.zero,
                            schedule_kind_name(o.schedule));
  if (o.schedule == ScheduleKind::interleaved) s += strprintf(" v%d", o.virtual_stages);
  if (o.layered) s += " layered";
  return s;
}

struct Figures {
  double tokens_per_s = 0.0, flops = 0.0, mfu = 0.0;
  std::map<std::string, double> traffic;
};

Figures figures(const Deck& deck, const MachineSpec& machine, const PlanCandidate& c, int ranks) {
  Figures f;
  const ParallelLayout& o = c.plan.layout;
  const double tokens = static_cast<double>(o.dp) * static_cast<double>(o.micro_batch_size) * o.micro_batches *
                        static_cast<double>(deck.model.seq_len);
  f.tokens_per_s = tokens / c.step_s;
  f.flops = training_flops_per_token(deck.model) * tokens;
  f.mfu = f.flops / (c.step_s * ranks * machine.peak_flops(c.plan.precision == Precision::bf16));
  f.traffic = c.traffic;
  return f;
}

}  // namespace

namespace {

int run_shortest_time(const PlanCommand& cmd, const Deck& deck, const MachineSpec& machine, PlannerOptions options,
                      const Log& log) {
  if (cmd.tokens <= 0) throw InputError("--shortest-time needs --tokens T: the tokens to train on");
  const ShortestTime r =
      shortest_time(deck, machine, cmd.tokens, cmd.max_ranks, cmd.deck_batch, options, [&](const SweepRow& row, double s) {
        log.info(strprintf("planned %d rank(s), %s: %s [%.2f s]", row.ranks, family_name(row.family),
                           row.feasible ? strprintf("%.3g days", row.days).c_str() : "does not fit", s));
      });
  const std::int64_t seq = deck.model.seq_len;
  log.info(strprintf("%s on %s: expected loss %.3f nats after %s tokens (Kaplan et al. 2020), critical batch %s tokens "
                     "= %lld sequences of %lld%s",
                     deck.source.c_str(), machine.name.c_str(), r.loss, human_count(cmd.tokens).c_str(),
                     human_count(r.critical_batch_tokens).c_str(), static_cast<long long>(r.batch_sequences),
                     static_cast<long long>(seq), cmd.deck_batch ? " (the deck's batch is used instead)" : ""));
  log.info(strprintf("a batch of %lld sequences keeps busy at most about %lld devices per tensor-parallel group with "
                     "standard pipelines (4 micro-batches per stage), %lld with layered accumulation and modular "
                     "pipelines (1 per stage)",
                     static_cast<long long>(r.batch_sequences),
                     static_cast<long long>(devices_fed(r.batch_sequences, 1, Family::standard)),
                     static_cast<long long>(devices_fed(r.batch_sequences, 1, Family::layered_modular))));
  std::FILE* csv = nullptr;
  if (!cmd.write_sweep.empty()) {
    csv = std::fopen(cmd.write_sweep.c_str(), "w");
    if (csv == nullptr) throw RunError(cmd.write_sweep + ": cannot write the sweep");
    std::fprintf(csv, "# model=%s\n# machine=%s\n# tokens=%.6g\n# loss=%.6g\n# critical_batch_tokens=%.6g\n"
                      "# batch_sequences=%lld\n# seq_len=%lld\n",
                 deck.source.c_str(), machine.name.c_str(), cmd.tokens, r.loss, r.critical_batch_tokens,
                 static_cast<long long>(r.batch_sequences), static_cast<long long>(seq));
    std::fprintf(csv, "ranks,family,feasible,dp,tp,pp,zero,schedule,virtual_stages,layered,micro_batch_size,"
                      "micro_batches,batch_tokens,step_s,tokens_per_s,mfu,days\n");
  }
  for (const Family family : {Family::standard, Family::layered_modular}) {
    log.info(std::string(family == Family::standard ? "standard (GPipe, 1F1B, interleaved; depth-first)"
                                                    : "with layered accumulation and modular pipelines") + ":");
    log.info("  ranks  layout                                        batch (tokens)  step (s)   MFU     days");
    for (const SweepRow& row : r.rows) {
      if (row.family != family) continue;
      const ParallelLayout& o = row.best.plan.layout;
      if (!row.feasible) {
        log.info(strprintf("  %5d  does not fit", row.ranks));
      } else {
        log.info(strprintf("  %5d  %-45s %14s  %8.3g  %5.1f%%  %7.2f", row.ranks,
                           (layout_name(o) + strprintf(", %lld x %d", static_cast<long long>(o.micro_batch_size),
                                                       o.micro_batches)).c_str(),
                           human_count(static_cast<double>(row.batch_sequences * seq)).c_str(), row.best.step_s,
                           100.0 * row.mfu, row.days));
      }
      if (csv != nullptr) {
        std::fprintf(csv, "%d,%s,%d,%d,%d,%d,%d,%s,%d,%d,%lld,%d,%lld,%.6g,%.6g,%.6g,%.6g\n", row.ranks,
                     family_name(family), row.feasible ? 1 : 0, o.dp, o.tp, o.pp, o.zero, schedule_kind_name(o.schedule),
                     o.virtual_stages, o.layered ? 1 : 0, static_cast<long long>(o.micro_batch_size), o.micro_batches,
                     static_cast<long long>(row.batch_sequences * seq), row.best.step_s, row.tokens_per_s, row.mfu,
                     row.days);
      }
    }
  }
  if (csv != nullptr && std::fclose(csv) != 0) throw RunError(cmd.write_sweep + ": cannot write the sweep");
  JsonObject j, days, ranks;
  auto put = [&](const char* key, int i) {
    if (i < 0) return;
    days.add(key, r.rows[static_cast<std::size_t>(i)].days);
    ranks.add(key, r.rows[static_cast<std::size_t>(i)].ranks);
  };
  put("standard", r.shortest_standard);
  put("layered_modular", r.shortest_layered);
  if (r.shortest_standard >= 0 && r.shortest_layered >= 0) {
    const SweepRow& a = r.rows[static_cast<std::size_t>(r.shortest_standard)];
    const SweepRow& b = r.rows[static_cast<std::size_t>(r.shortest_layered)];
    log.info(strprintf("shortest time: %.2f days on %d ranks (standard), %.2f days on %d ranks (layered + modular): "
                       "%.2fx shorter",
                       a.days, a.ranks, b.days, b.ranks, a.days / b.days));
  }
  j.add("tokens", cmd.tokens).add("loss", r.loss).add("critical_batch_tokens", r.critical_batch_tokens);
  j.add("batch_sequences", r.batch_sequences).add("shortest_days", days).add("ranks_at_shortest", ranks);
  j.add("machine", machine.name);
  std::printf("%s\n", j.str().c_str());
  return r.shortest_standard < 0 && r.shortest_layered < 0 ? static_cast<int>(ExitCode::bad_input) : 0;
}

}  // namespace

int run_plan_command(const PlanCommand& cmd, const Log& log, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  const Deck deck = load_deck(cmd.deck, cmd.sets);
  PlannerOptions options;
  options.free_keys = free_keys(deck, true);
  options.ranks = ranks_for(deck, options.free_keys, cmd.ranks, comm);
  options.solver = cmd.solver;
  options.top = cmd.top;
  options.threads = cmd.threads;
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  if (parent != MPI_COMM_NULL) {  // a rank started by measure_with_ranks(): measure, then go
    MeasuringRanks m{parent, joined(parent, true)};
    measure_for(deck, options.free_keys, options.measured, log, m.all);
    m.close();
    return 0;
  }
  MachineSpec machine;
  if (!cmd.machine.empty()) {
    machine = load_machine(cmd.machine);
  } else if (world_size(comm) == 1 && options.ranks > 1) {
    machine = measure_with_ranks(cmd, deck, options, log);
  } else {
    machine = measure_for(deck, options.free_keys, options.measured, log, comm);
  }
  if (rank != 0) return 0;
  if (cmd.shortest_time) return run_shortest_time(cmd, deck, machine, options, log);
  std::string keys;
  for (const auto& k : options.free_keys) keys += (keys.empty() ? "" : ", ") + k;
  log.info(strprintf("planning %s (%s parameters) for %d rank(s) of %s (%d per node) with the %s solver; choosing: %s",
                     deck.source.c_str(), human_count(static_cast<double>(ParamLayout::of(deck.model).total_numel())).c_str(),
                     options.ranks, machine.name.c_str(), machine.devices_per_node, solver_name(cmd.solver),
                     keys.empty() ? "nothing (the layout is evaluated)" : keys.c_str()));
  const PlanResult r = plan_search(deck, machine, options);
  log.info(strprintf("layouts: %lld considered, %lld pruned (cannot fit, or slower than the best found with every "
                     "block at its fastest), %lld solved; %.2f s",
                     static_cast<long long>(r.layouts_considered), static_cast<long long>(r.layouts_pruned),
                     static_cast<long long>(r.layouts_solved), r.solve_s));
  log.debug(strprintf("planner time: %.2f s modelling the layouts, %.2f s in the %s solver, %.2f s simulating the "
                      "best exactly",
                      r.model_s, r.inner_s, solver_name(cmd.solver), r.solve_s - r.model_s - r.inner_s));
  JsonObject j;
  j.add("feasible", r.feasible).add("solve_s", r.solve_s).add("ranks", options.ranks);
  JsonObject cap;
  cap.add("device", static_cast<std::int64_t>(r.capacity_device)).add("host", static_cast<std::int64_t>(r.capacity_host));
  if (r.layouts_considered == 0) {
    log.error(no_layout_message(deck, machine, options, r));
    std::printf("%s\n", j.str().c_str());
    return static_cast<int>(ExitCode::bad_input);
  }
  if (!r.feasible) {
    log.error(strprintf("no plan fits: every layout needs at least %s of device memory per rank (capacity %s) and %s of "
                        "host memory (capacity %s), with every memory saving on; what helps: %s",
                        human_bytes(static_cast<double>(r.min_device_bytes)).c_str(), human_bytes(r.capacity_device).c_str(),
                        human_bytes(static_cast<double>(r.min_host_bytes)).c_str(), human_bytes(r.capacity_host).c_str(),
                        r.advice.c_str()));
    JsonObject need;
    need.add("device", r.min_device_bytes).add("host", r.min_host_bytes);
    j.add("min_bytes", need).add("capacity_bytes", cap).add("advice", r.advice);
    std::printf("%s\n", j.str().c_str());
    return static_cast<int>(ExitCode::bad_input);
  }
  for (std::size_t i = 0; i < r.best.size(); ++i) {
    const PlanCandidate& c = r.best[i];
    const Figures f = figures(deck, machine, c, options.ranks);
    const ParallelLayout& o = c.plan.layout;
    log.info(strprintf("%s %zu. %s, micro-batch %lld x %d: step %.4g s (optimizer %.3g s), %s tokens/s, MFU %.1f%%, "
                       "bubble %.1f%%, compute idle %.1f%%",
                       i == 0 ? "best" : "    ", i + 1, layout_name(o).c_str(), static_cast<long long>(o.micro_batch_size),
                       o.micro_batches, c.step_s, c.update_s, human_count(f.tokens_per_s).c_str(), 100.0 * f.mfu,
                       100.0 * c.bubble, 100.0 * c.idle));
    log.info(strprintf("        memory per rank: device %s of %s, host %s of %s; bytes per step and rank: dp %s, tp %s, "
                       "pp %s",
                       human_bytes(static_cast<double>(c.device_bytes)).c_str(), human_bytes(r.capacity_device).c_str(),
                       human_bytes(static_cast<double>(c.host_bytes)).c_str(), human_bytes(r.capacity_host).c_str(),
                       human_bytes(f.traffic.at("dp")).c_str(), human_bytes(f.traffic.at("tp")).c_str(),
                       human_bytes(f.traffic.at("pp")).c_str()));
    log.info("        " + policies(c.plan));
    log.debug(strprintf("        the solver's additive estimate of the step: %.4g s", c.solver_objective));
    const CostModel cost(deck.model, c.plan, machine, options.measured);
    for (const bool forward : {true, false}) {
      const CostModel::Parts& p = forward ? cost.forward_parts() : cost.backward_parts();
      const double total = forward ? cost.block_forward() : cost.block_backward();
      if (p.gemm == 0.0) continue;  // measured, not modelled
      log.debug(strprintf("        a block's %s per micro-batch: %.3g ms = GEMMs %.0f%%, attention %.0f%%, element-wise "
                          "%.0f%%, bf16 conversions %.0f%%, tensor-parallel all-reduces %.0f%%",
                          forward ? "forward" : "backward", 1e3 * total, 100 * p.gemm / total,
                          100 * p.attention / total, 100 * p.elementwise / total, 100 * p.conversions / total,
                          100 * p.tp / total));
    }
  }
  const PlanCandidate& best = r.best.front();
  log.info(strprintf("instruction lists: race-free (%zu instructions of the best plan and its optimizer programs "
                     "checked)",
                     best.checked_instructions));
  const Figures f = figures(deck, machine, best, options.ranks);
  const ParallelLayout& o = best.plan.layout;
  j.add("dp", o.dp).add("cp", o.cp).add("tp", o.tp).add("pp", o.pp).add("zero", o.zero);
  j.add("schedule", schedule_kind_name(o.schedule));
  j.add("virtual_stages", o.virtual_stages).add("layered", o.layered).add("sequence_parallel", o.sequence_parallel);
  j.add("micro_batch_size", o.micro_batch_size);
  j.add("micro_batches", o.micro_batches).add("step_s", best.step_s).add("tokens_per_s", f.tokens_per_s);
  j.add("model_flops_per_step", f.flops).add("mfu", f.mfu).add("bubble", best.bubble).add("compute_idle", best.idle);
  JsonObject peak;
  peak.add("device", best.device_bytes).add("host", best.host_bytes);
  j.add("peak_bytes", peak).add("capacity_bytes", cap);
  j.add("machine", machine.name).add("solver", solver_name(cmd.solver));
  j.add("race_checked_instructions", static_cast<std::int64_t>(best.checked_instructions));
  if (cmd.tokens > 0) j.add("train_days", cmd.tokens / f.tokens_per_s / 86400.0);
  if (!cmd.write_deck.empty()) {
    std::vector<std::string> sets = cmd.sets;
    sets.insert(sets.end(), best.sets.begin(), best.sets.end());
    const Deck planned = load_deck(cmd.deck, sets);
    std::ofstream out(cmd.write_deck);
    out << "# " << cmd.deck << " as planned by `lamina plan` for " << options.ranks << " rank(s) of " << machine.name
        << "\n" << planned.resolved_toml;
    if (!out) throw RunError(cmd.write_deck + ": cannot write the planned deck");
    log.info("planned deck written to " + cmd.write_deck);
  }
  std::printf("%s\n", j.str().c_str());
  return 0;
}

std::vector<std::string> plan_auto_keys(const Deck& deck, const Log& log, MPI_Comm comm) {
  int rank = 0;
  MPI_Comm_rank(comm, &rank);
  PlannerOptions options;
  options.free_keys = free_keys(deck, false);
  options.ranks = world_size(comm);
  const MachineSpec machine = measure_for(deck, options.free_keys, options.measured, log, comm);
  std::string sets, why = "no plan for the \"auto\" keys fits this machine's memory with " +
                         std::to_string(options.ranks) + " rank(s); `lamina plan " + deck.source +
                         "` says what it would need";
  if (rank == 0) {
    const PlanResult r = plan_search(deck, machine, options);
    if (r.layouts_considered == 0) why = no_layout_message(deck, machine, options, r);
    if (r.feasible) {
      for (const auto& s : r.best.front().sets) sets += s + "\n";
      log.info(strprintf("planned the deck's \"auto\" keys in %.2f s: %s, predicted step %.4g s", r.solve_s,
                         layout_name(r.best.front().plan.layout).c_str(), r.best.front().step_s));
    }
  }
  int n = static_cast<int>(sets.size());
  MPI_Request r = MPI_REQUEST_NULL;
  MPI_Ibcast(&n, 1, MPI_INT, 0, comm, &r);
  wait_bounded(r, "MPI_Ibcast of the plan's size from rank 0");
  sets.resize(static_cast<std::size_t>(n));
  MPI_Ibcast(&sets[0], n, MPI_CHAR, 0, comm, &r);
  wait_bounded(r, "MPI_Ibcast of the plan from rank 0");
  if (n == 0) {
    throw InputError(deck.source + ": " + why);
  }
  std::vector<std::string> out;
  std::size_t at = 0;
  while (at < sets.size()) {
    const std::size_t nl = sets.find('\n', at);
    out.push_back(sets.substr(at, nl - at));
    at = nl + 1;
  }
  return out;
}

}  // namespace lamina
