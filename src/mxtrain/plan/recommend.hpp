// `mxtrain plan --recommend`: searches micro-batch (with gradient accumulation keeping the global
// batch), activation checkpointing (none, selective, full, first-K layers), precision (from an
// allowed list) and, on several GPUs, the sharding strategy and shard-group size. Every candidate
// is one dryrun of the real step, memoized; memory grows with the micro-batch and shrinks with
// the recomputed layer count, so the largest micro-batch and the smallest K that fit are found
// by bisection. Configs that fit with the headroom are ranked by the objective, and the choice is
// explained in sentences drawn from the evaluated alternatives.
#pragma once
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/plan/planner.hpp"

namespace mxtrain {

struct RecommendOptions {
  std::string objective = "throughput";  // throughput | context | gpus
  std::vector<std::string> precisions = {"bf16"};
  double headroom = 0.05;
  double target_tokens_per_s = 0;        // gpus objective
  int max_gpus = 512;                    // gpus objective
  int64_t max_seq_len = 131072;          // context objective
  double useful_mfu_fraction = 0.5;      // context: MFU at least this fraction of the best at the config's length
  int top = 10;
  int search_steps = 1;                  // dryrun steps per candidate (the winner is re-planned in full)
};

struct Candidate {
  std::string precision, recompute, strategy;
  int64_t micro_batch = 0, seq_len = 0, micro_batches = 1, global_batch = 0, shard_group_size = 0;
  int gpus = 1, nodes = 1;
  bool fits = false, fits_with_headroom = false;
  uint64_t total_bytes = 0, capacity_bytes = 0, model_state_bytes = 0, activation_bytes = 0;
  double tokens_per_s = 0, tokens_per_s_per_gpu = 0, mfu = -1, step_s = 0;
  StepTime time;
  std::string label() const;  // "mb 8 x 4 | selective | bf16 | full_shard"
};

// Objective order: true when a is better than b. Both must fit with headroom.
bool better_throughput(const Candidate& a, const Candidate& b);
// Sorts fitting-with-headroom candidates best first, drops the rest.
std::vector<Candidate> rank_candidates(std::vector<Candidate> candidates);

struct Recommendation {
  std::string objective;
  RunConfig base;
  PlanTarget target;
  std::vector<Candidate> ranked;     // fit with headroom, best first (for context: at the chosen length)
  std::vector<Candidate> evaluated;  // everything tried, in order
  bool found = false;
  Candidate best;
  Plan best_plan;                    // the winner, planned in full (breakdown at the peak)
  std::vector<std::string> explanation;
  int64_t dryruns = 0;
  double seconds = 0;
  std::vector<std::string> unavailable_precisions;  // listed but not in this build
};

Recommendation recommend(const RunConfig& config, const PlanTarget& target, const Calibration& calibration,
                         const RecommendOptions& options);

// The sentences explaining `best` against the alternatives (exposed for tests).
std::vector<std::string> explain_choice(const Candidate& best, const std::vector<Candidate>& evaluated,
                                        const GpuSpec& gpu, double headroom);

std::string format_recommendation(const Recommendation& recommendation);
// One Markdown table row (docs/planning.md's preset table): model, GPUs, fits, recommended
// config, memory per GPU, predicted tokens/s, MFU; and the table's header.
std::string recommendation_summary_row(const Recommendation& recommendation);
std::string recommendation_summary_header();
nlohmann::json recommendation_json(const Recommendation& recommendation);
nlohmann::json candidate_json(const Candidate& candidate);

std::vector<std::string> split_list(const std::string& text);  // "bf16, fp8" -> {"bf16", "fp8"}
// The precisions a search may use: the comma-separated list, or when empty the config's own
// train.precision ("auto" is what a GPU run resolves it to, bf16).
std::vector<std::string> precision_list(const std::string& text, const RunConfig& config);
// Applies a candidate's knobs to a config (micro-batch, global batch, length, recompute, ...).
RunConfig apply_candidate(const RunConfig& base, const Candidate& candidate);
// Micro-batches that split a per-GPU batch into whole micro-batches (its divisors), ascending.
std::vector<int64_t> micro_batch_choices(int64_t per_gpu_batch);
// The knobs with the plan's predictions filled in.
Candidate candidate_from_plan(const Plan& plan, const Candidate& knobs);

}  // namespace mxtrain
