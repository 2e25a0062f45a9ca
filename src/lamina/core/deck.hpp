#pragma once
// The input deck: one typed struct per TOML section, each key validated once at start-up.
// The model, data, run, optimizer, checkpoint and output sections are the job's
// configuration (core/config.hpp); [parallel] and [memory] are the plan's keys, which
// plan/plan.hpp turns into a Plan. Code below the command line never sees the deck.
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "lamina/core/config.hpp"

namespace lamina {

// The plan keys as the deck gives them: each value checked on its own here (types, ranges,
// allowed words, one entry per block); whether they make a plan together is checked when
// the Plan is made from them (plan/plan.hpp), with the same file:line:col locations.
struct ParallelSection {
  std::int64_t dp = 1;
  std::int64_t cp = 1;  // context parallelism: each sequence over cp ranks (ring attention)
  std::int64_t tp = 1;
  std::int64_t pp = 1;
  std::int64_t zero = 0;
  std::string schedule = "1f1b";  // gpipe | 1f1b | interleaved | modular
  std::int64_t virtual_stages = 1;
  bool layered = false;
  bool sequence_parallel = false;  // Megatron's, inside the tensor-parallel group
  // bf16 runs: the precision of the tensor-parallel sums of the blocks' partial results
  // (fp32 | bf16, Megatron's, half the bytes).
  std::string tp_sums = "fp32";
  // Virtual-clock prices (any unit): one block's forward and backward on a micro-batch,
  // and one pipeline message. Bubble fractions are reported in this clock.
  double cost_forward = 1.0, cost_backward = 2.0, cost_p2p = 0.0;
};

// Per transformer block (the embedding follows block 0, the final norm the last block).
struct MemorySection {
  std::int64_t device_budget = 0;  // bytes; 0 = no budget
  std::int64_t host_budget = 0;
  std::vector<std::string> activations;  // keep | recompute | offload
  std::vector<std::string> params;       // device | host
  std::vector<std::string> optimizer;    // device | host | dynamic
  std::string dos_split = "model";       // model | all_host | all_device | alternate
  double dos_host_rate = 0.0;            // 0: measured at start-up
  double dos_device_rate = 0.0;
  double dos_h2d = 0.0;
  double dos_d2h = 0.0;
};

struct Deck {
  ModelConfig model;
  DataConfig data;
  TrainConfig train;
  OptimizerConfig optimizer;
  ParallelSection parallel;
  CommConfig comm;  // parallel.backend, parallel.timeout
  MemorySection memory;
  CheckpointConfig checkpoint;
  OutputConfig output;
  std::string source;         // the deck file (or "<string>")
  std::string resolved_toml;  // every key with its resolved value, as TOML
  // Where each key's value came from, "section.key" -> "file:line:col" or "--set ...",
  // and where each table starts, "section" -> "file:line:col".
  std::map<std::string, std::string> locations;

  // Planner keys the deck sets to "auto" (read as their defaults until planned).
  std::set<std::string> automatic;

  // The location of a key's value; for a key not given, of its table, else the deck.
  std::string where(const std::string& key) const;
  // Whether the deck (or --set) gives the key a value of its own (not "auto").
  bool sets(const std::string& key) const { return locations.count(key) != 0 && automatic.count(key) == 0; }
};

// The keys `lamina plan` chooses when a deck leaves them unset or sets them to "auto":
// the parallel layout, the micro-batch size and the per-block memory policies.
const std::vector<std::string>& planner_keys();

// Parses and validates a deck file. `overrides` are "section.key=value" strings (--set).
// Throws InputError listing every problem found, each as file:line:col: message.
Deck load_deck(const std::string& path, const std::vector<std::string>& overrides = {});
Deck parse_deck(const std::string& text, const std::string& source_name,
                const std::vector<std::string>& overrides = {});

// Parses "12GiB", "512MB", "1e9" or a plain integer into bytes; returns false when malformed.
bool parse_bytes(const std::string& text, std::int64_t& bytes);

// Every key a deck accepts, as "section.key", in the schema's order.
std::vector<std::string> deck_keys();

// Edit distance, for "did you mean" suggestions.
std::size_t edit_distance(const std::string& a, const std::string& b);
// The candidate a mistyped word most likely meant, "" if none is close.
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

}  // namespace lamina
