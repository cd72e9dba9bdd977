// The tuner's logic with a stand-in trial runner (the GPU trials themselves run on the GPU
// machine): out-of-memory trials are "does not fit", the fastest measured trial wins whatever
// the planner predicted, the calibration overlay is the geometric mean of measured / predicted
// step time, and the JSON, CSV and SVG describe every trial.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "mxtrain/core/error.hpp"
#include "mxtrain/report/svg_chart.hpp"
#include "mxtrain/plan/tune.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

RunConfig tune_config() {
  RunConfig config;
  config.model = model_preset("llama-1b");
  config.model.layers = 4;
  config.train.seq_len = 2048;
  config.train.micro_batch_size = 1;
  config.train.global_batch_size = 16;
  return config;
}

// Pretends micro-batch 16 runs out of memory and the others run at `slowdown` x the prediction,
// except micro-batch 4 which is unexpectedly the fastest.
struct FakeRunner {
  Calibration calibration = Calibration::load();
  double slowdown = 1.2;
  int calls = 0;
  BenchmarkResult operator()(const RunConfig& config, const BenchmarkOptions& options) {
    ++calls;
    BenchmarkResult result;
    result.device_name = "NVIDIA H200";
    if (config.train.micro_batch_size == 16) {
      result.fits = false;
      result.error = "out of memory: simulated";
      return result;
    }
    PlanOptions plan_options;
    plan_options.steps = static_cast<int>(options.warmup_steps + options.timed_steps);
    plan_options.detailed = false;
    const Plan plan = make_plan(config, PlanTarget{"h200", 1, 1}, calibration, plan_options);
    result.step_ms = 1e3 * plan.time.total_s * (config.train.micro_batch_size == 4 ? 0.5 : slowdown);
    result.tokens_per_step = config.train.global_batch_size * config.train.seq_len;
    result.tokens_per_s = static_cast<double>(result.tokens_per_step) / (result.step_ms / 1e3);
    result.peak_bytes = plan.memory.peak_live;
    result.reserved_bytes = plan.memory.peak_reserved;
    return result;
  }
};

TEST(Tune, GridRunsEveryConfigAndPicksTheFastestMeasured) {
  TuneOptions options;
  options.target = PlanTarget{"h200", 1, 1};
  options.grid = true;
  options.bench = BenchmarkOptions{1, 2};
  FakeRunner fake;
  const TuneResult result = tune(tune_config(), options, fake.calibration,
                                 [&](const RunConfig& c, const BenchmarkOptions& o) { return fake(c, o); });
  // Divisors of 16 x {none, selective, full} x {bf16}.
  ASSERT_EQ(result.trials.size(), 5u * 3u);
  EXPECT_EQ(fake.calls, 15);
  int out_of_memory = 0;
  for (const Trial& trial : result.trials) {
    EXPECT_TRUE(trial.ran);
    if (trial.planned.micro_batch == 16) {
      EXPECT_FALSE(trial.fits);
      ++out_of_memory;
    }
  }
  EXPECT_EQ(out_of_memory, 3);
  ASSERT_GE(result.best, 0);
  EXPECT_EQ(result.trials[static_cast<size_t>(result.best)].planned.micro_batch, 4);
  EXPECT_EQ(result.planner_choice, -1);

  // Calibration: 9 trials at 1.2x and 3 at 0.5x the prediction.
  const double expected = std::exp((9 * std::log(1.2) + 3 * std::log(0.5)) / 12);
  EXPECT_NEAR(result.step_time_ratio, expected, 1e-9);
  EXPECT_NEAR(result.calibration_overlay["gpus"]["h200"]["step_time_scale"].get<double>(), expected, 1e-9);
  // The overlay is a valid calibration layer.
  const Calibration updated = Calibration::from_json(
      {nlohmann::json::parse(std::string(R"({"gpus": {"default": {"gemm": {"tiles": [[128, 256, 1.0]]}}}})")),
       result.calibration_overlay});
  EXPECT_NEAR(updated.for_gpu(require_gpu("h200")).step_time_scale, expected, 1e-9);

  const std::string csv = tune_csv(result);
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 16);
  EXPECT_NE(csv.find("does not fit"), std::string::npos);
  const std::string svg = tune_svg(result);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_NE(svg.find("</svg>"), std::string::npos);
  EXPECT_NE(svg.find("does not fit"), std::string::npos);
  EXPECT_EQ(tune_json(result)["trials"].size(), 15u);
}

TEST(Tune, EachTrialAfterTheFirstLogsTheTrialsDoneAndAnEta) {
  TuneOptions options;
  options.target = PlanTarget{"h200", 1, 1};
  options.grid = true;
  options.bench = BenchmarkOptions{1, 2};
  FakeRunner fake;
  testing::internal::CaptureStdout();
  tune(tune_config(), options, fake.calibration,
       [&](const RunConfig& c, const BenchmarkOptions& o) { return fake(c, o); });
  const std::string log = testing::internal::GetCapturedStdout();
  const size_t first = log.find("tune: trial 1/15: ");
  ASSERT_NE(first, std::string::npos) << log;
  EXPECT_EQ(log.substr(first, log.find('\n', first) - first).find(" | tune: "), std::string::npos);
  for (int done = 1; done < 15; ++done) {
    const size_t at = log.find(strf("tune: trial %d/15: ", done + 1));
    ASSERT_NE(at, std::string::npos) << log;
    const std::string line = log.substr(at, log.find('\n', at) - at);
    EXPECT_NE(line.find(strf(" | tune: %3.0f%% %d trials / 15 trials, ", 100.0 * done / 15, done)), std::string::npos)
        << line;
    EXPECT_NE(line.find(", ETA "), std::string::npos) << line;
  }
}

TEST(Tune, PlannerModeTriesTheTopCandidatesAndDryRunRunsNothing) {
  TuneOptions options;
  options.target = PlanTarget{"h200", 1, 1};
  options.top = 3;
  options.dry_run = true;
  int calls = 0;
  const TuneResult listed = tune(tune_config(), options, Calibration::load(), [&](const RunConfig&, const BenchmarkOptions&) {
    ++calls;
    return BenchmarkResult{};
  });
  EXPECT_EQ(calls, 0);
  ASSERT_EQ(listed.trials.size(), 3u);
  EXPECT_EQ(listed.planner_choice, 0);
  for (const Trial& trial : listed.trials) {
    EXPECT_FALSE(trial.ran);
    EXPECT_TRUE(trial.planned.fits_with_headroom);
    EXPECT_GT(trial.predicted_peak_bytes, 0u);
  }
  // Planner order: the first is predicted fastest.
  EXPECT_GE(listed.trials[0].planned.tokens_per_s, listed.trials[1].planned.tokens_per_s);
}

TEST(Tune, SeveralGpusAreRefused) {
  TuneOptions options;
  options.target = PlanTarget{"h200", 8, 1};
  EXPECT_THROW(tune(tune_config(), options, Calibration::load(), [](const RunConfig&, const BenchmarkOptions&) {
                 return BenchmarkResult{};
               }),
               Error);
}

TEST(SvgChart, EscapesLabelsAndDrawsOneGroupPerBar) {
  ChartSpec chart;
  chart.title = "a <b> & \"c\"";
  chart.capacity_gib = 80;
  chart.bars = {ChartBar{"x<y", 100, 120, 10, 11, true, ""}, ChartBar{"z", -1, 90, -1, 85, false, "does not fit"}};
  const std::string svg = render_chart_svg(chart);
  EXPECT_NE(svg.find("a &lt;b&gt; &amp; &quot;c&quot;"), std::string::npos);
  EXPECT_NE(svg.find("x&lt;y"), std::string::npos);
  EXPECT_EQ(svg.find("x<y"), std::string::npos);
  EXPECT_NE(svg.find("capacity 80 GiB"), std::string::npos);
  EXPECT_NE(svg.find("#2a9d4a"), std::string::npos);  // the best bar
}

}  // namespace
}  // namespace mxtrain
