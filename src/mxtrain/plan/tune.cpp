#include "mxtrain/plan/tune.hpp"

#include <cmath>
#include <ctime>

#include "mxtrain/build_info.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/core/progress.hpp"
#include "mxtrain/report/svg_chart.hpp"

namespace mxtrain {

std::vector<Candidate> grid_candidates(const RunConfig& config, const PlanTarget& target,
                                       const std::vector<std::string>& precisions) {
  const int64_t global = config.train.global_batch(target.gpus);
  std::vector<Candidate> grid;
  for (const std::string& precision : precisions)
    for (const char* recompute : {"none", "selective", "full"})
      for (int64_t micro : micro_batch_choices(global / target.gpus)) {
        Candidate c;
        c.precision = precision;
        c.recompute = recompute;
        c.strategy = config.dist.strategy;
        c.shard_group_size = config.dist.shard_group_size;
        c.micro_batch = micro;
        c.global_batch = global;
        c.seq_len = config.train.seq_len;
        c.gpus = target.gpus;
        c.nodes = 1;
        grid.push_back(c);
      }
  return grid;
}

TuneResult tune(const RunConfig& config, const TuneOptions& options, const Calibration& calibration,
                const TrialRunner& runner) {
  {
    RunConfig checked = config;  // the micro-batch is searched
    checked.train.micro_batch_size = 1;
    validate(checked);
  }
  if (options.target.gpus != 1)
    throw Error(ErrorKind::config, strf("tune runs its trials on one GPU, not %d", options.target.gpus),
                "drop --gpus (plan several GPUs with `mxtrain plan --recommend --gpus N`)");
  const GpuSpec& gpu = require_gpu(options.target.gpu);
  TuneResult result;
  result.model = config.model.preset;
  result.gpu = gpu.key;

  std::vector<Candidate> candidates;
  if (options.grid) {
    candidates = grid_candidates(config, options.target, options.precisions);
  } else {
    RecommendOptions recommend_options;
    recommend_options.precisions = options.precisions;
    recommend_options.headroom = options.headroom;
    recommend_options.top = options.top;
    const Recommendation recommendation = recommend(config, options.target, calibration, recommend_options);
    if (!recommendation.found)
      throw Error(ErrorKind::out_of_memory,
                  "the planner finds no config of " + config.model.preset + " that fits one " + gpu.key,
                  "see `mxtrain plan --recommend` for what it needs; use a shorter sequence or more GPUs");
    candidates = recommendation.ranked;
    result.planner_choice = 0;
  }

  // Predictions over the benchmark's own window (its warm-up and timed steps).
  PlanOptions plan_options;
  plan_options.steps = static_cast<int>(options.bench.warmup_steps + options.bench.timed_steps);
  plan_options.detailed = false;
  plan_options.headroom = options.headroom;
  for (const Candidate& candidate : candidates) {
    const Plan plan = make_plan(apply_candidate(config, candidate), options.target, calibration, plan_options);
    Trial trial;
    trial.planned = candidate_from_plan(plan, candidate);
    trial.predicted_peak_bytes = plan.memory.peak_live;
    result.trials.push_back(trial);
  }
  if (options.dry_run) return result;

  // Trials log their own lines, so the progress (trials done, the ETA at the mean trial time so
  // far) rides on each trial's first line instead of a redrawn one.
  const Progress progress("tune", static_cast<double>(result.trials.size()), "trials");
  for (size_t i = 0; i < result.trials.size(); ++i) {
    Trial& trial = result.trials[i];
    log::info(strf("tune: trial %zu/%zu: %s%s", i + 1, result.trials.size(), trial.planned.label().c_str(),
                   i > 0 ? (" | " + progress.text(static_cast<double>(i))).c_str() : ""));
    const BenchmarkResult measured = runner(apply_candidate(config, trial.planned), options.bench);
    trial.ran = true;
    trial.fits = measured.fits;
    trial.error = measured.error;
    trial.device_name = measured.device_name;
    if (!measured.fits) {
      log::info("tune:   does not fit");
      continue;
    }
    trial.tokens_per_s = measured.tokens_per_s;
    trial.step_ms = measured.step_ms;
    trial.mfu = measured.mfu;
    trial.peak_bytes = measured.peak_bytes;
    trial.reserved_bytes = measured.reserved_bytes;
    log::info(strf("tune:   %s tokens/s (predicted %s), peak %s (predicted %s)",
                   log::with_commas(trial.tokens_per_s).c_str(), log::with_commas(trial.planned.tokens_per_s).c_str(),
                   gib_text(static_cast<double>(trial.peak_bytes)).c_str(),
                   gib_text(static_cast<double>(trial.predicted_peak_bytes)).c_str()));
    if (result.best < 0 || trial.tokens_per_s > result.trials[static_cast<size_t>(result.best)].tokens_per_s)
      result.best = static_cast<int>(i);
  }

  // Calibration: the geometric mean of measured / predicted step time scales the planner's times,
  // from trials that really ran on the planned GPU type (not, say, on the CPU).
  double log_sum = 0, low = 0, high = 0;
  int count = 0;
  for (const Trial& trial : result.trials) {
    if (!trial.fits || trial.planned.step_s <= 0) continue;
    const GpuSpec* measured_on = find_gpu(trial.device_name);
    if (!measured_on || measured_on->key != gpu.key) {
      log::warn(strf("tune: trials ran on '%s', not a %s: no calibration is written", trial.device_name.c_str(),
                     gpu.key.c_str()));
      count = 0;
      break;
    }
    const double ratio = trial.step_ms / (1e3 * trial.planned.step_s);
    log_sum += std::log(ratio);
    low = count == 0 ? ratio : std::min(low, ratio);
    high = count == 0 ? ratio : std::max(high, ratio);
    ++count;
  }
  if (count > 0) {
    result.step_time_ratio = std::exp(log_sum / count);
    const double scale = calibration.for_gpu(gpu).step_time_scale * result.step_time_ratio;
    char stamp[32];
    std::time_t now = std::time(nullptr);
    std::strftime(stamp, sizeof stamp, "%Y-%m-%d", std::gmtime(&now));
    const std::string device = result.trials[static_cast<size_t>(result.best)].device_name;
    result.calibration_overlay = {
        {"format", 1},
        {"gpus",
         {{gpu.key,
           {{"step_time_scale", scale},
            {"source", strf("mxtrain tune %s on %s (commit %s): %s, %d trials, measured/predicted step time %.3f "
                            "(geometric mean; %.3f to %.3f)",
                            stamp, device.c_str(), MXTRAIN_GIT_COMMIT, config.model.preset.c_str(), count,
                            result.step_time_ratio, low, high)}}}}}};
  }
  return result;
}

namespace {

std::string trial_status(const Trial& trial) {
  if (!trial.ran) return "not run";
  return trial.fits ? "ok" : "does not fit";
}

}  // namespace

std::string format_tune(const TuneResult& result) {
  std::string out = strf("mxtrain tune: %s on one %s\n", result.model.c_str(), result.gpu.c_str());
  out += strf("  %-4s %-40s %14s %14s %10s %11s %11s  %s\n", "#", "config", "tokens/s", "predicted", "step ms",
              "peak GiB", "plan GiB", "");
  for (size_t i = 0; i < result.trials.size(); ++i) {
    const Trial& t = result.trials[i];
    std::string mark = static_cast<int>(i) == result.best ? "<- fastest" : "";
    if (static_cast<int>(i) == result.planner_choice) mark += mark.empty() ? "(planner's pick)" : " (planner's pick)";
    out += strf("  %-4zu %-40s %14s %14s %10s %11s %11.2f  %s %s\n", i + 1, t.planned.label().c_str(),
                t.fits ? log::with_commas(t.tokens_per_s).c_str() : trial_status(t).c_str(),
                log::with_commas(t.planned.tokens_per_s).c_str(), t.fits ? strf("%.1f", t.step_ms).c_str() : "-",
                t.fits ? strf("%.2f", static_cast<double>(t.peak_bytes) / (1u << 30)).c_str() : "-",
                static_cast<double>(t.predicted_peak_bytes) / (1u << 30), mark.c_str(),
                t.planned.fits_with_headroom ? "" : "(planner: does not fit)");
  }
  if (result.best >= 0) {
    out += strf("\nfastest: %s at %s tokens/s", result.trials[static_cast<size_t>(result.best)].planned.label().c_str(),
                log::with_commas(result.trials[static_cast<size_t>(result.best)].tokens_per_s).c_str());
    if (result.step_time_ratio > 0) out += strf("; measured/predicted step time %.3f", result.step_time_ratio);
    out += "\n";
  }
  return out;
}

nlohmann::json tune_json(const TuneResult& result) {
  nlohmann::json trials = nlohmann::json::array();
  for (const Trial& t : result.trials) {
    nlohmann::json trial = {{"config", candidate_json(t.planned)},
                            {"predicted_peak_bytes", t.predicted_peak_bytes},
                            {"status", trial_status(t)}};
    if (t.fits) {
      trial["tokens_per_s"] = t.tokens_per_s;
      trial["step_ms"] = t.step_ms;
      trial["mfu"] = t.mfu;
      trial["peak_bytes"] = t.peak_bytes;
      trial["reserved_bytes"] = t.reserved_bytes;
      trial["gpu_name"] = t.device_name;
    } else if (t.ran) {
      trial["error"] = t.error;
    }
    trials.push_back(trial);
  }
  nlohmann::json json = {{"kind", "tune"},       {"model", result.model},   {"gpu", result.gpu},
                         {"commit", MXTRAIN_GIT_COMMIT}, {"trials", trials}, {"best", result.best},
                         {"planner_choice", result.planner_choice}};
  if (result.step_time_ratio > 0) {
    json["step_time_ratio"] = result.step_time_ratio;
    json["calibration_overlay"] = result.calibration_overlay;
  }
  return json;
}

std::string tune_csv(const TuneResult& result) {
  std::string csv = "rank,micro_batch,micro_batches,seq_len,recompute,precision,status,tokens_per_s,"
                    "predicted_tokens_per_s,step_ms,predicted_step_ms,peak_bytes,predicted_peak_bytes,best\n";
  for (size_t i = 0; i < result.trials.size(); ++i) {
    const Trial& t = result.trials[i];
    csv += strf("%zu,%lld,%lld,%lld,%s,%s,%s,%.1f,%.1f,%.3f,%.3f,%llu,%llu,%d\n", i + 1,
                static_cast<long long>(t.planned.micro_batch), static_cast<long long>(t.planned.micro_batches),
                static_cast<long long>(t.planned.seq_len), t.planned.recompute.c_str(), t.planned.precision.c_str(),
                trial_status(t).c_str(), t.tokens_per_s, t.planned.tokens_per_s, t.step_ms, 1e3 * t.planned.step_s,
                static_cast<unsigned long long>(t.peak_bytes),
                static_cast<unsigned long long>(t.predicted_peak_bytes), static_cast<int>(i) == result.best ? 1 : 0);
  }
  return csv;
}

std::string tune_svg(const TuneResult& result) {
  ChartSpec chart;
  const GpuSpec* gpu = find_gpu(result.gpu);
  chart.title = strf("mxtrain tune: %s on one %s", result.model.c_str(), gpu ? gpu->name.c_str() : result.gpu.c_str());
  chart.capacity_gib = gpu ? gpu->memory_bytes / (1u << 30) : 0;
  for (size_t i = 0; i < result.trials.size(); ++i) {
    const Trial& t = result.trials[i];
    ChartBar bar;
    bar.label = strf("mb %lld x %lld | %s", static_cast<long long>(t.planned.micro_batch),
                     static_cast<long long>(t.planned.micro_batches), t.planned.recompute.c_str());
    bar.predicted_tokens_per_s = t.planned.tokens_per_s;
    bar.predicted_peak_gib = static_cast<double>(t.predicted_peak_bytes) / (1u << 30);
    if (t.fits) {
      bar.measured_tokens_per_s = t.tokens_per_s;
      bar.peak_gib = static_cast<double>(t.peak_bytes) / (1u << 30);
    } else if (t.ran) {
      bar.note = "does not fit";
    }
    bar.best = static_cast<int>(i) == result.best;
    chart.bars.push_back(bar);
  }
  return render_chart_svg(chart);
}

}  // namespace mxtrain
