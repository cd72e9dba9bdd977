// `mxtrain tune`: the planner's best candidates (or, with grid, every micro-batch x checkpointing x
// precision of the same space) run as short timed trials through run_benchmark on this machine's
// GPU. An out-of-memory trial is "does not fit", not a failure. The fastest measured config wins;
// the trials are written as JSON, CSV and an SVG chart, and the measured/predicted step-time
// ratio as a calibration overlay the planner reads with --calibration.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/plan/recommend.hpp"
#include "mxtrain/train/benchmark.hpp"

namespace mxtrain {

struct TuneOptions {
  PlanTarget target;               // one GPU of this machine's type
  int top = 5;                     // planner candidates to try
  bool grid = false;               // every micro-batch x checkpointing x precision instead
  std::vector<std::string> precisions = {"bf16"};
  double headroom = 0.05;
  BenchmarkOptions bench{3, 10};
  bool dry_run = false;            // list the trials, run none
};

struct Trial {
  Candidate planned;               // the planner's prediction for this config
  uint64_t predicted_peak_bytes = 0;
  bool ran = false;
  bool fits = false;               // measured: false when it ran out of memory
  std::string error;
  double tokens_per_s = 0, step_ms = 0, mfu = -1;
  uint64_t peak_bytes = 0, reserved_bytes = 0;
  std::string device_name;
};

struct TuneResult {
  std::string model;
  std::string gpu;
  std::vector<Trial> trials;
  int best = -1;                    // index of the fastest measured trial
  int planner_choice = -1;          // index of the planner's first-ranked candidate (not in grid mode)
  nlohmann::json calibration_overlay;  // {"gpus": {gpu: {"step_time_scale": ..., "source": ...}}}
  double step_time_ratio = 0;       // geometric mean of measured / predicted step time
};

// Runs one trial; run_benchmark in production, a stand-in in tests.
using TrialRunner = std::function<BenchmarkResult(const RunConfig&, const BenchmarkOptions&)>;

TuneResult tune(const RunConfig& config, const TuneOptions& options, const Calibration& calibration,
                const TrialRunner& runner);

std::string format_tune(const TuneResult& result);
nlohmann::json tune_json(const TuneResult& result);
std::string tune_csv(const TuneResult& result);
std::string tune_svg(const TuneResult& result);

// Every config of the grid: divisors of the per-GPU batch x {none, selective, full} x precisions.
std::vector<Candidate> grid_candidates(const RunConfig& config, const PlanTarget& target,
                                       const std::vector<std::string>& precisions);

}  // namespace mxtrain
