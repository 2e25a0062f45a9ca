// The `lamina` command. Thin: parses the command line, brings up MPI and Kokkos, calls
// into the library, and turns exceptions into messages and exit codes
// (0 success, 1 internal error, 2 bad input, 3 the run failed, 128 + signal: stopped by a
// signal after saving).
#include <mpi.h>

#include <CLI/CLI.hpp>
#include <Kokkos_Core.hpp>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "lamina/comm/mpi_communicator.hpp"
#include "lamina/core/bounded_wait.hpp"
#include "lamina/core/deck.hpp"
#if defined(LAMINA_HAVE_NCCL)
#include "lamina/comm/nccl_communicator.hpp"
#endif
#include "lamina/core/error.hpp"
#include "lamina/core/format.hpp"
#include "lamina/core/log.hpp"
#include "lamina/core/stop_signal.hpp"
#include "lamina/core/system_memory.hpp"
#include "lamina/io/directory_lock.hpp"
#include "lamina/io/hdf5_file.hpp"
#include "lamina/io/model_weights.hpp"
#include "lamina/kernels/host_blas.hpp"
#include "lamina/train/bench.hpp"
#include "lamina/train/deck_agreement.hpp"
#include "lamina/train/plan_command.hpp"
#include "lamina/train/profile.hpp"
#include "lamina/train/trainer.hpp"
#include "lamina/train/verify.hpp"

namespace {

struct Options {
  std::string deck, reference, attention = "auto";
  std::string convert_in, convert_out, convert_to, dtype = "fp32", max_shard = "0";
  std::int64_t heads = 0;
  std::vector<std::string> sets;
  bool check = false, verbose = false, quiet = false, force = false;
  double tolerance = 1e-4;
  int steps = 10, warmup = 2, reps = 20;
  std::int64_t params = 1 << 24;
  std::string write;
  lamina::PlanCommand plan;
  std::string solver = "dp";
};

// What a deck says of the communicators, before the first is made.
void apply_comm(const lamina::Deck& deck) {
  lamina::set_wait_timeout(deck.comm.timeout);
  lamina::set_mpi_device_buffers(lamina::mpi_device_buffers_from_env(deck.comm.mpi_device_buffers));
}

std::string build_info() {
  std::string comm = "MPI";
#if defined(LAMINA_HAVE_NCCL)
  comm += " + " + lamina::nccl_backend_info();
#endif
  return lamina::strprintf("lamina %s, Kokkos %d.%d.%d (%s), %s, %s", LAMINA_VERSION, KOKKOS_VERSION / 10000,
                           KOKKOS_VERSION / 100 % 100, KOKKOS_VERSION % 100, Kokkos::DefaultExecutionSpace::name(),
                           comm.c_str(), LAMINA_BUILD_INFO);
}

// CLI::NonNegativeNumber lets NaN through (NaN < 0 is false), and a NaN or infinite
// tolerance would make every comparison pass or fail whatever the numbers.
const CLI::Validator kFiniteNonNegative(
    [](std::string& s) {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      const bool ok = end != s.c_str() && *end == '\0' && std::isfinite(v) && v >= 0.0;
      return ok ? std::string() : "must be a finite number >= 0, got " + s;
    },
    "FINITE >= 0");

// CLI11's PositiveNumber names its range with a 309-digit bound; these name the rule.
CLI::Validator whole_number(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& s) {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(s.c_str(), &end, 10);
        const bool ok = end != s.c_str() && *end == '\0' && errno == 0 && v >= lo && v <= hi;
        return ok ? std::string() : lamina::strprintf("must be a whole number from %lld to %lld, got %s", lo, hi, s.c_str());
      },
      lamina::strprintf("INT in [%lld, %lld]", lo, hi));
}
const CLI::Validator kPositiveCount = whole_number(1, INT_MAX);
const CLI::Validator kPositiveFinite(
    [](std::string& s) {
      char* end = nullptr;
      const double v = std::strtod(s.c_str(), &end);
      const bool ok = end != s.c_str() && *end == '\0' && std::isfinite(v) && v > 0.0;
      return ok ? std::string() : "must be a finite number > 0, got " + s;
    },
    "FINITE > 0");

// `lamina bench dos` without a deck: the model and batch of inputs/bench-torch.toml (the
// optimizer's hyperparameters do not change its timings).
const char* kDosDeck = R"([model]
layers = 6
d_model = 384
heads = 6
seq_len = 256
vocab_size = 8192
[data]
format = "synthetic"
batch_size = 4
[train]
steps = 10
[optimizer]
subgroup_size = 1048576
)";

// Thread-pool settings that are known to halve throughput, said once at start-up.
// Sets up the host's thread pools and warns where the environment will cost speed; returns
// the line that says what they are.
std::string configure_host_threads(const lamina::Log& log, int rank) {
  std::string warning;
  const std::string threads = lamina::configure_host_blas(warning, lamina::ranks_on_node(MPI_COMM_WORLD));
  MPI_Comm parent = MPI_COMM_NULL;
  MPI_Comm_get_parent(&parent);
  // The same environment on every rank; ranks `lamina plan` started set theirs once joined.
  if (rank != 0 || parent != MPI_COMM_NULL) return threads;
  if (!warning.empty()) log.warn(warning);
  // Under Kokkos OpenMP the BLAS runs inside Kokkos' threads, which may be pinned.
  const char* bind = std::string(Kokkos::DefaultHostExecutionSpace::name()) == "OpenMP" ? nullptr
                                                                                        : std::getenv("OMP_PROC_BIND");
  if (bind != nullptr && std::string(bind) != "false" && std::string(bind) != "FALSE") {
    log.warn(std::string("OMP_PROC_BIND=") + bind + " pins the BLAS threads to one core each and can halve GEMM "
             "throughput; unset it or set OMP_PROC_BIND=false");
  }
  if (const std::string wait = lamina::openmp_wait_warning(); !wait.empty()) log.warn(wait);
  return threads;
}

int run_verify(const Options& o, const lamina::Log& log) {
  std::optional<lamina::AttentionProducts> attention;
  for (const auto a : {lamina::AttentionProducts::in_place, lamina::AttentionProducts::staged,
                       lamina::AttentionProducts::fused}) {
    if (o.attention == lamina::attention_products_name(a)) attention = a;
  }
  const lamina::VerifyReport r = lamina::verify_reference(o.reference, attention);
  log.info(lamina::strprintf("verify %s: loss %.8f, reference %.8f", r.path.c_str(), r.loss, r.reference_loss));
  int bad = 0;
  for (const auto& item : r.items) {
    const bool ok = item.rel_error <= o.tolerance;
    bad += ok ? 0 : 1;
    if (!ok || o.verbose) {
      log.info(lamina::strprintf("  %-44s rel. error %.3e%s", item.what.c_str(), item.rel_error, ok ? "" : "  FAIL"));
    }
  }
  log.info(lamina::strprintf("%zu quantities compared, max relative error %.3e (tolerance %.1e): %s", r.items.size(),
                             r.max_rel_error(), o.tolerance, bad ? "FAIL" : "PASS"));
  if (bad) {
    throw lamina::RunError(lamina::strprintf("%d of %zu quantities exceed the tolerance %.1e", bad, r.items.size(),
                                             o.tolerance));
  }
  return 0;
}

// "5GB", "500MB", "2GiB" or a number of bytes (HuggingFace's spellings: GB = 10^9).
std::int64_t parse_bytes(const std::string& text) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  const std::string unit = end != nullptr ? end : "";
  const std::vector<std::pair<std::string, double>> units = {
      {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}};
  for (const auto& [u, f] : units) {
    if (unit == u && end != text.c_str() && errno == 0 && std::isfinite(v) && v >= 0 && v * f < 9e18) {
      return static_cast<std::int64_t>(v * f);
    }
  }
  throw lamina::InputError("--max-shard-size: '" + text + "' is not a size (e.g. 5GB, 500MB, 2GiB)");
}

// Where convert may write `out`: never onto its input (nor a directory holding it, nor into
// an input directory), over an existing output only with --force, and never into a
// directory a running job holds (its lamina.lock). Returns the hold on that directory, kept
// while writing so that no job starts there meanwhile.
std::unique_ptr<lamina::DirectoryLock> claim_convert_output(const Options& o) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path in = fs::weakly_canonical(o.convert_in, ec), out = fs::weakly_canonical(o.convert_out, ec);
  const auto inside = [](const fs::path& a, const fs::path& b) {  // a is b or lies under it
    const fs::path rel = a.lexically_relative(b);
    return !rel.empty() && *rel.begin() != "..";
  };
  if (inside(in, out) || inside(out, in)) {
    throw lamina::InputError("convert: " + o.convert_out + " would write onto the input " + o.convert_in +
                             "; write to another path");
  }
  if (fs::exists(fs::symlink_status(o.convert_out, ec)) && !o.force &&
      !(fs::is_directory(o.convert_out, ec) && fs::is_empty(o.convert_out, ec))) {
    throw lamina::InputError("convert: " + o.convert_out + " exists; give --force to replace it");
  }
  const fs::path dir = fs::is_directory(out, ec) ? out : out.parent_path();
  if (!fs::exists(dir / "lamina.lock", ec)) return nullptr;
  return std::make_unique<lamina::DirectoryLock>(dir.string(), "convert's output directory");
}

// "unknown command 'frobnicate' (did you mean ...?); the commands: ..." where the first
// word that names a command (of lamina, or of the command it follows) names none; else "".
std::string unknown_command(const CLI::App& app, const std::vector<char*>& args) {
  const CLI::App* level = &app;
  std::string path = "lamina";
  for (std::size_t i = 1; i < args.size(); ++i) {
    const std::string word = args[i];
    if (word.empty() || word[0] == '-') return "";  // options come after the command words
    const auto subs = level->get_subcommands([](const CLI::App*) { return true; });
    if (subs.empty()) return "";
    const CLI::App* next = nullptr;
    std::vector<std::string> names;
    for (const CLI::App* c : subs) {
      if (c->get_name() == word) next = c;
      names.push_back(c->get_name());
    }
    if (next == nullptr) {
      const std::string best = lamina::closest(word, names);
      std::string list;
      for (const auto& n : names) list += (list.empty() ? "" : ", ") + n;
      return "error: " + path + ": unknown command '" + word + "'" +
             (best.empty() ? "" : " (did you mean '" + best + "'?)") + "; the commands: " + list;
    }
    level = next;
    path += " " + word;
  }
  return "";
}

int run_convert(const Options& o, const lamina::Log& log) {
  const auto t0 = std::chrono::steady_clock::now();
  const auto hold = claim_convert_output(o);
  const auto source = lamina::open_weights(o.convert_in);
  log.info("read " + o.convert_in + ": " + source->describe());
  lamina::ModelConfig model = source->model();
  if (model.heads == 0 && o.heads == 0) {
    throw lamina::InputError(o.convert_in + " does not say how many attention heads the model has (no config.json "
                             "beside it): give --heads (GPT-2: 12 for 124M, 16 for 355M, 20 for 774M, 25 for 1.5B)");
  }
  if (o.heads != 0 && model.heads != 0 && o.heads != model.heads) {
    throw lamina::InputError(lamina::strprintf("--heads %lld, but %s says %lld", static_cast<long long>(o.heads),
                                               o.convert_in.c_str(), static_cast<long long>(model.heads)));
  }
  if (model.heads == 0) model.heads = o.heads;
  if (model.d_model % model.heads != 0) {
    throw lamina::InputError(lamina::strprintf("--heads %lld does not divide the width %lld", static_cast<long long>(model.heads),
                                               static_cast<long long>(model.d_model)));
  }
  lamina::WeightsOutput out;
  out.format = o.convert_to.empty()    ? lamina::weights_format_of(o.convert_out)
               : o.convert_to == "lamina" ? lamina::WeightsFormat::lamina
               : o.convert_to == "llmc"   ? lamina::WeightsFormat::llmc
                                          : lamina::WeightsFormat::huggingface;
  lamina::parse_stored_float(o.dtype, out.type);
  out.max_shard_bytes = parse_bytes(o.max_shard);
  {  // The directory an output file goes in is made, as a HuggingFace output directory is.
    const std::filesystem::path parent = std::filesystem::path(o.convert_out).parent_path();
    std::error_code ec;
    if (!parent.empty()) std::filesystem::create_directories(parent, ec);
    if (ec) throw lamina::RunError(parent.string() + ": cannot create the output's directory: " + ec.message());
  }
  const auto files = lamina::write_weights(o.convert_out, *source, model, out);
  std::string list;
  for (const auto& f : files) list += "\n  " + f;
  log.info(lamina::strprintf("wrote %s (%s) in %.2f s:%s", lamina::weights_format_name(out.format), o.dtype.c_str(),
                             std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), list.c_str()));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  lamina::watch_host_allocations();
  // Kokkos' own options (--kokkos-...) go to Kokkos, the rest to the command-line parser.
  std::vector<char*> kokkos_args = {argv[0]}, app_args;
  for (int i = 0; i < argc; ++i) {
    if (i > 0 && std::string(argv[i]).rfind("--kokkos-", 0) == 0) {
      kokkos_args.push_back(argv[i]);
    } else {
      app_args.push_back(argv[i]);
    }
  }

  Options o;
  CLI::App app{"lamina: GPT training on Kokkos, from one laptop core to many GPUs.\n"
               "Exit codes: 0 success, 1 internal error, 2 bad input (deck, data, reference, checkpoint), "
               "3 the run failed (non-finite loss, tolerance exceeded, a rank died)."};
  app.set_version_flag("--version", build_info());
  app.require_subcommand(1);
  app.add_flag("-v,--verbose", o.verbose, "print debug output");
  app.add_flag("-q,--quiet", o.quiet, "print warnings and errors only");

  auto* train = app.add_subcommand("train", "train the model a deck describes");
  train->add_option("deck", o.deck, "input deck (TOML)")->required();
  train->add_option("--set", o.sets, "override a deck key: --set section.key=value (repeatable)");
  train->add_flag("--check", o.check, "validate the deck, print it resolved with the memory estimate, and exit");

  auto* eval = app.add_subcommand("eval", "mean loss and perplexity of a deck's model on data.eval_path");
  eval->add_option("deck", o.deck, "input deck (TOML); the weights: checkpoint.resume, else model.init")->required();
  eval->add_option("--set", o.sets, "override a deck key (repeatable)");

  auto* convert = app.add_subcommand(
      "convert", "convert weights between lamina checkpoints (.h5), HuggingFace safetensors (a directory with "
                 "config.json, or a .safetensors file) and llm.c model files (.bin)");
  convert->add_option("in", o.convert_in, "weights to read; the format is recognised from the contents")->required();
  convert->add_option("out", o.convert_out, "where to write: NAME.h5 lamina, NAME.bin llm.c, else HuggingFace")
      ->required();
  convert->add_option("--to", o.convert_to, "the output format, instead of from the name")
      ->check(CLI::IsMember({"lamina", "hf", "llmc"}));
  convert->add_option("--dtype", o.dtype, "how the output stores numbers: fp32 (default), bf16, fp16 (HuggingFace)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  convert->add_option("--heads", o.heads, "attention heads, where the input does not say (a bare .safetensors file)")
      ->check(whole_number(1, 1 << 16));
  convert->add_flag("--force", o.force, "replace an existing output (never the input)");
  convert->add_option("--max-shard-size", o.max_shard,
                      "HuggingFace: split into shards of at most this size (e.g. 5GB) with an index; default one file");

  auto* verify = app.add_subcommand("verify", "check one training step against a PyTorch reference file");
  verify->add_option("--reference", o.reference, "reference file (HDF5, see docs/reference-format.md)")->required();
  verify->add_option("--tolerance", o.tolerance, "largest relative error accepted (default 1e-4)")
      ->check(kFiniteNonNegative);
  verify->add_option("--attention", o.attention, "how attention runs, as model.attention (default auto)")
      ->check(CLI::IsMember({"auto", "in_place", "staged", "fused"}));

  auto* bench = app.add_subcommand("bench", "benchmarks; the last line printed is one JSON object");
  bench->require_subcommand(1);
  auto* bench_step = bench->add_subcommand("step", "training steps of a deck's model on synthetic tokens");
  bench_step->add_option("deck", o.deck, "input deck (TOML)")->required();
  bench_step->add_option("--set", o.sets, "override a deck key (repeatable)");
  bench_step->add_option("--steps", o.steps, "timed steps (default 10)")->check(kPositiveCount);
  bench_step->add_option("--warmup", o.warmup, "untimed steps first (default 2)")->check(whole_number(0, INT_MAX));
  auto* bench_adam = bench->add_subcommand("adam", "the AdamW kernel against a stream triad");
  bench_adam->add_option("--params", o.params, "parameters to update (default 16777216)")
      ->check(whole_number(1, 1LL << 40));
  bench_adam->add_option("--reps", o.reps, "timed repetitions (default 20)")->check(kPositiveCount);
  auto* bench_machine = bench->add_subcommand("machine", "GEMM rate and memory bandwidth of this machine");
  bench_machine->add_option("--write", o.write,
                            "measure everything the planner needs (rates, links, collectives of the ranks this runs "
                            "on) and write it as a machine description");

  auto* plan = app.add_subcommand("plan", "choose the parallel layout and per-layer memory policies for a deck");
  plan->add_option("deck", o.plan.deck, "input deck (TOML); keys left unset or set to \"auto\" are searched")->required();
  plan->add_option("--set", o.plan.sets, "override a deck key (repeatable)");
  plan->add_option("--ranks", o.plan.ranks, "ranks (GPUs) to plan for (default: the deck's dp x tp x pp, else the "
                                            "ranks this runs on)")
      ->check(kPositiveCount);
  plan->add_option("--machine", o.plan.machine, "machine description (inputs/machines/*.toml); default: measure this one");
  plan->add_option("--solver", o.solver, "per-layer solver: dp (default), greedy, brute")
      ->check(CLI::IsMember({"dp", "greedy", "brute"}));
  plan->add_option("--top", o.plan.top, "plans to show (default 3)")->check(kPositiveCount);
  plan->add_option("--threads", o.plan.threads,
                   "threads of the search (default: the cores this process may use; the plans do not depend on it)")
      ->check(kPositiveCount);
  plan->add_option("--write-deck", o.plan.write_deck, "write the deck with the chosen values");
  plan->add_option("--tokens", o.plan.tokens, "tokens to train on: adds the days it takes")->check(kPositiveFinite);
  plan->add_flag("--shortest-time", o.plan.shortest_time,
                 "sweep cluster sizes up to --max-ranks: the shortest time to train on --tokens with standard "
                 "pipelines and with layered accumulation and modular pipelines, at the critical batch");
  plan->add_option("--max-ranks", o.plan.max_ranks, "largest cluster of the sweep (default 16384)")
      ->check(kPositiveCount);
  plan->add_flag("--deck-batch", o.plan.deck_batch, "sweep at the deck's data.batch_size instead of the critical batch");
  plan->add_option("--write-sweep", o.plan.write_sweep, "write the sweep as CSV (perf/plot_shortest_time.py draws it)");
  auto* bench_memory = bench->add_subcommand("memory", "predicted against measured peak memory per space and category");
  bench_memory->add_option("deck", o.deck, "input deck (TOML)")->required();
  bench_memory->add_option("--set", o.sets, "override a deck key (repeatable)");
  bench_memory->add_option("--steps", o.steps, "training steps measured (default 10)")->check(kPositiveCount);
  auto* bench_dos = bench->add_subcommand(
      "dos", "Deep Optimizer States: the performance model's inputs, then steps with the optimizer on the device, "
             "the host and dynamic");
  bench_dos->add_option("deck", o.deck, "input deck (TOML; default: the bench-torch model, 6 x 384)");
  bench_dos->add_option("--set", o.sets, "override a deck key (repeatable)");
  bench_dos->add_option("--steps", o.steps, "timed steps per placement (default 10)")->check(kPositiveCount);

  try {
    app.parse(static_cast<int>(app_args.size()), app_args.data());
  } catch (const CLI::ParseError& e) {
    if (const std::string word = unknown_command(app, app_args); !word.empty()) {
      std::fprintf(stderr, "%s\n", word.c_str());
      return static_cast<int>(lamina::ExitCode::bad_input);
    }
    const int code = app.exit(e);
    return code == 0 ? 0 : static_cast<int>(lamina::ExitCode::bad_input);
  }

  // Background checkpoints write from a thread of their own while training communicates;
  // an MPI that grants less has them written synchronously (checkpoint.async).
  int granted = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &granted);
  lamina::h5::shut_down_with_mpi();
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  lamina::Log log(rank, o.verbose ? lamina::Log::Level::debug
                        : o.quiet ? lamina::Log::Level::warn
                                  : lamina::Log::Level::info);
  int kargc = static_cast<int>(kokkos_args.size());
  int code = 0;
  bool stopped = false;
  Kokkos::initialize(kargc, kokkos_args.data());
  try {
    const std::string host_threads = configure_host_threads(log, rank);
    if (train->parsed()) {
      lamina::Deck deck = lamina::load_deck(o.deck, o.sets);
      apply_comm(deck);
      lamina::check_ranks_agree(deck, MPI_COMM_WORLD);
      if (!deck.automatic.empty()) {  // the planner chooses these keys for the ranks this runs on
        std::vector<std::string> sets = o.sets;
        for (const auto& s : lamina::plan_auto_keys(deck, log, MPI_COMM_WORLD)) sets.push_back(s);
        deck = lamina::load_deck(o.deck, sets);
      }
      if (o.check) {
        lamina::check_deck(deck, log, world);
      } else {
        log.info(build_info() + lamina::strprintf(", %d rank(s)", world));
        log.info(host_threads);
        lamina::run_training(deck, log, MPI_COMM_WORLD);
      }
    } else if (eval->parsed()) {
      const lamina::Deck deck = lamina::load_deck(o.deck, o.sets);
      apply_comm(deck);
      lamina::check_ranks_agree(deck, MPI_COMM_WORLD);
      log.info(build_info() + lamina::strprintf(", %d rank(s)", world));
      lamina::run_evaluation(deck, log, MPI_COMM_WORLD);
    } else if (convert->parsed()) {
      if (rank == 0) code = run_convert(o, log);
    } else if (verify->parsed()) {
      code = run_verify(o, log);
    } else if (bench_step->parsed()) {
      const lamina::Deck deck = lamina::load_deck(o.deck, o.sets);
      apply_comm(deck);
      log.info(host_threads);
      const auto j = lamina::bench_step(deck, o.steps, o.warmup, log);
      if (rank == 0) std::printf("%s\n", j.str().c_str());
    } else if (bench_adam->parsed()) {
      const auto j = lamina::bench_adam(o.params, o.reps, log);
      if (rank == 0) std::printf("%s\n", j.str().c_str());
    } else if (bench_machine->parsed() && !o.write.empty()) {
      lamina::MachineSpec m = lamina::measure_machine(MPI_COMM_WORLD, log);
      // Kernel efficiencies from a mid-sized block (d 512, 8 heads, 256 positions, 4 sequences).
      lamina::ModelConfig ref;
      ref.layers = 1;
      ref.d_model = 512;
      ref.heads = 8;
      ref.seq_len = 256;
      ref.vocab_size = 8192;
      lamina::calibrate(m, ref, lamina::Precision::fp32, lamina::profile_model(ref, lamina::Precision::fp32, {4}).front());
      if (rank == 0) {
        std::FILE* f = std::fopen(o.write.c_str(), "w");
        const std::string text = "# measured by `lamina bench machine --write` (" + build_info() + ")\n" +
                                 lamina::machine_toml(m);
        if (f == nullptr || std::fputs(text.c_str(), f) < 0 || std::fclose(f) != 0) {
          throw lamina::RunError(o.write + ": cannot write the machine description");
        }
        log.info("machine description written to " + o.write);
      }
    } else if (bench_machine->parsed()) {
      const auto j = lamina::bench_machine(log);
      if (rank == 0) std::printf("%s\n", j.str().c_str());
    } else if (plan->parsed()) {
      o.plan.solver = o.solver == "greedy" ? lamina::Solver::greedy
                      : o.solver == "brute" ? lamina::Solver::brute
                                            : lamina::Solver::dp;
      code = lamina::run_plan_command(o.plan, log, MPI_COMM_WORLD);
    } else if (bench_memory->parsed()) {
      const lamina::Deck deck = lamina::load_deck(o.deck, o.sets);
      apply_comm(deck);
      const auto j = lamina::bench_memory(deck, o.steps, log);
      if (rank == 0) std::printf("%s\n", j.str().c_str());
    } else if (bench_dos->parsed()) {
      const lamina::Deck deck =
          o.deck.empty() ? lamina::parse_deck(kDosDeck, "<bench dos default>", o.sets) : lamina::load_deck(o.deck, o.sets);
      apply_comm(deck);
      const auto j = lamina::bench_dos(deck, o.steps, log);
      if (rank == 0) std::printf("%s\n", j.str().c_str());
    }
  } catch (const lamina::Interrupted& e) {
    if (rank == 0) log.warn(e.what());  // every rank stops here after saving: an orderly exit, not an abort
    code = static_cast<int>(e.code());
    stopped = true;
  } catch (const lamina::JobWideError& e) {
    log.error(e.what());  // every rank ends here with it: an orderly exit, not an abort
    code = static_cast<int>(e.code());
    stopped = true;
  } catch (const lamina::Error& e) {
    log.error(e.what());
    code = static_cast<int>(e.code());
  } catch (const std::bad_alloc&) {
    // The tracked buffers say what they were allocating (core/buffer.hpp); this is the rest.
    log.error(lamina::host_allocation_failure());
    code = static_cast<int>(lamina::ExitCode::run_failed);
  } catch (const std::exception& e) {
    log.error(std::string("internal error: ") + e.what());
    code = static_cast<int>(lamina::ExitCode::internal);
  }
  // The JSON lines go through printf, not the log: a failed write shows here.
  errno = 0;
  if ((std::fflush(stdout) != 0 || std::ferror(stdout)) && code == 0) {
    log.error(std::string("cannot write standard output: ") + (errno != 0 ? std::strerror(errno) : "write error"));
    code = static_cast<int>(lamina::ExitCode::run_failed);
  }
  std::fflush(stderr);
  // Take the other ranks down with this one (after a signal, or a failure they agreed on,
  // they all stopped together);
  // alone, skip a shutdown that would crash.
  if (code != 0 && ((world > 1 && !stopped) || lamina::h5::file_close_failed())) MPI_Abort(MPI_COMM_WORLD, code);
  Kokkos::finalize();
  MPI_Finalize();
  return code;
}
