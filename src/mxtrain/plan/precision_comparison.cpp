#include "mxtrain/plan/precision_comparison.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/data/loader.hpp"
#include "mxtrain/report/svg_chart.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/train/schedule.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain {

std::vector<std::string> parse_precision_list(const std::string& text) {
  std::vector<std::string> formats;
  std::stringstream parts(text);
  std::string name;
  while (std::getline(parts, name, ',')) {
    const auto& known = precision_names();
    if (std::find(known.begin(), known.end(), name) == known.end()) {
      std::string names;
      for (const std::string& k : known) names += (names.empty() ? "" : ",") + k;
      throw Error(ErrorKind::config, "unknown precision '" + name + "' in --formats " + text,
                  "list formats from: " + names);
    }
    if (std::find(formats.begin(), formats.end(), name) != formats.end())
      throw Error(ErrorKind::config, "precision '" + name + "' appears twice in --formats " + text,
                  "list each format once");
    formats.push_back(name);
  }
  if (formats.empty()) throw Error(ErrorKind::config, "--formats is empty", "e.g. --formats bf16,fp8,mxfp8,nvfp4");
  return formats;
}

namespace {

std::string pick_baseline(const std::vector<std::string>& formats) {
  for (const char* preferred : {"bf16", "fp32"})
    if (std::find(formats.begin(), formats.end(), preferred) != formats.end()) return preferred;
  return formats.front();
}

// One training run of `config` (its train.precision set), on the batches the seed defines.
FormatCurve train_one(const RunConfig& config, const PrecisionComparisonOptions& options, const std::string& device) {
  using Clock = std::chrono::steady_clock;
  FormatCurve curve;
  curve.format = config.train.precision;
  std::unique_ptr<Backend> backend = create_backend(device, backend_options(config));
  const PrecisionPlan precision = resolve_precision(config, *backend);
  curve.startup_line = precision.startup_line;
  log::info("[" + curve.format + "] " + precision.startup_line);
  TrainingSession session(config, *backend, precision, make_parameter_store(*backend, config, precision, nullptr, 1));

  const int64_t micro = config.train.micro_batch_size;
  const int64_t global = config.train.global_batch(1);
  const int64_t global_tokens = global * config.train.seq_len;
  auto dataset = data::open_dataset("train", config.data.train, options.source_dir, "data.train", config.train.seq_len,
                                    config.model.vocab_size);
  data::TrainLoader loader(dataset, micro, static_cast<uint64_t>(config.train.seed));
  double timed_seconds = 0;
  for (int64_t step = 1; step <= config.train.steps; ++step) {
    std::vector<data::Batch> host;
    for (int64_t i = 0; i < global / micro; ++i) host.push_back(loader.next());
    const std::vector<TokenBatch> views = token_batch_views(host);
    const double lr = learning_rate(config.optimizer, config.schedule, step, config.train.steps);
    const Clock::time_point started = Clock::now();
    const StepResult result = session.step(views, global_tokens, lr, step);
    if (step > 1) timed_seconds += std::chrono::duration<double>(Clock::now() - started).count();
    curve.losses.push_back(result.loss);
    curve.skipped_steps += result.skipped ? 1 : 0;
    if (step % options.log_every == 0 || step == config.train.steps)
      log::info(strf("[%s] step %lld/%lld | loss %.4f | grad_norm %.2f", curve.format.c_str(),
                     static_cast<long long>(step), static_cast<long long>(config.train.steps), result.loss,
                     result.grad_norm));
  }
  if (config.train.steps > 1)
    curve.tokens_per_s = static_cast<double>(global_tokens * (config.train.steps - 1)) / timed_seconds;
  if (!config.data.val.empty() && config.eval.batches > 0) {
    data::ValidationReader validation(data::open_dataset("validation", config.data.val, options.source_dir, "data.val",
                                                         config.train.seq_len, config.model.vocab_size),
                                      micro);
    validation.start(config.eval.batches);
    std::vector<data::Batch> host;
    while (auto batch = validation.next()) host.push_back(std::move(*batch));
    curve.val_loss = session.evaluate(token_batch_views(host));
    log::info(strf("[%s] held-out loss %.4f (%zu batches of data.val)", curve.format.c_str(), curve.val_loss,
                   host.size()));
  }
  return curve;
}

}  // namespace

PrecisionComparison compare_precisions(const RunConfig& config, const PrecisionComparisonOptions& options) {
  MXTRAIN_REQUIRE(!options.formats.empty(), config, "no precision formats to compare",
                  "pass --formats, e.g. bf16,fp8,mxfp8,nvfp4");
  const std::string device = resolve_device(config.train.device);
  PrecisionComparison comparison;
  comparison.baseline = pick_baseline(options.formats);
  comparison.steps = config.train.steps;
  comparison.final_window = std::max<int64_t>(1, config.train.steps / 10);
  comparison.tokens_per_step = config.train.global_batch(1) * config.train.seq_len;
  std::vector<RunConfig> runs;
  for (const std::string& format : options.formats) {
    RunConfig run = config;
    run.train.precision = format;
    // The curves differ in the format alone: grad_dtype's auto would give the bf16 run (only)
    // BF16 block gradients, so unless it was set the comparison keeps f32 gradients in every run.
    if (run.precision.grad_dtype == "auto") run.precision.grad_dtype = "f32";
    validate(run);
    resolve_precision(format, device, run.train.tf32);  // Error(config) now rather than after other runs
    runs.push_back(run);
  }
  std::error_code error;
  std::filesystem::create_directories(options.output_dir, error);
  if (error)
    throw Error(ErrorKind::system, "cannot create " + options.output_dir + ": " + error.message(),
                "point -o at a writable directory");
  for (const RunConfig& run : runs) comparison.curves.push_back(train_one(run, options, device));

  auto final_of = [&](const FormatCurve& curve) {
    double total = 0;
    const size_t window = static_cast<size_t>(comparison.final_window);
    for (size_t i = curve.losses.size() - window; i < curve.losses.size(); ++i) total += curve.losses[i];
    return total / static_cast<double>(window);
  };
  double baseline_loss = 0;
  for (FormatCurve& curve : comparison.curves) {
    curve.final_loss = final_of(curve);
    if (curve.format == comparison.baseline) baseline_loss = curve.final_loss;
  }
  double baseline_val = -1;
  for (const FormatCurve& curve : comparison.curves)
    if (curve.format == comparison.baseline) baseline_val = curve.val_loss;
  for (FormatCurve& curve : comparison.curves) {
    curve.gap = (curve.final_loss - baseline_loss) / baseline_loss;
    curve.val_gap = baseline_val > 0 && curve.val_loss >= 0 ? (curve.val_loss - baseline_val) / baseline_val : 0;
  }

  RunConfig copy = config;
  comparison.csv_path = options.output_dir + "/loss_curves.csv";
  comparison.json_path = options.output_dir + "/loss_curves.json";
  comparison.svg_path = options.output_dir + "/loss_curves.svg";
  write_file_atomically(comparison.csv_path, comparison_csv(comparison));
  write_file_atomically(comparison.json_path, comparison_json(copy, comparison).dump(2) + "\n");
  const std::string title = strf("%s, %lld steps of %s tokens, %s", config.model.preset.c_str(),
                                 static_cast<long long>(comparison.steps),
                                 log::with_commas(static_cast<double>(comparison.tokens_per_step)).c_str(),
                                 device.c_str());
  write_file_atomically(comparison.svg_path, render_loss_curves_svg(title, comparison));
  return comparison;
}

std::string comparison_csv(const PrecisionComparison& comparison) {
  std::string text = "step";
  for (const FormatCurve& curve : comparison.curves) text += "," + curve.format;
  text += "\n";
  for (int64_t step = 0; step < comparison.steps; ++step) {
    text += std::to_string(step + 1);
    for (const FormatCurve& curve : comparison.curves) text += strf(",%.6f", curve.losses[static_cast<size_t>(step)]);
    text += "\n";
  }
  return text;
}

nlohmann::json comparison_json(const RunConfig& config, const PrecisionComparison& comparison) {
  nlohmann::json formats = nlohmann::json::array();
  for (const FormatCurve& curve : comparison.curves) {
    formats.push_back({{"format", curve.format},
                       {"startup_line", curve.startup_line},
                       {"final_loss", curve.final_loss},
                       {"gap_to_baseline", curve.gap},
                       {"tokens_per_s", curve.tokens_per_s},
                       {"val_loss", curve.val_loss},
                       {"val_gap_to_baseline", curve.val_gap},
                       {"skipped_steps", curve.skipped_steps},
                       {"losses", curve.losses}});
  }
  return {{"kind", "compare-precision"},
          {"model", config.model.preset},
          {"steps", comparison.steps},
          {"tokens_per_step", comparison.tokens_per_step},
          {"seed", config.train.seed},
          {"baseline", comparison.baseline},
          {"final_window", comparison.final_window},
          {"formats", formats}};
}

std::string render_loss_curves_svg(const std::string& title, const PrecisionComparison& comparison) {
  constexpr double width = 900, height = 520, left = 70, right = 230, top = 50, bottom = 60;
  const double plot_w = width - left - right, plot_h = height - top - bottom;
  static const char* colors[] = {"#222222", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"};
  // Moving averages over ~2% of the run: the raw per-step loss is noisy at small batches.
  const int64_t window = std::max<int64_t>(1, comparison.steps / 50);
  std::vector<std::vector<double>> smoothed;
  double low = 1e300, high = -1e300;
  for (const FormatCurve& curve : comparison.curves) {
    std::vector<double> values(curve.losses.size());
    double sum = 0;
    for (size_t i = 0; i < curve.losses.size(); ++i) {
      sum += curve.losses[i];
      if (i >= static_cast<size_t>(window)) sum -= curve.losses[i - static_cast<size_t>(window)];
      values[i] = sum / static_cast<double>(std::min<size_t>(i + 1, static_cast<size_t>(window)));
      if (std::isfinite(values[i])) {
        low = std::min(low, values[i]);
        high = std::max(high, values[i]);
      }
    }
    smoothed.push_back(std::move(values));
  }
  if (!(high > low)) high = low + 1;
  const double pad = 0.05 * (high - low);
  low -= pad;
  high += pad;
  const double steps = static_cast<double>(std::max<int64_t>(2, comparison.steps));
  auto x_of = [&](double step) { return left + plot_w * (step - 1) / (steps - 1); };
  auto y_of = [&](double loss) { return top + plot_h * (high - loss) / (high - low); };

  std::string svg = strf("<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
                         "font-family=\"sans-serif\" font-size=\"12\">\n",
                         width, height);
  svg += strf("<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", width, height);
  svg += strf("<text x=\"%.0f\" y=\"25\" font-size=\"15\" font-weight=\"bold\">Training loss by precision: %s</text>\n",
              left, svg_escape(title).c_str());
  for (int i = 0; i <= 5; ++i) {
    const double loss = low + (high - low) * i / 5.0, y = y_of(loss);
    svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", left, y, left + plot_w, y);
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.3f</text>\n", left - 6, y + 4, loss);
  }
  for (int i = 0; i <= 5; ++i) {
    const double step = 1 + (steps - 1) * i / 5.0, x = x_of(step);
    svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#e0e0e0\"/>\n", x, top, x, top + plot_h);
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n", x, top + plot_h + 18, step);
  }
  svg += strf("<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n", left, top,
              plot_w, plot_h);
  svg += strf("<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n", left + plot_w / 2, height - 20);
  svg += strf("<text transform=\"translate(18,%.1f) rotate(-90)\" text-anchor=\"middle\">loss (moving average of %lld "
              "steps)</text>\n",
              top + plot_h / 2, static_cast<long long>(window));
  for (size_t c = 0; c < comparison.curves.size(); ++c) {
    const char* color = colors[c % (sizeof colors / sizeof colors[0])];
    std::string points;
    for (size_t i = 0; i < smoothed[c].size(); ++i) {
      if (!std::isfinite(smoothed[c][i])) continue;
      points += strf("%.1f,%.1f ", x_of(static_cast<double>(i + 1)), y_of(smoothed[c][i]));
    }
    svg += strf("<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.6\" points=\"%s\"/>\n", color, points.c_str());
    const FormatCurve& curve = comparison.curves[c];
    const double y = top + 16 + 36 * static_cast<double>(c);
    const double legend_x = left + plot_w + 16;
    svg += strf("<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" stroke-width=\"3\"/>\n", legend_x, y,
                legend_x + 22, y, color);
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" font-weight=\"bold\">%s</text>\n", legend_x + 28, y + 4,
                svg_escape(curve.format).c_str());
    const std::string gap = curve.format == comparison.baseline ? std::string("baseline")
                                                                : strf("%+.2f%% vs %s", 100 * curve.gap,
                                                                       comparison.baseline.c_str());
    svg += strf("<text x=\"%.1f\" y=\"%.1f\" fill=\"#555\">final %.4f (%s)</text>\n", legend_x + 28, y + 19,
                curve.final_loss, svg_escape(gap).c_str());
  }
  svg += "</svg>\n";
  return svg;
}

}  // namespace mxtrain
