#include "lamina/train/trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/json.hpp"
#include "lamina/io/checkpoint.hpp"
#include "lamina/io/metrics_writer.hpp"
#include "lamina/io/sampler.hpp"
#include "lamina/io/token_dataset.hpp"
#include "lamina/model/flops.hpp"
#include "lamina/optim/lr_schedule.hpp"
#include "lamina/train/engine.hpp"
#include "lamina/train/generate.hpp"
#include "lamina/train/machine.hpp"
#include "lamina/train/memory_estimate.hpp"

namespace lamina {

namespace fs = std::filesystem;

namespace {

using Exec = Kokkos::DefaultExecutionSpace;

// Tokens of the corpus shown to the unigram-entropy yardstick (enough for a stable value).
constexpr std::int64_t kEntropySampleTokens = 1 << 24;

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

std::string model_signature(const ModelConfig& m) {
  return strprintf("layers=%lld d_model=%lld heads=%lld seq_len=%lld vocab_size=%lld", static_cast<long long>(m.layers),
                   static_cast<long long>(m.d_model), static_cast<long long>(m.heads),
                   static_cast<long long>(m.seq_len), static_cast<long long>(m.vocab_size));
}

std::string layout_string(const ParallelConfig& p) {
  return strprintf("dp=%lld tp=%lld pp=%lld zero=%lld", static_cast<long long>(p.dp), static_cast<long long>(p.tp),
                   static_cast<long long>(p.pp), static_cast<long long>(p.zero));
}

// Features whose deck keys exist but whose runtime is not in this build yet.
void require_supported(const Deck& deck, int world) {
  const ParallelConfig& p = deck.parallel;
  if (p.dp * p.tp * p.pp != world) {
    throw InputError(strprintf("%s: parallel.dp x tp x pp = %lld x %lld x %lld = %lld, but the job has %d rank(s); "
                               "start it with mpirun -np %lld, or change the parallel section",
                               deck.source.c_str(), static_cast<long long>(p.dp), static_cast<long long>(p.tp),
                               static_cast<long long>(p.pp), static_cast<long long>(p.dp * p.tp * p.pp), world,
                               static_cast<long long>(p.dp * p.tp * p.pp)));
  }
  if (world > 1) {
    throw InputError(deck.source + ": multi-rank training (parallel.dp/tp/pp > 1) is not part of this build yet; "
                                   "run with one rank");
  }
  if (p.layered) {
    throw InputError(deck.source + ": parallel.layered = true (layered gradient accumulation) is not part of this "
                                   "build yet");
  }
}

// Keeps the lines of metrics.jsonl up to `step` (inclusive): a resumed run replaces
// whatever the interrupted run logged after its last checkpoint.
void truncate_metrics(const std::string& path, std::int64_t step) {
  std::ifstream in(path);
  if (!in) return;
  std::vector<std::string> keep;
  std::string line;
  while (std::getline(in, line)) {
    const auto pos = line.find("\"step\": ");
    if (pos == std::string::npos) continue;
    if (std::atoll(line.c_str() + pos + 8) <= step) keep.push_back(line);
  }
  in.close();
  std::ofstream out(path, std::ios::trunc);
  for (const auto& l : keep) out << l << '\n';
}

class Trainer {
 public:
  Trainer(const Deck& deck, const Log& log, MPI_Comm comm) : deck_(deck), log_(log), comm_(comm) {}

  TrainSummary run() {
    int world = 1, rank = 0;
    MPI_Comm_size(comm_, &world);
    MPI_Comm_rank(comm_, &rank);
    require_supported(deck_, world);
    const auto& d = deck_.data;
    const auto& m = deck_.model;
    n_micro_ = d.batch_size / (d.micro_batch_size * deck_.parallel.dp);
    positions_per_step_ = d.batch_size * m.seq_len;

    log_.info("resolved deck (" + deck_.source + "):\n" + deck_.resolved_toml);
    const MemoryEstimate estimate = estimate_memory(deck_);
    check_memory_budget(deck_, estimate);
    log_.info(format_memory_estimate(estimate));

    std::error_code ec;
    fs::create_directories(deck_.output.dir, ec);
    if (ec) throw RunError(deck_.output.dir + ": cannot create the output directory: " + ec.message());
    {
      std::ofstream out(deck_.output.dir + "/deck.resolved.toml");
      out << "# resolved from " << deck_.source << "\n" << deck_.resolved_toml;
    }

    open_data();
    Engine<Exec> engine(tracker_, m, deck_.optimizer, d.micro_batch_size);
    const ParamLayout& layout = engine.layout();
    log_.info(strprintf("model: GPT-2, %s parameters (%s), %lld flat buffers, %zu optimizer subgroups of <= %lld",
                        human_count(static_cast<double>(layout.total_numel())).c_str(), model_signature(m).c_str(),
                        static_cast<long long>(layout.num_layers()), engine.optimizer().subgroups().size(),
                        static_cast<long long>(deck_.optimizer.subgroup_size)));
    log_.info(strprintf("batch: %lld sequences x %lld tokens per step = %lld micro-batch(es) of %lld",
                        static_cast<long long>(d.batch_size), static_cast<long long>(m.seq_len),
                        static_cast<long long>(n_micro_), static_cast<long long>(d.micro_batch_size)));

    std::int64_t start_step = 0;
    samples_ = 0;
    if (!deck_.checkpoint.resume.empty()) {
      start_step = resume(engine);
    } else {
      engine.init_params(deck_.train.seed);
    }
    TrainSummary summary;
    summary.first_step = start_step;
    summary.last_step = start_step;
    if (start_step >= deck_.train.steps) {
      log_.info(strprintf("the checkpoint is at step %lld and train.steps = %lld: nothing to do",
                          static_cast<long long>(start_step), static_cast<long long>(deck_.train.steps)));
      return summary;
    }

    const std::string metrics_path = deck_.output.dir + "/metrics.jsonl";
    if (rank == 0) {
      if (start_step > 0) truncate_metrics(metrics_path, start_step);
      metrics_ = MetricsWriter(metrics_path, start_step > 0);
    }
    measure_peak();

    const double flops_per_step = training_flops_per_token(m) * static_cast<double>(positions_per_step_);
    std::vector<std::int32_t> inputs(static_cast<std::size_t>(d.micro_batch_size * m.seq_len)),
        targets(inputs.size()), window(static_cast<std::size_t>(m.seq_len + 1));
    const auto run_start = std::chrono::steady_clock::now();
    double total_ms = 0.0, best_loss = INFINITY;
    std::int64_t skipped = 0, timed = 0;
    for (std::int64_t step = start_step; step < deck_.train.steps; ++step) {
      const auto t0 = std::chrono::steady_clock::now();
      engine.zero_grads();
      double loss_sum = 0.0;
      const float scale = static_cast<float>(1.0 / static_cast<double>(positions_per_step_));
      for (std::int64_t mb = 0; mb < n_micro_; ++mb) {
        load_micro_batch(samples_ + mb * d.micro_batch_size, inputs, targets, window);
        engine.load_tokens(inputs.data(), targets.data());
        loss_sum += engine.forward_backward(scale);
      }
      const double loss = loss_sum / static_cast<double>(positions_per_step_);
      const double gnorm = engine.grad_norm();
      const double lr = learning_rate(deck_.optimizer, step, deck_.train.steps);
      const bool finite = std::isfinite(loss) && std::isfinite(gnorm);
      if (!finite) {
        const std::string what = strprintf("step %lld: %s is not finite (loss %g, gradient norm %g)",
                                           static_cast<long long>(step + 1), std::isfinite(loss) ? "the gradient" : "the loss",
                                           loss, gnorm);
        if (!deck_.train.skip_nonfinite) {
          throw RunError(what + "; lower optimizer.lr, raise optimizer.warmup_steps or set optimizer.grad_clip "
                                "(train.skip_nonfinite = true skips such steps)");
        }
        log_.warn(what + ": step skipped (train.skip_nonfinite)");
        ++skipped;
      } else {
        engine.optimizer_step(lr, clip_coefficient(gnorm, deck_.optimizer.grad_clip));
      }
      Exec().fence();
      const double step_ms = seconds_since(t0) * 1e3;
      samples_ += d.batch_size;
      total_ms += step_ms;
      ++timed;
      if (finite) best_loss = std::min(best_loss, loss);
      summary.final_loss = loss;
      summary.last_step = step + 1;
      const bool last = step + 1 == deck_.train.steps;
      if ((step + 1) % deck_.output.log_every == 0 || last || step == start_step) {
        report(step + 1, loss, lr, gnorm, step_ms, flops_per_step, !finite, world);
      }
      const bool periodic = deck_.checkpoint.every > 0 && (step + 1) % deck_.checkpoint.every == 0;
      if (periodic || (last && deck_.checkpoint.save_final)) save(engine, step + 1);
    }
    summary.mean_step_ms = total_ms / static_cast<double>(std::max<std::int64_t>(1, timed));
    if (deck_.output.sample_tokens > 0) print_sample(engine, summary.last_step);
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
  void open_data() {
    const auto t0 = std::chrono::steady_clock::now();
    dataset_ = open_dataset(deck_.data, deck_.model.vocab_size, deck_.train.seed);
    sampler_ = std::make_unique<SequenceSampler>(dataset_->num_tokens(), deck_.model.seq_len, deck_.train.seed,
                                                 deck_.data.shuffle);
    std::string line = "data: " + dataset_->describe() +
                       strprintf(", %s windows of %lld+1 tokens", human_count(static_cast<double>(sampler_->num_windows())).c_str(),
                                 static_cast<long long>(deck_.model.seq_len));
    if (deck_.data.format != DataFormat::synthetic && deck_.model.vocab_size <= (1 << 24)) {
      const double h = unigram_entropy(*dataset_, deck_.model.vocab_size, kEntropySampleTokens);
      line += strprintf("; unigram entropy %.3f nats (a model ignoring context cannot beat it), uniform %.3f", h,
                        std::log(static_cast<double>(deck_.model.vocab_size)));
    }
    log_.info(line + strprintf(" [%.2f s]", seconds_since(t0)));
  }

  void load_micro_batch(std::int64_t first_sample, std::vector<std::int32_t>& inputs,
                        std::vector<std::int32_t>& targets, std::vector<std::int32_t>& window) const {
    const std::int64_t T = deck_.model.seq_len;
    for (std::int64_t s = 0; s < deck_.data.micro_batch_size; ++s) {
      dataset_->read(sampler_->window_start(first_sample + s), T + 1, window.data());
      std::copy(window.begin(), window.end() - 1, inputs.begin() + s * T);
      std::copy(window.begin() + 1, window.end(), targets.begin() + s * T);
    }
  }

  // A prompt from the data (the next unseen window's first half) and the model's
  // continuation, so that what a byte-level model has learnt can be read.
  void print_sample(Engine<Exec>& engine, std::int64_t step) {
    const std::int64_t T = deck_.model.seq_len;
    std::vector<std::int32_t> prompt(static_cast<std::size_t>(T / 2));
    dataset_->read(sampler_->window_start(samples_), T / 2, prompt.data());
    const auto out = generate_tokens(engine, tracker_, deck_.model, prompt, deck_.output.sample_tokens,
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
    peak_tflops_ = measure_gemm_gflops(1536, 3).best / 1e3;
    log_.info(strprintf("peak for MFU: %.3f TFLOP/s per rank (measured float GEMM, 1536^3; set output.peak_tflops "
                        "to use a datasheet value)",
                        peak_tflops_));
  }

  void report(std::int64_t step, double loss, double lr, double gnorm, double step_ms, double flops_per_step,
              bool skipped, int world) {
    const double tokens_per_s = static_cast<double>(positions_per_step_) / (step_ms / 1e3);
    const double tflops = flops_per_step / (step_ms / 1e3) / world / 1e12;
    const double mfu = peak_tflops_ > 0 ? tflops / peak_tflops_ : 0.0;
    std::string mem;
    for (const auto& kv : tracker_.peak_by_space()) {
      mem += strprintf(" | %s %s", kv.first.c_str(), human_bytes(static_cast<double>(kv.second)).c_str());
    }
    log_.info(strprintf("step %*lld/%lld | loss %.4f | lr %.2e | gnorm %.3f | %.1f ms | %s tok/s | %.3f TFLOP/s | "
                        "MFU %.1f%%%s%s",
                        static_cast<int>(std::to_string(deck_.train.steps).size()), static_cast<long long>(step),
                        static_cast<long long>(deck_.train.steps), loss, lr, gnorm, step_ms,
                        human_count(tokens_per_s).c_str(), tflops, 100.0 * mfu, mem.c_str(),
                        skipped ? " | SKIPPED" : ""));
    if (!metrics_.is_open()) return;
    JsonObject j;
    j.add("step", step)
        .add("loss", loss)
        .add("lr", lr)
        .add("grad_norm", gnorm)
        .add("step_ms", step_ms)
        .add("tokens_per_s", tokens_per_s)
        .add("tflops_per_rank", tflops)
        .add("mfu", mfu)
        .add("mem_peak_bytes", tracker_.peak_by_space());
    JsonObject by_cat;
    for (const auto& [space, cats] : tracker_.peak_by_category()) by_cat.add(space, cats);
    j.add("mem_peak_by_category", by_cat);
    if (skipped) j.add("skipped", true);
    metrics_.write(j);
  }

  std::int64_t resume(Engine<Exec>& engine) {
    const std::string path = resolve_checkpoint(deck_.checkpoint.resume, deck_.checkpoint.dir);
    const CheckpointMeta meta = read_checkpoint_meta(path, comm_);
    if (meta.model != model_signature(deck_.model)) {
      throw InputError(path + ": the checkpoint holds a model with " + meta.model + ", the deck asks for " +
                       model_signature(deck_.model));
    }
    if (meta.seed != deck_.train.seed) {
      log_.warn(strprintf("the checkpoint was written with train.seed = %llu, the deck has %llu: the data order "
                          "after the restart differs from an uninterrupted run",
                          static_cast<unsigned long long>(meta.seed), static_cast<unsigned long long>(deck_.train.seed)));
    }
    std::vector<typename Vec<Exec>::HostMirror> host;
    const auto slabs = engine.checkpoint_slabs(host, false);
    read_checkpoint_tensors(path, slabs, comm_);
    engine.restore_from_host(host);
    engine.optimizer().set_t(meta.optimizer_step);
    samples_ = meta.samples_consumed;
    log_.info(strprintf("resumed from %s: step %lld, %lld samples consumed, written with %s", path.c_str(),
                        static_cast<long long>(meta.step), static_cast<long long>(meta.samples_consumed),
                        meta.layout.c_str()));
    return meta.step;
  }

  void save(Engine<Exec>& engine, std::int64_t step) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<typename Vec<Exec>::HostMirror> host;
    const auto slabs = engine.checkpoint_slabs(host, true);
    std::int64_t bytes = 0;
    for (const auto& s : slabs) {
      std::int64_t n = 4;
      for (const auto c : s.count) n *= c;
      bytes += n;
    }
    log_.info(strprintf("checkpoint: writing step %lld (%zu tensors, %s) to %s ...", static_cast<long long>(step),
                        slabs.size(), human_bytes(static_cast<double>(bytes)).c_str(), deck_.checkpoint.dir.c_str()));
    CheckpointMeta meta;
    meta.step = step;
    meta.samples_consumed = samples_;
    meta.optimizer_step = engine.optimizer().t();
    meta.seed = deck_.train.seed;
    meta.deck = deck_.resolved_toml;
    meta.layout = layout_string(deck_.parallel);
    meta.model = model_signature(deck_.model);
    const std::string path = write_checkpoint(deck_.checkpoint.dir, meta, slabs, deck_.checkpoint.keep, comm_);
    const double s = seconds_since(t0);
    log_.info(strprintf("checkpoint: %s written in %.2f s (%.0f MB/s)", path.c_str(), s, bytes / s / 1e6));
  }

  const Deck& deck_;
  const Log& log_;
  MPI_Comm comm_;
  MemoryTracker tracker_;
  std::unique_ptr<TokenDataset> dataset_;
  std::unique_ptr<SequenceSampler> sampler_;
  MetricsWriter metrics_;
  std::int64_t n_micro_ = 1;
  std::int64_t positions_per_step_ = 0;
  std::int64_t samples_ = 0;
  double peak_tflops_ = 0.0;
};

}  // namespace

TrainSummary run_training(const Deck& deck, const Log& log, MPI_Comm comm) { return Trainer(deck, log, comm).run(); }

void check_deck(const Deck& deck, const Log& log) {
  log.info("resolved deck (" + deck.source + "):\n" + deck.resolved_toml);
  const MemoryEstimate estimate = estimate_memory(deck);
  log.info(format_memory_estimate(estimate));
  check_memory_budget(deck, estimate);
  auto ds = open_dataset(deck.data, deck.model.vocab_size, deck.train.seed);
  SequenceSampler sampler(ds->num_tokens(), deck.model.seq_len, deck.train.seed, deck.data.shuffle);
  log.info("data: " + ds->describe());
  if (!deck.checkpoint.resume.empty()) {
    const std::string path = resolve_checkpoint(deck.checkpoint.resume, deck.checkpoint.dir);
    const CheckpointMeta meta = read_checkpoint_meta(path, MPI_COMM_SELF);
    log.info(strprintf("resume: %s (step %lld)", path.c_str(), static_cast<long long>(meta.step)));
  }
  log.info("deck OK");
}

}  // namespace lamina
