// The run report: one self-contained HTML page (inline CSS and SVG, no script, no network; a
// Content-Security-Policy that forbids loading anything makes a stray reference a console error)
// built only from what a run directory holds:
//   metrics.jsonl   step records (loss, lr, grad_norm, step_ms, tokens_per_s, mfu, peak_bytes, ...),
//                   held-out losses ({"step", "val_loss"}), samples ({"step", "sample"}) and events
//                   ({"step", "event": "start" | "checkpoint" | "stop" | "failure", ...}); a resumed run
//                   appends, and for a step recorded twice the last record wins;
//   plan.json       the planner's prediction for the run's config (plan_json plus "run_device" and
//                   "comparable"), written by `mxtrain train` at start; absent: no prediction;
//   config.toml     the effective config, shown as saved;
//   checkpoints/    the checkpoints still on disk.
// It sits in report/ (below train/) so that the trainer writes it at the end of a run and on stop.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mxtrain {

struct StepRecord {
  int64_t step = 0, steps = 0;
  double loss = 0, lr = 0, grad_norm = 0, step_ms = 0, tokens_per_s = 0, tflops = 0;
  double mfu = -1;  // < 0: not known (CPU)
  uint64_t peak_bytes = 0, reserved_bytes = 0;
  int64_t tokens = 0;
  bool skipped = false;
  double loss_scale = 0;
  bool loss_finite = true;  // metrics.jsonl holds null for a NaN or infinite loss
};

struct CheckpointEvent {
  int64_t step = 0;
  std::string path;
  double seconds = 0;
  uint64_t bytes = 0;
};

// What metrics.jsonl says, steps deduplicated (the last record of a step wins) and in step order.
struct RunRecords {
  std::vector<StepRecord> steps;
  std::map<int64_t, double> val_losses;
  std::map<int64_t, std::string> samples;
  std::vector<CheckpointEvent> checkpoints;
  std::vector<nlohmann::json> starts;  // one per process start: device, precision, ...
  std::vector<nlohmann::json> stops;   // stopped by a signal
  std::vector<nlohmann::json> failures;  // ended by an error ("message")
  nlohmann::json last_event;           // the last start, stop or failure event (null: none)
  std::vector<int64_t> process_first_steps;  // the first step each process ran (warm-up)
};

// Throws Error(data) naming the file and line for a line that is not JSON.
RunRecords read_run_records(const std::string& metrics_path);

// A step is slow when it took more than kSlowStepFactor times the median step time of the run,
// a process's first step (warm-up: allocation, autotuning, graph capture) excluded.
inline constexpr double kSlowStepFactor = 2.0;

struct Warning {
  std::string kind;  // "skipped", "loss_scale", "slow_step", "non_finite_loss", "failure"
  int64_t step = 0;
  std::string text;
};
std::vector<Warning> run_warnings(const RunRecords& records);
// The median step time over the steps that are not a process's first (all steps when that leaves none).
double median_step_ms(const RunRecords& records);

struct RunReportInputs {
  std::string run_dir;
  std::string metrics_path;  // default RUN_DIR/metrics.jsonl
};

// The page's section ids, in order (the browser test checks each is rendered).
const std::vector<std::string>& run_report_sections();

std::string render_run_report(const RunReportInputs& inputs);
// Renders and writes atomically to `out_path` (default RUN_DIR/report.html); returns the path.
std::string write_run_report(const RunReportInputs& inputs, const std::string& out_path = "");

}  // namespace mxtrain
