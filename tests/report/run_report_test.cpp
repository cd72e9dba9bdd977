// The run report from real CPU runs' directories: every section is there, and its figures are
// the metrics file's (read here independently of the renderer); the plan beside them is the real
// planner's for the run's config; warnings follow their documented definitions; a report that
// cannot be written never costs the run its checkpoint.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/plan/run_prediction.hpp"
#include "mxtrain/report/run_report.hpp"
#include "mxtrain/train/stop_signal.hpp"
#include "mxtrain/train/trainer.hpp"
#include "support/test_support.hpp"
#include "support/training_test.hpp"

namespace mxtrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

RunConfig small_run(const std::string& corpus, const std::string& run_dir, int64_t steps) {
  return test::tiny_training_run(corpus, run_dir, steps,
                                 {{"log.sample_every", "4"}, {"log.sample_tokens", "12"}, {"log.sample_prompt", "The <b>"}});
}

std::vector<json> metrics_records(const std::string& run_dir) {
  std::vector<json> records;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) records.push_back(json::parse(line));
  return records;
}

// The text of the element with this id (no nested tags in the figures).
std::string element_text(const std::string& page, const std::string& id) {
  const std::string open = "id=\"" + id + "\">";
  const size_t start = page.find(open);
  if (start == std::string::npos) return "<missing " + id + ">";
  const size_t end = page.find('<', start + open.size());
  return page.substr(start + open.size(), end - start - open.size());
}

std::string with_commas(int64_t value) {
  std::string digits = std::to_string(value), out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return out;
}

// HTML text as the page must hold it: markup characters and quotes escaped.
std::string escaped(const std::string& text) {
  const std::map<char, std::string> entities = {{'<', "&lt;"}, {'>', "&gt;"}, {'&', "&amp;"}, {'"', "&quot;"},
                                                {'\'', "&apos;"}};
  std::string out;
  for (char c : text) out += entities.count(c) ? entities.at(c) : std::string(1, c);
  return out;
}

class RunReportTest : public test::TrainingTest {};

TEST_F(RunReportTest, AStoppedAndResumedRunsReportHoldsEverySectionWithTheMetricsFilesFigures) {
  const std::string run_dir = dir_.file("run");
  const int64_t steps = 8;
  TrainerContext context;
  context.predict = predict_run;
  // Stopped by SIGTERM (as a request) in step 1: the trainer saves, stops and writes the report.
  request_stop_for_test(15);
  EXPECT_TRUE(Trainer(small_run(corpus_, run_dir, steps), context).run().stopped_by_signal);
  clear_stop_request();
  const std::string stopped_page = test::read_file(run_dir + "/report.html");
  ASSERT_FALSE(stopped_page.empty()) << "no report.html after a stop";
  EXPECT_NE(element_text(stopped_page, "run-status").find("stopped by signal 15 at step 1"), std::string::npos)
      << element_text(stopped_page, "run-status");
  // Resumed to the end: the report is rewritten.
  TrainerSummary done = Trainer(small_run(corpus_, run_dir, steps), context).run();
  ASSERT_EQ(done.steps_done, steps);
  const std::string page = test::read_file(run_dir + "/report.html");
  for (const std::string& id : run_report_sections())
    EXPECT_NE(page.find("<section id=\"" + id + "\">"), std::string::npos) << "section " << id;
  EXPECT_EQ(element_text(page, "run-status"), "finished");

  // The metrics file, read here: the last record of a step wins.
  std::map<int64_t, json> steps_seen;
  std::map<int64_t, double> val_losses;
  std::map<int64_t, std::string> samples;
  std::vector<json> checkpoints, starts;
  for (const json& record : metrics_records(run_dir)) {
    const int64_t step = record["step"].get<int64_t>();
    if (record.contains("event")) {
      if (record["event"] == "checkpoint") checkpoints.push_back(record);
      if (record["event"] == "start") starts.push_back(record);
    } else if (record.contains("val_loss")) {
      val_losses[step] = record["val_loss"].get<double>();
    } else if (record.contains("sample")) {
      samples[step] = record["sample"].get<std::string>();
    } else if (record.contains("loss")) {
      steps_seen[step] = record;
    }
  }
  ASSERT_EQ(steps_seen.size(), static_cast<size_t>(steps));
  const json& last = steps_seen.rbegin()->second;
  EXPECT_EQ(element_text(page, "final-loss"), strf("%.4f", last["loss"].get<double>()));
  EXPECT_EQ(element_text(page, "final-val-loss"), strf("%.4f", val_losses.rbegin()->second));
  EXPECT_EQ(element_text(page, "steps-done"), strf("%lld / %lld", static_cast<long long>(steps),
                                                   static_cast<long long>(steps)));
  EXPECT_EQ(element_text(page, "tokens-seen"), with_commas(last["tokens"].get<int64_t>()));
  uint64_t peak = 0;
  for (const auto& [step, record] : steps_seen) peak = std::max(peak, record["peak_bytes"].get<uint64_t>());
  EXPECT_EQ(element_text(page, "peak-memory"), strf("%.1f MiB", static_cast<double>(peak) / (1024.0 * 1024)));
  EXPECT_EQ(element_text(page, "median-mfu"), "not known");  // a CPU run
  // Medians: tokens/s over every step; step time without each process's first step (steps 1 and 2:
  // the second process resumed at step 1).
  std::vector<double> speeds, times;
  for (const auto& [step, record] : steps_seen) {
    speeds.push_back(record["tokens_per_s"].get<double>());
    if (step > 2) times.push_back(record["step_ms"].get<double>());
  }
  auto middle = [](std::vector<double> values) {
    std::sort(values.begin(), values.end());
    const size_t n = values.size();
    return n % 2 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2;
  };
  EXPECT_EQ(element_text(page, "median-tokens-per-s"), with_commas(std::llround(middle(speeds))));
  EXPECT_EQ(element_text(page, "median-step-ms"), strf("%.1f ms", middle(times)));

  // Each chart has one point per step (the loss curve), one per evaluation (held-out loss).
  EXPECT_NE(page.find("data-name=\"training loss\" data-points=\"" + std::to_string(steps) + "\""), std::string::npos);
  EXPECT_NE(page.find("data-name=\"held-out loss\" data-points=\"" + std::to_string(val_losses.size()) + "\""),
            std::string::npos);
  EXPECT_NE(page.find("data-name=\"tokens/s\" data-points=\"" + std::to_string(steps) + "\""), std::string::npos);

  // Checkpoints: step 1 (the stop), 3, 6 and the closing 8, each with its directory.
  ASSERT_EQ(checkpoints.size(), 4u);
  for (const json& checkpoint : checkpoints)
    EXPECT_NE(page.find(escaped(checkpoint["path"].get<std::string>())), std::string::npos) << checkpoint.dump();
  // Samples (steps 4 and 8), escaped as HTML: the prompt's "<b>" is text, not markup.
  ASSERT_EQ(samples.size(), 2u);
  for (const auto& [step, text] : samples) EXPECT_NE(page.find("<pre>" + escaped(text) + "</pre>"), std::string::npos);
  EXPECT_EQ(page.find("<b>"), std::string::npos);
  // Two process starts, the second resumed at step 1 (the stop's checkpoint).
  ASSERT_EQ(starts.size(), 2u);
  EXPECT_EQ(starts[1]["step"], 1);
  EXPECT_NE(page.find("the checkpoint of step 1"), std::string::npos);
  EXPECT_NE(page.find(escaped(starts[1]["device_name"].get<std::string>())), std::string::npos);
  // The effective config as saved.
  EXPECT_NE(page.find(escaped(test::read_file(run_dir + "/config.toml"))), std::string::npos);
  // Nothing is loaded from outside the page.
  EXPECT_EQ(page.find("<script"), std::string::npos);
  EXPECT_EQ(page.find("http://www.w3.org/2000/svg") != std::string::npos, true);
  EXPECT_EQ(std::regex_search(page, std::regex("(src|href)=\"(https?:)?//")), false);
}

TEST_F(RunReportTest, ThePlanIsThePlannersForTheRunsConfig) {
  const std::string run_dir = dir_.file("run");
  TrainerContext context;
  context.predict = predict_run;
  RunConfig config = small_run(corpus_, run_dir, 3);
  Trainer(config, context).run();
  const json plan = json::parse(test::read_file(run_dir + "/plan.json"));
  // A CPU run: the prediction is for the default GPU, and says it is not comparable.
  EXPECT_EQ(plan["gpu"], kDefaultPredictionGpu);
  EXPECT_EQ(plan["comparable"], false);
  RunConfig planned = config;
  planned.train.precision = "fp32";  // what "auto" resolves to on the CPU
  const json expected = predict_run(planned, "", 1);
  EXPECT_EQ(plan["memory"]["peak_live_bytes"], expected["memory"]["peak_live_bytes"]);
  EXPECT_EQ(plan["time"]["step_s"], expected["time"]["step_s"]);
  const std::string page = test::read_file(run_dir + "/report.html");
  const double live = expected["memory"]["peak_live_bytes"].get<double>();
  EXPECT_NE(page.find(strf("%.1f MiB", live / (1024.0 * 1024))), std::string::npos);
  EXPECT_NE(page.find(strf("%.2f", 1e3 * expected["time"]["gemm_s"].get<double>())), std::string::npos);
  EXPECT_NE(page.find("not a forecast of this run"), std::string::npos);
}

TEST_F(RunReportTest, AReportThatCannotBeWrittenLeavesTheRunAndItsCheckpoint) {
  const std::string run_dir = dir_.file("run");
  fs::create_directories(run_dir + "/report.html/occupied");  // a directory where the page goes
  TrainerSummary done = Trainer(small_run(corpus_, run_dir, 3), {}).run();
  EXPECT_EQ(done.steps_done, 3);
  EXPECT_TRUE(fs::exists(done.checkpoint + "/manifest.json"));
  EXPECT_TRUE(fs::is_directory(run_dir + "/report.html/occupied"));
  // Without a predictor there is no plan, and the page says so.
  EXPECT_FALSE(fs::exists(run_dir + "/plan.json"));
  const std::string page = render_run_report({run_dir, ""});
  EXPECT_NE(page.find("No prediction: the run directory has no plan.json"), std::string::npos);
}

TEST_F(RunReportTest, ARunThatFailsIsReportedWithItsError) {
  const std::string run_dir = dir_.file("run");
  RunConfig config = small_run(corpus_, run_dir, 6);
  config.optimizer.lr = 1e30;  // the first update makes the weights overflow: the loss is not finite
  config.optimizer.grad_clip = 0;
  config.schedule.warmup_steps = 0;
  EXPECT_THROW(Trainer(config, {}).run(), Error);
  const std::string page = test::read_file(run_dir + "/report.html");
  ASSERT_FALSE(page.empty()) << "no report after a failed run";
  const std::string status = element_text(page, "run-status");
  EXPECT_EQ(status.rfind("failed at step 2: ", 0), 0u) << status;
  EXPECT_NE(status.find("is not finite"), std::string::npos) << status;
  EXPECT_NE(page.find("data-kind=\"failure\""), std::string::npos);
}

void write_lines(const std::string& path, const std::vector<json>& records) {
  std::ofstream out(path);
  for (const json& record : records) out << record.dump() << "\n";
}

json step(int64_t n, double ms, double loss = 3.0) {
  return {{"step", n}, {"steps", 20}, {"loss", loss}, {"step_ms", ms}, {"tokens_per_s", 1000.0 / ms}};
}

TEST(RunReportWarnings, FollowTheirDefinitions) {
  test::TempDir dir;
  std::vector<json> records = {{{"step", 0}, {"event", "start"}}, step(1, 900)};  // warm-up: never slow
  for (int64_t n = 2; n <= 9; ++n) records.push_back(step(n, 100));
  records.push_back(step(10, 201));  // 2.01 x the median: slow
  records.push_back(step(11, 199));  // under 2 x: not slow
  json skipped = step(12, 100);
  skipped["skipped"] = true;
  skipped["loss_scale"] = 32768.0;
  records.push_back(skipped);
  json backoff = step(13, 100);
  backoff["loss_scale"] = 16384.0;
  records.push_back(backoff);
  json nan_loss = step(14, 100);
  nan_loss["loss"] = nullptr;  // how nlohmann writes a NaN
  records.push_back(nan_loss);
  records.push_back({{"step", 14}, {"event", "stop"}, {"signal", 15}});
  records.push_back({{"step", 14}, {"event", "start"}});
  records.push_back(step(15, 700));  // a resumed process's first step: warm-up again
  records.push_back(step(16, 100));
  write_lines(dir.file("metrics.jsonl"), records);
  const RunRecords read = read_run_records(dir.file("metrics.jsonl"));
  EXPECT_EQ(median_step_ms(read), 100);
  std::vector<std::pair<std::string, int64_t>> found;
  for (const Warning& warning : run_warnings(read)) found.emplace_back(warning.kind, warning.step);
  const std::vector<std::pair<std::string, int64_t>> expected = {
      {"slow_step", 10}, {"skipped", 12}, {"loss_scale", 13}, {"non_finite_loss", 14}};
  EXPECT_EQ(found, expected);
  const std::string page = render_run_report({dir.path(), ""});
  EXPECT_NE(page.find("step 10: 201.0 ms, 2.0× the median 100.0 ms"), std::string::npos);
  EXPECT_NE(page.find("loss scale backed off from 32768 to 16384"), std::string::npos);
}

TEST(RunReportRecords, APartialLastLineIsSkippedAndADamagedOneNamed) {
  test::TempDir dir;
  {
    std::ofstream out(dir.file("metrics.jsonl"));
    out << step(1, 10).dump() << "\n" << step(2, 10).dump() << "\n{\"step\": 3, \"lo";
  }
  EXPECT_EQ(read_run_records(dir.file("metrics.jsonl")).steps.size(), 2u);
  {
    std::ofstream out(dir.file("metrics.jsonl"));
    out << step(1, 10).dump() << "\nnot json\n" << step(2, 10).dump() << "\n";
  }
  try {
    read_run_records(dir.file("metrics.jsonl"));
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.full_message().find("line 2 is not JSON"), std::string::npos) << error.full_message();
  }
}

TEST(RunReportCommand, WritesThePageOrSaysWhatIsMissing) {
  test::TempDir dir;
  const std::string mxtrain = test::binary_path();
  std::string output;
  EXPECT_NE(test::run_command(mxtrain + " report " + dir.file("nothing"), &output), 0);
  EXPECT_NE(output.find("is not a directory"), std::string::npos) << output;
  EXPECT_NE(test::run_command(mxtrain + " report " + dir.path(), &output), 0);
  EXPECT_NE(output.find("metrics.jsonl"), std::string::npos) << output;
  write_lines(dir.file("metrics.jsonl"), {step(1, 10), step(2, 10)});
  ASSERT_EQ(test::run_command(mxtrain + " report " + dir.path() + " --out " + dir.file("page.html"), &output), 0)
      << output;
  EXPECT_NE(test::read_file(dir.file("page.html")).find("<section id=\"warnings\">"), std::string::npos);
  EXPECT_FALSE(fs::exists(dir.file("report.html")));
}

}  // namespace
}  // namespace mxtrain
