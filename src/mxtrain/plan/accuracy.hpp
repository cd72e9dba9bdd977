// The planner's accuracy harness: plan every config of a list for one GPU type and, on a machine
// with that GPU, run each with `mxtrain bench`'s run_benchmark, then report predicted against
// measured peak (allocator peak live bytes) and step time. bench/planner_accuracy.sh runs it and
// writes bench/results/planner_accuracy.json; tests/plan/planner_accuracy_test.cpp re-plans the
// committed configs on the CPU and checks them against the committed measurements.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/plan/calibration.hpp"

namespace mxtrain {

struct AccuracyOptions {
  bool measure = false;  // run each config on this machine's GPU too
  int steps = 0;         // dryrun steps; 0 = the list's warmup + timed steps (bench's peak window)
  // When set, the report so far is rewritten here after every measured entry, so a run cut
  // short (a time limit on the GPU machine) still leaves every finished measurement.
  std::string progress_path;
};

// The config of one list entry: the defaults with the entry's "set" keys applied (environment
// ignored, so a re-plan anywhere gives the same config). `defaults_then` (a measured report's
// "defaults_at_measurement" object) holds the keys whose defaults changed after the report was
// measured, with their values at the time; they apply under the entry's own keys, so re-planning
// an old measurement plans the config that was measured. A key whose default changed for some
// recipes only gives its values then by the entry's train.precision, {"fp8": "f32", ...}; an
// entry of a precision not named there keeps today's default.
RunConfig accuracy_entry_config(const nlohmann::json& entry, const nlohmann::json& defaults_then = nlohmann::json());

// A measured report's "defaults_at_measurement" (an empty object when it has none).
nlohmann::json defaults_at_measurement(const nlohmann::json& report);

// One training step of `config` on `reference` (the cuda backend in the harness) and on the dryrun
// replaying `model`, allocation by allocation (name, rounded bytes, live bytes after): {"match":
// true} or the first allocation that differs — where a peak mismatch comes from.
nlohmann::json compare_allocation_traces(Backend& reference, const RunConfig& config, const GpuSpec& gpu,
                                         CudaAllocationModel model);

// Reads the list (see bench/planner_accuracy_configs.json) and returns the report.
nlohmann::json run_accuracy_harness(const std::string& configs_path, const std::string& gpu,
                                    const Calibration& calibration, const AccuracyOptions& options);
std::string format_accuracy(const nlohmann::json& report);

// Least-squares fit of the measured step times of a measured report: step ≈ a·GEMM + b·attention
// + c·memory-bound time (as predicted, launch overhead excluded) + d·op launches, weighted by
// 1/measured (relative errors). Returns the calibration overlay for the report's GPU that
// divides the efficiency fractions by a, b, c and sets the launch overhead to d — a class with
// no measurable weight keeps its factor — or null when fewer than 4 configs were measured.
nlohmann::json fit_calibration(const nlohmann::json& report, const Calibration& calibration);

// Leave-one-out check of the step-time calibration on a measured report (a file written by the
// harness with --measure): every measured config
// is re-planned here with `calibration` (the class times the fit needs), then, for each config,
// the calibration is fitted to all the others and the held-out config's step time predicted
// with that fit. Returns per-entry in-sample and held-out predictions and errors, and the worst
// and median held-out errors: an out-of-sample figure the in-sample fit alone cannot give.
nlohmann::json cross_validate_step_times(const std::string& report_path, const Calibration& calibration);
std::string format_cross_validation(const nlohmann::json& result);

}  // namespace mxtrain
