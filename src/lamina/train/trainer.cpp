#include "lamina/train/trainer.hpp"

#include "lamina/train/step_trace.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <cmath>
#include <filesystem>

#include "lamina/core/error.hpp"
#include "lamina/core/limits.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/json.hpp"
#include "lamina/core/stop_signal.hpp"
#include "lamina/core/system_memory.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/io/directory_lock.hpp"
#include "lamina/io/metrics_writer.hpp"
#include "lamina/io/model_checkpoint.hpp"
#include "lamina/io/model_weights.hpp"
#include "lamina/io/output_file.hpp"
#include "lamina/io/sampler.hpp"
#include "lamina/io/token_dataset.hpp"
#include "lamina/kernels/gemm.hpp"
#include "lamina/model/flops.hpp"
#include "lamina/optim/grad_norm.hpp"
#include "lamina/optim/lr_schedule.hpp"
#include "lamina/plan/race_check.hpp"
#include "lamina/train/background_checkpoint.hpp"
#include "lamina/train/generate.hpp"
#include "lamina/train/machine.hpp"
#include "lamina/train/runtime.hpp"
#include "lamina/train/step_trace.hpp"

namespace lamina {

namespace fs = std::filesystem;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;

// Tokens of the corpus shown to the unigram-entropy yardstick (enough for a stable value).
constexpr std::int64_t kEntropySampleTokens = 1 << 24;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// output.dir and checkpoint.dir must be directories or not exist yet. A file in the way
// (the path or one of its parents) is the deck's mistake: reported before any step, not
// as a failed write at the first checkpoint.
void check_output_dirs(const Deck& deck) {
  for (const auto& [key, dir] : {std::pair<std::string, std::string>{"output.dir", deck.output.dir},
                                 {"checkpoint.dir", deck.checkpoint.dir}}) {
    std::error_code ec;
    for (fs::path p = dir; !p.empty(); p = p.parent_path()) {
      const fs::file_status st = fs::status(p, ec);
      if (!fs::exists(st)) {
        if (p == p.parent_path()) break;
        continue;
      }
      if (!fs::is_directory(st)) {
        throw InputError(deck.where(key) + ": " + key + ": " + p.string() + " is an existing file, not a directory" +
                         (p.string() == dir ? "" : " (in the path " + dir + ")") + "; choose another " + key);
      }
      break;
    }
  }
}

// How this job's ranks share this node: ranks on the node, and ranks on this rank's device
// where it has one. Run alone for a deck of many ranks (--check), one rank per node.
NodeShare node_share(MPI_Comm comm, const SystemMemory& system) {
  const BlockingSection section("the other ranks to find which ranks share a node");
  NodeShare share;
  MPI_Comm node = MPI_COMM_NULL;
  MPI_Comm_split_type(comm, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node);
  MPI_Comm_size(node, &share.ranks_on_node);
  share.ranks_on_device = share.ranks_on_node;
#if defined(KOKKOS_ENABLE_CUDA)
  if (system.separate_device) {
    const int mine = Kokkos::Cuda().cuda_device();
    std::vector<int> devices(static_cast<std::size_t>(share.ranks_on_node));
    MPI_Allgather(&mine, 1, MPI_INT, devices.data(), 1, MPI_INT, node);
    share.ranks_on_device = static_cast<int>(std::count(devices.begin(), devices.end(), mine));
  }
#else
  (void)system;
#endif
  MPI_Comm_free(&node);
  return share;
}

// The memory checks every run and --check make before anything is allocated: the deck's
// budgets, then what the node really has. Returns a warning for the log, or "".
std::string check_memory(const Plan& plan, const MemoryEstimate& estimate, const std::string& source, MPI_Comm comm) {
  check_memory_budget(plan, estimate, source);
  const SystemMemory system = system_memory();
  return check_memory_fits(estimate, system, node_share(comm, system), source);
}

// The windows of `ds`, the data `key` names; a dataset too short for one window is an
// InputError naming the key, where the deck sets it, and its files.
std::unique_ptr<SequenceSampler> sampler_of(const TokenDataset& ds, const Deck& deck, const std::string& key,
                                            const std::vector<std::string>& paths, bool shuffle) {
  try {
    return std::make_unique<SequenceSampler>(ds.num_tokens(), deck.model.seq_len, deck.train.seed, shuffle);
  } catch (const InputError& e) {
    std::string files;
    for (const auto& p : paths) files += (files.empty() ? "" : ", ") + p;
    throw InputError(deck.where(key) + ": " + key + " = " + files + ": " + e.what());
  }
}

class Trainer {
 public:
  Trainer(const Deck& deck, const Log& log, MPI_Comm comm) : deck_(deck), log_(log), comm_(comm) {
    int world = 1;
    MPI_Comm_size(comm, &world);
    plan_ = plan_from_deck(deck, world);
  }

  // evaluate_only: `lamina eval`, the weights (checkpoint.resume or model.init) on the
  // held-out tokens, nothing trained or written but a line appended to metrics.jsonl.
  TrainSummary run(bool evaluate_only = false) {
    int world = 1, rank = 0;
    MPI_Comm_size(comm_, &world);
    MPI_Comm_rank(comm_, &rank);
    const auto& d = deck_.data;
    const auto& m = deck_.model;
    positions_per_step_ = d.batch_size * m.seq_len;

    log_.info("resolved deck (" + deck_.source + "):\n" + deck_.resolved_toml);
    log_.info(describe(plan_));
    measure_dos_inputs(plan_);
    const RunExtras extras = RunExtras::of(deck_.checkpoint, deck_.output);
    const MemoryEstimate estimate = estimate_memory(m, plan_, extras);
    log_.info(format_memory_estimate(estimate));
    if (const std::string warning = check_memory(plan_, estimate, deck_.source, comm_); !warning.empty()) {
      log_.warn(warning);
    }

    check_output_dirs(deck_);
    // Before anything is cleaned up: a resume that names an unfinished write is refused
    // with that file still there.
    if (!deck_.checkpoint.resume.empty()) {
      resume_path_ = resolve_checkpoint(deck_.checkpoint.resume, deck_.checkpoint.dir);
    }
    std::error_code ec;
    if (rank == 0) fs::create_directories(deck_.output.dir, ec);
    if (ec) throw RunError(deck_.output.dir + ": cannot create the output directory: " + ec.message());
    if (rank == 0) {
      // Before anything is written or cleaned up: the directories are this job's alone.
      take_directories(evaluate_only);
    }
    if (rank == 0 && !evaluate_only) {
      write_text_file(deck_.output.dir + "/deck.resolved.toml",
                      "# resolved from " + deck_.source + "\n" + deck_.resolved_toml);
      // What a run killed while writing a checkpoint left behind.
      for (const auto& p : remove_partial_checkpoints(deck_.checkpoint.dir)) {
        log_.info("removed " + p + ", the unfinished write of an earlier run");
      }
    }

    if (!evaluate_only) open_data();
    open_eval_data(evaluate_only);
    Runtime rt(tracker_, m, deck_.optimizer, plan_, extras, comm_, deck_.comm);
    const ParamLayout full = ParamLayout::of(m);
    log_.info(rt.grid().describe());
    log_.info(strprintf("schedule: %s; %s", rt.schedule().name().c_str(), rt.schedule().partition().describe().c_str()));
    for (int s = 0; s < rt.schedule().stages(); ++s) {
      log_.debug(strprintf("stage %d program: %s", s, rt.schedule().describe(s).c_str()));
    }
    log_.debug("rank 0 optimizer program: " + describe(rt.update_program(), rt.schedule().final_layer()));
    for (const auto& line : rt.dos_schedule()) log_.debug("deep optimizer states " + line);
    log_.info(strprintf("model: %s, %s parameters (%s), ZeRO stage %lld, optimizer subgroups of <= %lld",
                        gpt2_block(m)                                 ? "GPT-2"
                        : m.parts.mlp == MlpKind::swiglu && m.parts.norm == NormKind::rmsnorm &&
                                  m.parts.position == PositionKind::rotary
                            ? "Llama"
                            : "a GPT-2 block with other parts",
                        human_count(static_cast<double>(full.total_numel())).c_str(),
                        model_signature(m).c_str(),
                        static_cast<long long>(plan_.layout.zero),
                        static_cast<long long>(deck_.optimizer.subgroup_size)));
    log_.info(strprintf("batch: %lld sequences x %lld tokens per step = dp %lld x %d micro-batch(es) of %lld",
                        static_cast<long long>(d.batch_size), static_cast<long long>(m.seq_len),
                        static_cast<long long>(plan_.layout.dp), rt.micro_batches(),
                        static_cast<long long>(plan_.layout.micro_batch_size)));

    std::int64_t start_step = 0;
    samples_ = 0;
    if (!deck_.checkpoint.resume.empty()) {
      if (!m.init.empty()) log_.info("model.init = " + m.init + " is not read: the run resumes from its checkpoint");
      start_step = resume(rt);
      if (!evaluate_only) settle_newer_checkpoints(start_step);
    } else {
      rt.state().init(deck_.train.seed);
      if (!m.init.empty()) initialise_from(rt, m.init);
    }
    TrainSummary summary;
    summary.first_step = start_step;
    summary.last_step = start_step;
    const std::string metrics_path = deck_.output.dir + "/metrics.jsonl";
    if (evaluate_only) {
      if (m.init.empty() && deck_.checkpoint.resume.empty()) {
        log_.warn("neither checkpoint.resume nor model.init is set: evaluating the random initial weights");
      }
      if (rank == 0) metrics_ = MetricsWriter(metrics_path, -1);
      summary.final_loss = evaluate(rt, start_step);
      return summary;
    }
    if (deck_.train.steps == 0 && deck_.checkpoint.resume.empty()) {
      // A fresh model's weights (seeded, or model.init's), to start another trainer from.
      const std::string path = save(rt, 0);
      log_.info("train.steps = 0: the initial weights are in " + path);
      return summary;
    }
    if (start_step >= deck_.train.steps) {
      log_.info(strprintf("the checkpoint is at step %lld and train.steps = %lld: nothing to do",
                          static_cast<long long>(start_step), static_cast<long long>(deck_.train.steps)));
      return summary;
    }

    set_up_background_checkpoints(rt);
    // From here on a signal has work to save. Not before: when one rank finds bad input, its
    // MPI_Abort ends the others with SIGTERM, which must not read as a stop request.
    install_stop_handlers();
    if (rank == 0) metrics_ = MetricsWriter(metrics_path, start_step);
    measure_peak();
    if (eval_dataset_ != nullptr && start_step == 0) evaluate(rt, 0);  // the baseline

    const double flops_per_step = training_flops_per_token(m) * static_cast<double>(positions_per_step_);
    const std::int64_t per_rank = d.batch_size / plan_.layout.dp;
    const std::int64_t rank_offset = rt.grid().dp_rank() * per_rank;
    std::vector<std::int32_t> window(static_cast<std::size_t>(m.seq_len + 1));
    const auto run_start = std::chrono::steady_clock::now();
    double total_ms = 0.0, best_loss = INFINITY;
    std::int64_t skipped = 0, skipped_in_a_row = 0, timed = 0;
    rt.take_comm_bytes();
    for (std::int64_t step = start_step; step < deck_.train.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      const std::int64_t first = samples_ + rank_offset;
      const MicroBatchLoader load = [&](int mb, std::int32_t* inputs, std::int32_t* targets) {
        load_micro_batch(first + mb * plan_.layout.micro_batch_size, inputs, targets, window);
      };
      Runtime::StepResult r;
      try {
        r = rt.forward_backward(load, positions_per_step_);
      } catch (const RunError& e) {
        // A data file that shrank while this step read it. Alone, the rank still holds the
        // state after the previous step (the optimizer has not run): save it. Ranks of a job
        // learn of it together at the end of a step (agreed_stop) instead.
        if (world > 1 || dataset_->shrinkage().empty()) throw;
        throw RunError(strprintf("%s; the run stopped after step %lld, saved in %s", e.what(),
                                 static_cast<long long>(step), save(rt, step).c_str()));
      }
      if (step + 1 == deck_.output.trace_step) write_trace(rt, step + 1);
      const double lr = learning_rate(deck_.optimizer, step, deck_.train.steps);
      const bool finite = std::isfinite(r.loss) && std::isfinite(r.grad_norm);
      if (!finite) {
        const std::string what = strprintf("step %lld: %s is not finite (loss %g, gradient norm %g)",
                                           static_cast<long long>(step + 1),
                                           std::isfinite(r.loss) ? "the gradient" : "the loss", r.loss, r.grad_norm);
        if (!deck_.train.skip_nonfinite) {
          throw RunError(what + "; lower optimizer.lr, raise optimizer.warmup_steps or set optimizer.grad_clip "
                                "(train.skip_nonfinite = true skips such steps)");
        }
        ++skipped;
        if (++skipped_in_a_row >= deck_.train.max_skipped) {
          throw RunError(strprintf("%s: %lld steps in a row skipped (train.max_skipped): the run has diverged; resume "
                                   "from an earlier checkpoint with a lower optimizer.lr, a longer "
                                   "optimizer.warmup_steps or optimizer.grad_clip",
                                   what.c_str(), static_cast<long long>(skipped_in_a_row)));
        }
        log_.warn(what + ": step skipped (train.skip_nonfinite)");
      } else {
        skipped_in_a_row = 0;
        rt.optimizer_step(lr, clip_coefficient(r.grad_norm, deck_.optimizer.grad_clip));
      }
      Exec().fence();
      const double step_ms = seconds_since(t0) * 1e3;
      samples_ += d.batch_size;
      total_ms += step_ms;
      ++timed;
      if (finite) best_loss = std::min(best_loss, r.loss);
      summary.final_loss = r.loss;
      summary.last_step = step + 1;
      const auto bytes = rt.take_comm_bytes();
      const bool last = step + 1 == deck_.train.steps;
      if ((step + 1) % deck_.output.log_every == 0 || last || step == start_step) {
        report(step + 1, r, lr, step_ms, flops_per_step, !finite, world, rt.grid(), bytes);
      }
      if (eval_dataset_ != nullptr &&
          (last || (deck_.train.eval_every > 0 && (step + 1) % deck_.train.eval_every == 0))) {
        evaluate(rt, step + 1);
      }
      const bool periodic = deck_.checkpoint.every > 0 && (step + 1) % deck_.checkpoint.every == 0;
      const Stop stop_why = last ? Stop{} : agreed_stop(rt);
      const int stop = stop_why.signal;
      if (stop_why.write_failed) finish_background();  // throws that write's error
      std::string saved;
      if (periodic || (last && deck_.checkpoint.save_final) || stop != 0 || stop_why.data_shrank) {
        // The run goes on after a periodic checkpoint only: the others are written before it ends.
        saved = save(rt, step + 1, periodic && !last && stop == 0 && !stop_why.data_shrank);
      } else if (background_ != nullptr && background_->done()) {
        finish_background();  // to report it
      }
      if (stop_why.data_shrank) {
        const std::string what = dataset_->shrinkage();
        throw RunError(strprintf("%s; the run stopped after step %lld, saved in %s",
                                 what.empty() ? "a data file shrank under another rank" : what.c_str(),
                                 static_cast<long long>(step + 1), saved.c_str()));
      }
      if (stop != 0) {
        throw Interrupted(stop, strprintf("stopped by %s after step %lld, saved in %s; to resume, run the same deck "
                                          "with --set checkpoint.resume=latest",
                                          signal_name(stop), static_cast<long long>(step + 1), saved.c_str()));
      }
    }
    finish_background();
    metrics_.close();
    summary.mean_step_ms = total_ms / static_cast<double>(std::max<std::int64_t>(1, timed));
    if (deck_.output.sample_tokens > 0) print_sample(rt, summary.last_step);
    const double wall = seconds_since(run_start);
    std::string mem;
    for (const auto& kv : tracker_.peak_by_space()) {
      mem += strprintf(", peak %s %s", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
    }
    log_.info(strprintf("done: steps %lld-%lld in %.1f s (%.1f ms/step), %s tokens, final loss %.4f, best %.4f%s%s",
                        static_cast<long long>(start_step + 1), static_cast<long long>(summary.last_step), wall,
                        summary.mean_step_ms,
                        human_count(static_cast<double>(timed * positions_per_step_)).c_str(), summary.final_loss,
                        best_loss, mem.c_str(),
                        skipped ? strprintf(", %lld step(s) skipped", static_cast<long long>(skipped)).c_str() : ""));
    for (const auto& [space, cats] : tracker_.peak_by_category()) {
      std::string line = "memory peak by category, " + space + ":";
      for (const auto& kv : cats) line += strprintf(" %s %s,", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
      line.pop_back();
      log_.info(line);
    }
    return summary;
  }

 private:
  // data.eval_path: its windows in file order (no shuffling), whole batches of
  // data.batch_size sequences, train.eval_batches of them (0: all).
  void open_eval_data(bool required) {
    if (deck_.data.eval_paths.empty()) {
      if (required) throw InputError(deck_.where("data.eval_path") + ": lamina eval needs data.eval_path, the held-out tokens");
      return;
    }
    DataConfig eval = deck_.data;
    eval.paths = eval.eval_paths;
    eval_dataset_ = open_dataset(eval, deck_.model.vocab_size, deck_.train.seed);
    eval_sampler_ = sampler_of(*eval_dataset_, deck_, "data.eval_path", deck_.data.eval_paths, false);
    const std::int64_t all = eval_sampler_->num_windows() / deck_.data.batch_size;
    if (all == 0) {
      throw InputError(strprintf("data.eval_path: %s holds %lld windows of %lld+1 tokens, fewer than one batch "
                                 "(data.batch_size = %lld)",
                                 eval_dataset_->describe().c_str(), static_cast<long long>(eval_sampler_->num_windows()),
                                 static_cast<long long>(deck_.model.seq_len),
                                 static_cast<long long>(deck_.data.batch_size)));
    }
    eval_batches_ = deck_.train.eval_batches > 0 ? std::min(all, deck_.train.eval_batches) : all;
    log_.info(strprintf("eval data: %s; %lld batch(es) of %lld sequences per evaluation%s",
                        eval_dataset_->describe().c_str(), static_cast<long long>(eval_batches_),
                        static_cast<long long>(deck_.data.batch_size),
                        eval_batches_ < deck_.train.eval_batches ? " (all the file holds)" : ""));
  }

  // Mean loss over the held-out batches (each the mean of its positions, all the same
  // size), the same on every rank. The weights are not changed: the pass's gradients are
  // dropped (the next pass zeroes them).
  double evaluate(Runtime& rt, std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    const std::int64_t per_rank = deck_.data.batch_size / plan_.layout.dp;
    const std::int64_t rank_offset = rt.grid().dp_rank() * per_rank;
    std::vector<std::int32_t> window(static_cast<std::size_t>(deck_.model.seq_len + 1));
    double sum = 0.0;
    for (std::int64_t b = 0; b < eval_batches_; ++b) {
      const std::int64_t first = b * deck_.data.batch_size + rank_offset;
      const MicroBatchLoader load = [&](int mb, std::int32_t* inputs, std::int32_t* targets) {
        load_windows(*eval_dataset_, *eval_sampler_, first + mb * plan_.layout.micro_batch_size, inputs, targets, window);
      };
      sum += rt.forward_backward(load, positions_per_step_).loss;
    }
    const double loss = sum / static_cast<double>(eval_batches_);
    const std::int64_t tokens = eval_batches_ * positions_per_step_;
    const double ms = seconds_since(t0) * 1e3;
    log_.info(strprintf("eval after step %lld | loss %.4f | perplexity %.3f | %s tokens of %s | %.1f ms",
                        static_cast<long long>(step), loss, std::exp(loss), human_count(static_cast<double>(tokens)).c_str(),
                        eval_dataset_->describe().c_str(), ms));
    if (metrics_.is_open()) {
      JsonObject j;
      j.add("step", step).add("eval_loss", loss).add("eval_perplexity", std::exp(loss)).add("eval_tokens", tokens)
          .add("eval_ms", ms);
      metrics_.write(j);
    }
    return loss;
  }

  // model.init: the parameters from a weights file; the optimizer starts fresh at step 0.
  void initialise_from(Runtime& rt, const std::string& path) {
    const auto t0 = std::chrono::steady_clock::now();
    const BlockingSection section("the other ranks to read the initial weights " + path);
    const auto source = open_weights(path);
    check_weights_model(*source, deck_.model);
    read_model_weights(*source, rt.state().layout(), rt.state());
    log_.info(strprintf("initial weights: %s (%s) [%.2f s]", path.c_str(), source->describe().c_str(), seconds_since(t0)));
  }

  void open_data() {
    const auto t0 = std::chrono::steady_clock::now();
    dataset_ = open_dataset(deck_.data, deck_.model.vocab_size, deck_.train.seed);
    sampler_ = sampler_of(*dataset_, deck_, "data.path", deck_.data.paths, deck_.data.shuffle);
    std::string line = "data: " + dataset_->describe() +
                       strprintf(", %s windows of %lld+1 tokens", human_count(static_cast<double>(sampler_->num_windows())).c_str(),
                                 static_cast<long long>(deck_.model.seq_len));
    // Only rank 0 prints it: the other ranks skip reading the sample.
    if (log_.rank() == 0 && deck_.data.format != DataFormat::synthetic && deck_.model.vocab_size <= (1 << 24)) {
      const double h = unigram_entropy(*dataset_, deck_.model.vocab_size, kEntropySampleTokens);
      line += strprintf("; unigram entropy %.3f nats (a model ignoring context cannot beat it), uniform %.3f", h,
                        std::log(static_cast<double>(deck_.model.vocab_size)));
    }
    log_.info(line + strprintf(" [%.2f s]", seconds_since(t0)));
  }

  // Global samples [first_sample, first_sample + micro_batch_size) as inputs and targets.
  void load_micro_batch(std::int64_t first_sample, std::int32_t* inputs, std::int32_t* targets,
                        std::vector<std::int32_t>& window) const {
    load_windows(*dataset_, *sampler_, first_sample, inputs, targets, window);
  }

  void load_windows(const TokenDataset& data, const SequenceSampler& sampler, std::int64_t first_sample,
                    std::int32_t* inputs, std::int32_t* targets, std::vector<std::int32_t>& window) const {
    const std::int64_t T = deck_.model.seq_len;
    for (std::int64_t s = 0; s < plan_.layout.micro_batch_size; ++s) {
      data.read(sampler.window_start(first_sample + s), T + 1, window.data());
      std::copy(window.begin(), window.end() - 1, inputs + s * T);
      std::copy(window.begin() + 1, window.end(), targets + s * T);
    }
  }

  // This rank's instructions of the step, as they ran (output.trace_step).
  void write_trace(const Runtime& rt, std::int64_t step) {
    const int rank = rt.grid().world_rank();
    const std::string path = strprintf("%s/trace_step%lld_rank%d.json", deck_.output.dir.c_str(),
                                       static_cast<long long>(step), rank);
    write_text_file(path, step_trace_json(rt.schedule().program(rt.grid().pp_rank()), rt.step_events(),
                                          rt.schedule().final_layer(), rank, rt.ring_passes()));
    if (rank == 0) log_.info("trace of step " + std::to_string(step) + " written: " + path + " (one per rank)");
  }

  // A prompt from the data (the next unseen window's first half) and the model's
  // continuation, so that what a byte-level model has learnt can be read.
  void print_sample(Runtime& rt, std::int64_t step) {
    const ProcessGrid& g = rt.grid();
    if (g.tp_size() > 1 || g.pp_size() > 1) {
      log_.info("sample: skipped (printing a sample needs every layer on each rank: tp = pp = 1)");
      return;
    }
    const std::int64_t T = deck_.model.seq_len;
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(T / 2));
    dataset_->read(sampler_->window_start(samples_), T / 2, prompt.data());
    const auto out = generate_tokens(rt.state(), tracker_, prompt, deck_.output.sample_tokens,
                                     deck_.output.sample_temperature, deck_.train.seed);
    log_.info(strprintf("sample after step %lld (temperature %.2f): a prompt from the data, then >>> and %lld bytes "
                        "the model wrote:\n%s>>>%s\n",
                        static_cast<long long>(step), deck_.output.sample_temperature,
                        static_cast<long long>(deck_.output.sample_tokens), bytes_to_text(prompt).c_str(),
                        bytes_to_text(out).c_str()));
  }

  void measure_peak() {
    if (deck_.output.peak_tflops > 0.0) {
      peak_tflops_ = deck_.output.peak_tflops;
      log_.info(strprintf("peak for MFU: %.3f TFLOP/s per rank (output.peak_tflops)", peak_tflops_));
      return;
    }
    const ProductMath math = product_math<Exec>(plan_.precision);
    const std::int64_t n = rate_gemm_order(1536);
    peak_tflops_ = measure_gemm_gflops(n, 3, math).best / 1e3;
    log_.info(strprintf("peak for MFU: %.3f TFLOP/s per rank (measured %s GEMM, %lld^3; set output.peak_tflops "
                        "to use a datasheet value)",
                        peak_tflops_, product_math_name(math), static_cast<long long>(n)));
  }

  void report(std::int64_t step, const Runtime::StepResult& r, double lr, double step_ms, double flops_per_step,
              bool skipped, int world, const ProcessGrid& grid, const std::map<std::string, std::int64_t>& bytes) {
    const double tokens_per_s = static_cast<double>(positions_per_step_) / (step_ms / 1e3);
    const double tflops = flops_per_step / (step_ms / 1e3) / world / 1e12;
    const double mfu = peak_tflops_ > 0 ? tflops / peak_tflops_ : 0.0;
    std::string mem;
    for (const auto& kv : tracker_.peak_by_space()) {
      mem += strprintf(" | %s %s", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
    }
    std::string extra;
    if (grid.pp_size() > 1) extra += strprintf(" | bubble %.1f%%", 100.0 * r.bubble);
    if (world > 1) {
      for (const auto& kv : bytes)
        if (kv.second > 0) extra += strprintf(" | %s %s", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
    }
    log_.info(strprintf("step %*lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.1f ms | %s tok/s | %.3f TFLOP/s | "
                        "MFU %.1f%%%s%s%s",
                        static_cast<int>(std::to_string(deck_.train.steps).size()), static_cast<long long>(step),
                        static_cast<long long>(deck_.train.steps), r.loss, lr, r.grad_norm, step_ms,
                        human_count(tokens_per_s).c_str(), tflops, 100.0 * mfu, mem.c_str(), extra.c_str(),
                        skipped ? " | SKIPPED" : ""));
    if (!metrics_.is_open()) return;
    JsonObject j;
    j.add("step", step)
        .add("loss", r.loss)
        .add("lr", lr)
        .add("grad_norm", r.grad_norm)
        .add("step_ms", step_ms)
        .add("tokens_per_s", tokens_per_s)
        .add("tflops_per_rank", tflops)
        .add("mfu", mfu)
        .add("mem_peak_bytes", tracker_.peak_by_space());
    JsonObject by_cat, now_by_cat;
    for (const auto& [space, cats] : tracker_.peak_by_category()) by_cat.add(space, cats);
    for (const auto& [space, cats] : tracker_.current_by_category()) now_by_cat.add(space, cats);
    j.add("mem_peak_by_category", by_cat);
    j.add("mem_current_bytes", tracker_.current_by_space());
    j.add("mem_current_by_category", now_by_cat);
    j.add("comm_bytes", bytes);
    j.add("bubble_fraction", r.bubble);
    j.add("virtual_step_time", r.makespan);
    if (skipped) j.add("skipped", true);
    metrics_.write(j);
  }

  // The hold on output.dir and on checkpoint.dir, for the job's lifetime
  // (io/directory_lock.hpp). Both, wherever they lie: a checkpoint.dir inside another job's
  // output.dir meets that job's hold on it, and that job, started later, meets this one's.
  // An evaluation only reads checkpoint.dir (a file `latest` names is complete, and stays
  // readable once opened whatever retention does): it may evaluate a running job's
  // checkpoints, so it holds output.dir alone.
  void take_directories(bool evaluate_only) {
    locks_.push_back(std::make_unique<DirectoryLock>(deck_.output.dir, "output.dir"));
    if (evaluate_only) return;
    std::error_code ec;
    fs::create_directories(deck_.checkpoint.dir, ec);
    if (ec) throw RunError(deck_.checkpoint.dir + ": cannot create the checkpoint directory: " + ec.message());
    // One lock per file: closing a second descriptor of it would drop the process's lock.
    if (fs::equivalent(deck_.output.dir, deck_.checkpoint.dir, ec)) return;
    locks_.push_back(std::make_unique<DirectoryLock>(deck_.checkpoint.dir, "checkpoint.dir"));
  }

  // Why the run stops after this step, agreed by every rank in one reduction: the stop
  // signal any rank received (the largest number), and whether a data file shrank under
  // any of them (rewritten or truncated: the next step's reads would fail), so that every
  // rank saves and stops after the same step.
  // And whether a background checkpoint failed on any rank (each learns of its writer's
  // end at its own time), so that every rank reports it after the same step.
  struct Stop {
    int signal = 0;
    bool data_shrank = false;
    bool write_failed = false;
  };
  Stop agreed_stop(Runtime& rt) const {
    double v[3] = {static_cast<double>(stop_requested()), dataset_->shrinkage().empty() ? 0.0 : 1.0,
                   background_ != nullptr && background_->failed() ? 1.0 : 0.0};
    rt.grid().world().allreduce(v, 3, ReduceOp::max);
    return {static_cast<int>(v[0]), v[1] != 0.0, v[2] != 0.0};
  }

  // checkpoint.async where it can be: MPI lets a second thread communicate, and the copies
  // of the ranks on this node fit in the host memory available now (after the run's own
  // allocations). All ranks decide alike: the writers' communicator is collective.
  void set_up_background_checkpoints(Runtime& rt) {
    if (!deck_.checkpoint.async || deck_.checkpoint.every <= 0) return;
    const std::int64_t copy = ModelStateSnapshot::bytes_of(rt.state().layout(), rt.state());
    const SystemMemory system = system_memory();
    const NodeShare share = node_share(comm_, system);
    std::string why;
    if (!BackgroundCheckpoint::thread_multiple()) {
      why = "MPI does not grant MPI_THREAD_MULTIPLE (with Cray MPICH, export MPICH_MAX_THREAD_SAFETY=multiple)";
    } else if (copy * share.ranks_on_node > system.host_available) {
      why = strprintf("the copies of this node's %d rank(s), %s each, need more than the %s of host memory available",
                      share.ranks_on_node, human_bytes(static_cast<double>(copy)).c_str(),
                      human_bytes(static_cast<double>(system.host_available)).c_str());
    }
    double unable = why.empty() ? 0.0 : 1.0;
    rt.grid().world().allreduce(&unable, 1, ReduceOp::max);
    if (unable != 0.0) {
      log_.info("checkpoint.async: checkpoints are written synchronously: " +
                (why.empty() ? std::string("another rank cannot write in the background") : why));
      return;
    }
    const auto t0 = std::chrono::steady_clock::now();
    background_ = std::make_unique<BackgroundCheckpoint>(comm_, rt.state().layout(), rt.state());
    log_.info(strprintf("checkpoint.async: periodic checkpoints are written in the background (a host copy of %s on rank 0, "
                        "allocated in %.2f s)",
                        human_bytes(static_cast<double>(copy)).c_str(), seconds_since(t0)));
  }

  // Waits for the background write in flight, reports it, and ends the run with its error.
  void finish_background() {
    if (background_ == nullptr || !background_->busy()) return;
    const auto t0 = std::chrono::steady_clock::now();
    BackgroundCheckpoint::Written w;
    const auto why = [&](const std::exception& e) {
      return strprintf("%s; the background checkpoint of step %lld is not written (the last one in %s is kept), and "
                       "the run stops",
                       e.what(), static_cast<long long>(background_step_), deck_.checkpoint.dir.c_str());
    };
    try {
      w = background_->finish();
    } catch (const JobWideError& e) {
      throw JobWideError(why(e));  // every rank's writer failed with it
    } catch (const std::exception& e) {
      throw RunError(why(e));
    }
    if (w.path.empty()) {  // this rank's write ended well, another's did not
      throw RunError(strprintf("another rank's background checkpoint of step %lld failed; the run stops",
                               static_cast<long long>(background_step_)));
    }
    const double waited = seconds_since(t0);
    log_.info(strprintf("checkpoint: %s written in the background in %.2f s (%s, %.0f MB/s)%s", w.path.c_str(),
                        w.seconds, human_bytes(static_cast<double>(w.bytes)).c_str(),
                        static_cast<double>(w.bytes) / w.seconds / 1e6,
                        waited >= 0.005 ? strprintf("; training waited %.2f s for it", waited).c_str() : ""));
  }

  // Checkpoints of steps after `step` in checkpoint.dir: a future this run abandons. The
  // run's retention never deletes them; what becomes of them is the user's word
  // (checkpoint.newer), never a silent choice.
  void settle_newer_checkpoints(std::int64_t step) {
    std::vector<std::string> newer;
    for (const auto& p : list_checkpoints(deck_.checkpoint.dir)) {
      if (checkpoint_step(fs::path(p).filename().string()) > step) newer.push_back(p);
    }
    if (newer.empty()) return;
    std::string list;
    for (const auto& p : newer) list += "\n  " + p;
    const std::string policy = deck_.checkpoint.newer;
    if (policy == "refuse") {
      throw InputError(strprintf("checkpoint.resume = %s continues from step %lld, but %s holds checkpoints of later "
                                 "steps, which `latest` and retention would leave behind:%s\nset checkpoint.newer = "
                                 "\"keep\" (leave them) or \"aside\" (rename them *.abandoned), or resume from "
                                 "\"latest\"",
                                 deck_.checkpoint.resume.c_str(), static_cast<long long>(step),
                                 deck_.checkpoint.dir.c_str(), list.c_str()));
    }
    if (policy == "aside") {
      if (log_.rank() == 0) {
        for (const auto& p : newer) {
          std::string aside = p + ".abandoned";  // an earlier abandoned one keeps its name
          for (int n = 1; fs::exists(fs::symlink_status(aside)); ++n) aside = p + strprintf(".abandoned.%d", n);
          if (std::rename(p.c_str(), aside.c_str()) != 0) {
            throw RunError(p + ": cannot rename to " + aside + ": " + std::strerror(errno));
          }
        }
        // `latest` named one of them: now the checkpoint resumed from, where it is in dir.
        const fs::path from = fs::weakly_canonical(resume_path_);
        if (from.parent_path() == fs::weakly_canonical(deck_.checkpoint.dir)) {
          point_latest(deck_.checkpoint.dir, from.filename().string());
        } else {
          fs::remove(deck_.checkpoint.dir + "/latest");
        }
      }
      log_.warn("checkpoints of later steps renamed aside (checkpoint.newer = \"aside\"): *.abandoned of" + list);
    } else {
      log_.warn("checkpoints of later steps kept (checkpoint.newer = \"keep\"); `latest` will name this run's:" +
                list);
    }
  }

  std::int64_t resume(Runtime& rt) {
    const std::string& path = resume_path_;
    const BlockingSection section("the other ranks to read the checkpoint " + path);
    CheckpointReader reader(path, comm_);
    const CheckpointMeta& meta = reader.meta();
    if (meta.model != model_signature(deck_.model)) {
      throw InputError(path + ": the checkpoint holds a model with " + meta.model + ", the deck asks for " +
                       model_signature(deck_.model));
    }
    if (meta.seed != deck_.train.seed) {
      log_.warn(strprintf("the checkpoint was written with train.seed = %llu, the deck has %llu: the data order "
                          "after the restart differs from an uninterrupted run",
                          static_cast<unsigned long long>(meta.seed), static_cast<unsigned long long>(deck_.train.seed)));
    }
    const auto t0 = std::chrono::steady_clock::now();
    read_model_state(reader, rt.state().layout(), rt.state());
    if (reader.unchecked() > 0 && log_.rank() == 0) {
      log_.warn(strprintf("%s: %lld tensor(s) carry no checksum (the file was written before lamina stored them): "
                          "damage that leaves the values finite cannot be detected",
                          path.c_str(), static_cast<long long>(reader.unchecked())));
    }
    // This run reads samples from there on: their tokens must stay countable (core/limits.hpp).
    const std::int64_t per_sample = deck_.model.seq_len + 1;
    const std::int64_t to_come = std::max<std::int64_t>(0, deck_.train.steps - meta.step) * deck_.data.batch_size;
    if (meta.samples_consumed > kMaxTokens / per_sample - to_come) {
      throw InputError(strprintf("%s: attribute 'samples_consumed' = %lld: with the %lld samples of %lld tokens this "
                                 "run reads after it, more than 2^62 tokens (a damaged or edited file?)",
                                 path.c_str(), static_cast<long long>(meta.samples_consumed),
                                 static_cast<long long>(to_come), static_cast<long long>(per_sample)));
    }
    if (log_.rank() == 0 && dataset_ != nullptr && meta.data_tokens > 0 && meta.data_tokens != dataset_->num_tokens()) {
      log_.warn(strprintf("%s: the training data held %lld tokens when step %lld was written and holds %lld now (%s): "
                          "the run goes on, but its samples are drawn from the new data in a new order, not as the "
                          "run before the checkpoint would have drawn them",
                          path.c_str(), static_cast<long long>(meta.data_tokens), static_cast<long long>(meta.step),
                          static_cast<long long>(dataset_->num_tokens()), dataset_->describe().c_str()));
    }
    rt.set_optimizer_t(meta.optimizer_step);
    samples_ = meta.samples_consumed;
    log_.info(strprintf("resumed from %s: step %lld, %lld samples consumed, written with %s, read with %s [%.2f s]",
                        path.c_str(), static_cast<long long>(meta.step), static_cast<long long>(meta.samples_consumed),
                        meta.layout.c_str(), plan_summary(plan_).c_str(), seconds_since(t0)));
    return meta.step;
  }

  // Saves step `step`'s state, after finishing a background write in flight. background:
  // the run goes on, so a background writer (where set up) may write it; returns the
  // checkpoint's path, "" for one written in the background (reported when finished).
  std::string save(Runtime& rt, std::int64_t step, bool background = false) {
    finish_background();
    const auto t0 = std::chrono::steady_clock::now();
    if (background && background_ != nullptr) {
      refuse_nonfinite(rt, step, background_->take_snapshot(rt.state().layout(), rt.state()));
      background_->start(meta_of(rt, step), deck_.checkpoint.dir, deck_.checkpoint.keep);
      const std::int64_t bytes = background_->snapshot_bytes();
      background_step_ = step;
      log_.info(strprintf("checkpoint: step %lld copied to host memory in %.2f s (%s on rank 0); writing it to %s "
                          "in the background",
                          static_cast<long long>(step), seconds_since(t0), human_bytes(static_cast<double>(bytes)).c_str(),
                          deck_.checkpoint.dir.c_str()));
      return "";
    }
    log_.info(strprintf("checkpoint: writing step %lld to %s ...", static_cast<long long>(step),
                        deck_.checkpoint.dir.c_str()));
    // HDF5's collective file operations cannot poll; a watchdog bounds them instead.
    const BlockingSection section(strprintf("the other ranks to write the checkpoint of step %lld",
                                            static_cast<long long>(step)));
    CheckpointWriter writer(deck_.checkpoint.dir, step, comm_);
    write_model_state(writer, rt.state().layout(), rt.state());
    refuse_nonfinite(rt, step, writer.first_nonfinite());
    double bytes = static_cast<double>(writer.bytes_written());
    rt.grid().world().allreduce(&bytes, 1, ReduceOp::sum);
    const std::string path = writer.commit(meta_of(rt, step), deck_.checkpoint.keep);
    const double s = seconds_since(t0);
    log_.info(strprintf("checkpoint: %s written in %.2f s (%s, %.0f MB/s)", path.c_str(), s, human_bytes(bytes).c_str(),
                        bytes / s / 1e6));
    return path;
  }

  // A diverged model must not replace the last good checkpoint. tensor: this rank's first
  // with a value that is not finite, "" if none; collective.
  void refuse_nonfinite(Runtime& rt, std::int64_t step, const std::string& tensor) {
    double nonfinite = tensor.empty() ? 0.0 : 1.0;
    rt.grid().world().allreduce(&nonfinite, 1, ReduceOp::max);
    if (nonfinite == 0.0) return;
    throw RunError(strprintf("step %lld: the model holds values that are not finite%s; the checkpoint is not "
                             "written (the last one in %s is kept): resume from it with a lower optimizer.lr",
                             static_cast<long long>(step), tensor.empty() ? "" : (" (" + tensor + ")").c_str(),
                             deck_.checkpoint.dir.c_str()));
  }

  CheckpointMeta meta_of(Runtime& rt, std::int64_t step) const {
    CheckpointMeta meta;
    meta.step = step;
    meta.samples_consumed = samples_;
    meta.optimizer_step = rt.optimizer_t();
    meta.seed = deck_.train.seed;
    meta.deck = deck_.resolved_toml;
    meta.layout = plan_summary(plan_);
    meta.model = model_signature(deck_.model);
    meta.data_tokens = dataset_ != nullptr ? dataset_->num_tokens() : 0;
    return meta;
  }

  std::vector<std::unique_ptr<DirectoryLock>> locks_;
  std::string resume_path_;  // checkpoint.resume resolved
  const Deck& deck_;
  Plan plan_;
  const Log& log_;
  MPI_Comm comm_;
  MemoryTracker tracker_;
  std::unique_ptr<TokenDataset> dataset_;
  std::unique_ptr<SequenceSampler> sampler_;
  std::unique_ptr<TokenDataset> eval_dataset_;
  std::unique_ptr<SequenceSampler> eval_sampler_;
  // Its writer touches only its own copy and communicator, so it may outlive the run's
  // runtime; it is destroyed (finishing its write) before the directory locks.
  std::unique_ptr<BackgroundCheckpoint> background_;
  std::int64_t background_step_ = 0;  // the step it writes
  std::int64_t eval_batches_ = 0;
  MetricsWriter metrics_;
  std::int64_t positions_per_step_ = 0;
  std::int64_t samples_ = 0;
  double peak_tflops_ = 0.0;
};

}  // namespace

TrainSummary run_training(const Deck& deck, const Log& log, MPI_Comm comm) { return Trainer(deck, log, comm).run(); }

double run_evaluation(const Deck& deck, const Log& log, MPI_Comm comm) {
  return Trainer(deck, log, comm).run(true).final_loss;
}

void check_deck(const Deck& deck, const Log& log, int world) {
  log.info("resolved deck (" + deck.source + "):\n" + deck.resolved_toml);
  // Run alone, --check validates a deck for any number of ranks; under mpirun, for those.
  const Plan plan = plan_from_deck(deck, world > 1 ? world : 0);
  log.info(describe(plan));
  const MemoryEstimate estimate = estimate_memory(deck.model, plan, RunExtras::of(deck.checkpoint, deck.output));
  log.info(format_memory_estimate(estimate));
  if (const std::string warning = check_memory(plan, estimate, deck.source, MPI_COMM_WORLD); !warning.empty()) {
    log.warn(warning);
  }
  const Schedule schedule = Schedule::build(step_spec(plan, deck.model));
  log.info(strprintf("schedule: %s; %s", schedule.name().c_str(), schedule.partition().describe().c_str()));
  for (int s = 0; s < schedule.stages(); ++s) {
    log.debug(strprintf("stage %d program: %s", s, schedule.describe(s).c_str()));
  }
  const RaceCheck races = check_races(plan, deck.model, schedule);
  log.info(strprintf("instruction lists: race-free (%zu instructions of %d stage(s) and their optimizer programs "
                     "checked)",
                     races.instructions, races.stages));
  check_output_dirs(deck);
  auto ds = open_dataset(deck.data, deck.model.vocab_size, deck.train.seed);
  sampler_of(*ds, deck, "data.path", deck.data.paths, deck.data.shuffle);
  log.info("data: " + ds->describe());
  if (!deck.data.eval_paths.empty()) {  // a missing held-out file would end the run at its first evaluation
    DataConfig eval = deck.data;
    eval.paths = eval.eval_paths;
    log.info("eval data: " + open_dataset(eval, deck.model.vocab_size, deck.train.seed)->describe());
  }
  if (!deck.checkpoint.resume.empty()) {
    const std::string path = resolve_checkpoint(deck.checkpoint.resume, deck.checkpoint.dir);
    const CheckpointReader reader(path, MPI_COMM_SELF);
    log.info(strprintf("resume: %s (step %lld)", path.c_str(), static_cast<long long>(reader.meta().step)));
  } else if (!deck.model.init.empty()) {
    const auto source = open_weights(deck.model.init);
    check_weights_model(*source, deck.model);
    log.info("initial weights: " + deck.model.init + " (" + source->describe() + ")");
  }
  log.info("deck OK");
}

}  // namespace lamina
