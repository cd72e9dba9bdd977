// `mxtrain compare-precision`: trains the same config once per precision format — same
// initial weights (train.seed), same batches in the same order, same schedule — and writes the
// loss curves side by side (CSV, JSON, a hand-written SVG plot) with each format's final-loss
// gap to the baseline (bf16 when it is in the list, else fp32, else the first format).
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"

namespace mxtrain {

struct PrecisionComparisonOptions {
  std::vector<std::string> formats;  // train.precision names, e.g. bf16, fp8, mxfp8, nvfp4
  std::string output_dir;            // CSV, JSON and SVG go here
  std::string source_dir;            // resolves relative data paths (the repository root)
  int64_t log_every = 50;            // progress line every N steps
};

struct FormatCurve {
  std::string format;
  std::string startup_line;
  std::vector<double> losses;  // per step
  double final_loss = 0;       // mean over the last final_window steps
  double gap = 0;              // (final_loss - baseline's) / baseline's
  double tokens_per_s = 0;     // steps after the first
  int64_t skipped_steps = 0;   // fp16 overflow skips
  // Held-out loss after the last step: eval.batches micro-batches of data.val, the same windows
  // for every format (negative when data.val is empty or eval.batches is 0).
  double val_loss = -1;
  double val_gap = 0;          // (val_loss - baseline's) / baseline's
};

struct PrecisionComparison {
  std::string baseline;
  int64_t steps = 0;
  int64_t final_window = 1;  // steps averaged for the final loss: max(1, steps / 10)
  int64_t tokens_per_step = 0;
  std::vector<FormatCurve> curves;
  std::string csv_path, json_path, svg_path;
};

// Splits "bf16,fp8,mxfp8" and checks every name against train.precision's choices.
std::vector<std::string> parse_precision_list(const std::string& text);

// Resolves every format on the device first (an unavailable one fails before any training),
// then trains each and writes the three files.
PrecisionComparison compare_precisions(const RunConfig& config, const PrecisionComparisonOptions& options);

nlohmann::json comparison_json(const RunConfig& config, const PrecisionComparison& comparison);
std::string comparison_csv(const PrecisionComparison& comparison);
std::string render_loss_curves_svg(const std::string& title, const PrecisionComparison& comparison);

}  // namespace mxtrain
