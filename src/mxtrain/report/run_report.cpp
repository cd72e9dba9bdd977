#include "mxtrain/report/run_report.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/report/line_chart.hpp"
#include "mxtrain/report/svg_chart.hpp"

namespace fs = std::filesystem;

namespace mxtrain {

namespace {

using nlohmann::json;

double number(const json& record, const char* key, double fallback = 0) {
  auto it = record.find(key);
  return it != record.end() && it->is_number() ? it->get<double>() : fallback;
}

std::string text_of(const json& record, const char* key) {
  auto it = record.find(key);
  if (it == record.end() || it->is_null()) return "";
  return it->is_string() ? it->get<std::string>() : it->dump();
}

std::string html(const std::string& text) { return svg_escape(text); }

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return "";
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

// The middle value, or the mean of the two middle ones; 0 for none.
double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

}  // namespace

RunRecords read_run_records(const std::string& metrics_path) {
  std::ifstream in(metrics_path);
  if (!in)
    throw Error(ErrorKind::data, "cannot read " + metrics_path,
                "give the run directory of a run that has started (it holds metrics.jsonl)");
  RunRecords records;
  std::map<int64_t, StepRecord> steps;
  std::string line;
  int line_number = 0;
  while (std::getline(in, line)) {
    ++line_number;
    if (line.empty()) continue;
    json record;
    try {
      record = json::parse(line);
    } catch (const json::exception&) {
      // A run killed mid-write leaves a partial last line: it is skipped, anything else is an error.
      if (in.peek() == EOF) break;
      throw Error(ErrorKind::data, strf("%s line %d is not JSON", metrics_path.c_str(), line_number),
                  "the metrics file was edited or damaged; restore it or remove the line");
    }
    if (!record.is_object() || !record.contains("step")) continue;
    const int64_t step = record["step"].get<int64_t>();
    if (record.contains("event")) {
      const std::string event = text_of(record, "event");
      if (event == "start" || event == "stop" || event == "failure") records.last_event = record;
      if (event == "start") {
        records.starts.push_back(record);
        records.process_first_steps.push_back(step + 1);
      } else if (event == "failure") {
        records.failures.push_back(record);
      } else if (event == "checkpoint") {
        records.checkpoints.push_back({step, text_of(record, "path"), number(record, "seconds"),
                                       static_cast<uint64_t>(number(record, "bytes"))});
      } else if (event == "stop") {
        records.stops.push_back(record);
      }
    } else if (record.contains("val_loss")) {
      records.val_losses[step] = number(record, "val_loss", NAN);
    } else if (record.contains("sample")) {
      records.samples[step] = text_of(record, "sample");
    } else if (record.contains("loss")) {
      StepRecord s;
      s.step = step;
      s.steps = static_cast<int64_t>(number(record, "steps"));
      s.loss_finite = record["loss"].is_number();
      s.loss = number(record, "loss", NAN);
      s.lr = number(record, "lr");
      s.grad_norm = number(record, "grad_norm", NAN);
      s.step_ms = number(record, "step_ms");
      s.tokens_per_s = number(record, "tokens_per_s");
      s.tflops = number(record, "tflops");
      s.mfu = number(record, "mfu", -1);
      s.peak_bytes = static_cast<uint64_t>(number(record, "peak_bytes"));
      s.reserved_bytes = static_cast<uint64_t>(number(record, "reserved_bytes"));
      s.tokens = static_cast<int64_t>(number(record, "tokens"));
      s.skipped = record.value("skipped", false);
      s.loss_scale = number(record, "loss_scale");
      steps[step] = s;
    }
  }
  for (auto& [step, record] : steps) records.steps.push_back(record);
  return records;
}

double median_step_ms(const RunRecords& records) {
  const std::set<int64_t> first(records.process_first_steps.begin(), records.process_first_steps.end());
  std::vector<double> times;
  for (const StepRecord& s : records.steps)
    if (!first.count(s.step)) times.push_back(s.step_ms);
  if (times.empty())
    for (const StepRecord& s : records.steps) times.push_back(s.step_ms);
  return median(times);
}

std::vector<Warning> run_warnings(const RunRecords& records) {
  std::vector<Warning> warnings;
  const std::set<int64_t> first(records.process_first_steps.begin(), records.process_first_steps.end());
  const double median = median_step_ms(records);
  double previous_scale = 0;
  for (const StepRecord& s : records.steps) {
    if (!s.loss_finite)
      warnings.push_back({"non_finite_loss", s.step, strf("step %lld: the loss was not finite",
                                                          static_cast<long long>(s.step))});
    if (s.skipped)
      warnings.push_back({"skipped", s.step,
                          strf("step %lld: update skipped (non-finite gradients)", static_cast<long long>(s.step))});
    if (s.loss_scale > 0 && previous_scale > 0 && s.loss_scale < previous_scale)
      warnings.push_back({"loss_scale", s.step,
                          strf("step %lld: loss scale backed off from %g to %g", static_cast<long long>(s.step),
                               previous_scale, s.loss_scale)});
    if (s.loss_scale > 0) previous_scale = s.loss_scale;
    if (median > 0 && !first.count(s.step) && s.step_ms > kSlowStepFactor * median)
      warnings.push_back({"slow_step", s.step,
                          strf("step %lld: %.1f ms, %.1f× the median %.1f ms", static_cast<long long>(s.step),
                               s.step_ms, s.step_ms / median, median)});
  }
  for (const json& failure : records.failures) {
    const int64_t step = failure.value("step", int64_t{0});
    warnings.push_back({"failure", step, strf("step %lld: the run failed: %s", static_cast<long long>(step),
                                              text_of(failure, "message").c_str())});
  }
  return warnings;
}

const std::vector<std::string>& run_report_sections() {
  static const std::vector<std::string> sections = {"summary", "loss",    "throughput", "memory",  "step-time",
                                                    "startup", "config",  "checkpoints", "samples", "warnings"};
  return sections;
}

namespace {

std::string bytes_text(double bytes) {
  if (bytes >= 1024.0 * 1024 * 1024) return strf("%.2f GiB", bytes / (1024.0 * 1024 * 1024));
  if (bytes >= 1024.0 * 1024) return strf("%.1f MiB", bytes / (1024.0 * 1024));
  return strf("%.1f KiB", bytes / 1024.0);
}

std::string gib_tick(double gib) { return strf("%g GiB", gib); }

const char* kStyle = R"(
:root { --ink:#1d2330; --muted:#5b6475; --line:#e2e5ea; --accent:#2f6fd0; --warn:#b5470b; }
* { box-sizing: border-box; }
body { margin:0; background:#f4f5f7; color:var(--ink);
       font: 15px/1.45 -apple-system, "Segoe UI", "DejaVu Sans", "Liberation Sans", sans-serif; }
header { background:#1d2330; color:#fff; padding:18px 32px 14px; }
header h1 { margin:0 0 4px; font-size:22px; font-weight:600; }
header p { margin:0; color:#c9cfda; font-size:13px; }
nav { background:#fff; border-bottom:1px solid var(--line); padding:8px 32px; position:sticky; top:0; }
nav a { color:var(--accent); text-decoration:none; margin-right:16px; font-size:13px; }
main { max-width:960px; margin:0 auto; padding:16px 16px 40px; }
section { background:#fff; border:1px solid var(--line); border-radius:6px; padding:16px 20px; margin:16px 0; }
section h2 { margin:0 0 10px; font-size:17px; font-weight:600; }
.note { color:var(--muted); font-size:13px; margin:6px 0; }
.figures { display:grid; grid-template-columns:repeat(4, 1fr); gap:10px; }
.figure { border:1px solid var(--line); border-radius:5px; padding:8px 10px; }
.figure .label { color:var(--muted); font-size:12px; }
.figure .value { font-size:19px; font-weight:600; font-variant-numeric:tabular-nums; }
table { border-collapse:collapse; width:100%; font-size:13px; font-variant-numeric:tabular-nums; }
th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { color:var(--muted); font-weight:600; }
td.num, th.num { text-align:right; }
pre { background:#f7f8fa; border:1px solid var(--line); border-radius:4px; padding:10px 12px; font-size:12.5px;
      overflow-x:auto; white-space:pre-wrap; word-break:break-word; margin:6px 0; }
pre.config { max-height:420px; overflow-y:auto; white-space:pre; }
svg { max-width:100%; height:auto; display:block; margin:4px 0; }
ul.warnings { margin:4px 0; padding-left:20px; }
ul.warnings li { color:var(--warn); font-size:13px; }
.ok { color:#1e7b34; font-weight:600; }
)";

class Page {
 public:
  void add(const std::string& text) { body_ += text; }
  void open_section(const std::string& id, const std::string& title) {
    body_ += "<section id=\"" + id + "\"><h2>" + html(title) + "</h2>\n";
  }
  void close_section() { body_ += "</section>\n"; }
  void note(const std::string& text) { body_ += "<p class=\"note\">" + html(text) + "</p>\n"; }
  void figure(const std::string& id, const std::string& label, const std::string& value) {
    body_ += "<div class=\"figure\"><div class=\"label\">" + html(label) + "</div><div class=\"value\" id=\"" + id +
             "\">" + html(value) + "</div></div>\n";
  }
  void table(const std::vector<std::string>& header, const std::vector<std::vector<std::string>>& rows,
             const std::set<size_t>& numeric = {}) {
    body_ += "<table><tr>";
    for (size_t i = 0; i < header.size(); ++i)
      body_ += std::string(numeric.count(i) ? "<th class=\"num\">" : "<th>") + html(header[i]) + "</th>";
    body_ += "</tr>\n";
    for (const auto& row : rows) {
      body_ += "<tr>";
      for (size_t i = 0; i < row.size(); ++i)
        body_ += std::string(numeric.count(i) ? "<td class=\"num\">" : "<td>") + html(row[i]) + "</td>";
      body_ += "</tr>\n";
    }
    body_ += "</table>\n";
  }
  const std::string& body() const { return body_; }

 private:
  std::string body_;
};

struct ReportData {
  std::string run_dir;
  RunRecords records;
  json plan;  // null when absent
  std::string plan_problem;
  std::string config_text;
  const json* last_start = nullptr;
};

bool plan_available(const ReportData& data) { return data.plan.is_object() && data.plan.contains("memory"); }

std::string plan_target(const json& plan) {
  return strf("%d × %s", plan.value("gpus", 1), plan.value("gpu_name", std::string("?")).c_str());
}

void summary_section(Page& page, const ReportData& data) {
  const RunRecords& r = data.records;
  page.open_section("summary", "Summary");
  if (r.steps.empty()) {
    page.note("No training step is recorded in metrics.jsonl yet.");
    page.close_section();
    return;
  }
  const StepRecord& last = r.steps.back();
  page.add("<div class=\"figures\">\n");
  page.figure("steps-done", "steps", strf("%lld / %lld", static_cast<long long>(last.step),
                                            static_cast<long long>(last.steps)));
  page.figure("final-loss", "last loss", last.loss_finite ? strf("%.4f", last.loss) : "not finite");
  page.figure("final-val-loss", "last held-out loss",
              r.val_losses.empty() ? "none" : strf("%.4f", r.val_losses.rbegin()->second));
  page.figure("tokens-seen", "tokens trained", log::with_commas(static_cast<double>(last.tokens)));
  std::vector<double> speeds;
  for (const StepRecord& s : r.steps) speeds.push_back(s.tokens_per_s);
  page.figure("median-tokens-per-s", "median tokens/s", log::with_commas(median(speeds)));
  page.figure("median-step-ms", "median step", strf("%.1f ms", median_step_ms(r)));
  uint64_t peak = 0;
  for (const StepRecord& s : r.steps) peak = std::max(peak, s.peak_bytes);
  page.figure("peak-memory", "peak memory (live)", bytes_text(static_cast<double>(peak)));
  std::vector<double> mfus;
  for (const StepRecord& s : r.steps)
    if (s.mfu >= 0) mfus.push_back(s.mfu);
  page.figure("median-mfu", "median MFU", mfus.empty() ? "not known" : strf("%.1f%%", 100 * median(mfus)));
  page.add("</div>\n");
  std::string status;
  const std::string last_event = r.last_event.is_object() ? text_of(r.last_event, "event") : "";
  if (last_event == "failure")
    status = strf("failed at step %lld: %s", static_cast<long long>(r.last_event.value("step", int64_t{0})),
                  text_of(r.last_event, "message").c_str());
  else if (last_event == "stop")
    status = strf("stopped by signal %d at step %lld; running the same command again resumes it",
                  r.last_event.value("signal", 0), static_cast<long long>(r.last_event.value("step", int64_t{0})));
  else if (last.step >= last.steps)
    status = "finished";
  else
    status = strf("ended at step %lld of %lld without a stop record (still running, or killed)",
                  static_cast<long long>(last.step), static_cast<long long>(last.steps));
  page.add("<p class=\"note\">status: <span id=\"run-status\">" + html(status) + "</span>; " +
           html(strf("%zu process start(s), %zu stop(s) by signal, %zu failure(s)", r.starts.size(), r.stops.size(),
                     r.failures.size())) +
           "</p>\n");
  page.close_section();
}

void loss_section(Page& page, const ReportData& data) {
  page.open_section("loss", "Loss");
  LineChartSpec chart;
  chart.title = "training and held-out loss";
  LineSeries train{"training loss", "#2f6fd0", {}, false};
  for (const StepRecord& s : data.records.steps) train.points.emplace_back(s.step, s.loss);
  LineSeries val{"held-out loss", "#e07b00", {}, true};
  for (const auto& [step, loss] : data.records.val_losses) val.points.emplace_back(step, loss);
  chart.series.push_back(train);
  if (!val.points.empty()) chart.series.push_back(val);
  page.add(render_line_chart_svg(chart));
  if (data.records.val_losses.empty()) page.note("No held-out loss: the run has no data.val, or eval.every did not come due.");
  page.close_section();
}

void throughput_section(Page& page, const ReportData& data) {
  page.open_section("throughput", "Throughput and MFU");
  LineChartSpec speed;
  speed.title = "tokens/s (all ranks)";
  speed.y_from_zero = true;
  speed.y_tick = [](double v) { return log::with_commas(v); };
  LineSeries tokens{"tokens/s", "#2f6fd0", {}, false};
  LineSeries mfu{"MFU", "#8e44ad", {}, false};
  for (const StepRecord& s : data.records.steps) {
    tokens.points.emplace_back(s.step, s.tokens_per_s);
    if (s.mfu >= 0) mfu.points.emplace_back(s.step, 100 * s.mfu);
  }
  speed.series.push_back(tokens);
  page.add(render_line_chart_svg(speed));
  if (mfu.points.empty()) {
    page.note("MFU is not known for this run: it is measured against a GPU's dense peak, and the run had none "
              "the GPU catalog knows.");
  } else {
    LineChartSpec chart;
    chart.title = "model FLOPs utilisation (% of the dense peak)";
    chart.y_from_zero = true;
    chart.y_tick = [](double v) { return strf("%g%%", v); };
    chart.series.push_back(mfu);
    page.add(render_line_chart_svg(chart));
  }
  page.note("Every step's time runs from its first micro-batch to the end of its optimizer update; held-out "
            "evaluations, samples and checkpoints between steps are not in it.");
  page.close_section();
}

void memory_section(Page& page, const ReportData& data) {
  page.open_section("memory", "Memory");
  uint64_t peak = 0, reserved = 0;
  for (const StepRecord& s : data.records.steps) {
    peak = std::max(peak, s.peak_bytes);
    reserved = std::max(reserved, s.reserved_bytes);
  }
  const double gib = 1024.0 * 1024 * 1024;
  BarChartSpec chart;
  chart.title = "peak memory per GPU: measured (filled) and the planner's prediction (outline)";
  chart.x_tick = gib_tick;
  chart.rows.push_back({"measured peak (live)", {{peak / gib, "#2f6fd0", "measured"}}, bytes_text(peak), false});
  chart.rows.push_back({"measured peak (reserved)", {{reserved / gib, "#7fa7e3", "measured reserved"}},
                        bytes_text(reserved), false});
  double device_capacity = 0;
  if (data.last_start) device_capacity = number(*data.last_start, "device_memory_bytes");
  const bool comparable = plan_available(data) && data.plan.value("comparable", false);
  if (plan_available(data)) {
    const json& m = data.plan["memory"];
    const double live = number(m, "peak_live_bytes"), planned_reserved = number(m, "peak_reserved_bytes"),
                 total = number(m, "total_bytes");
    chart.rows.push_back({"planned peak (live)", {{live / gib, "#2f6fd0", ""}}, bytes_text(live), true});
    chart.rows.push_back({"planned peak (reserved)", {{planned_reserved / gib, "#7fa7e3", ""}},
                          bytes_text(planned_reserved), true});
    chart.rows.push_back({"planned total on the GPU", {{total / gib, "#555", "planned total (+ CUDA context, NCCL)"}},
                          bytes_text(total), true});
    // The capacity line only where the plan is for the run's GPU: a CPU run's megabytes against
    // an H200's 140 GiB would be flat lines (the table gives that capacity).
    if (comparable && device_capacity > 0) {
      chart.marker = device_capacity / gib;
      chart.marker_label = "capacity " + bytes_text(device_capacity);
    }
  } else if (device_capacity > 0 && data.last_start && text_of(*data.last_start, "device") == "cuda") {
    chart.marker = device_capacity / gib;
    chart.marker_label = "capacity " + bytes_text(device_capacity);
  }
  page.add(render_bar_chart_svg(chart));
  std::vector<std::vector<std::string>> rows = {{"measured peak (live)", bytes_text(peak)},
                                                {"measured peak (reserved)", bytes_text(reserved)}};
  if (plan_available(data)) {
    const json& m = data.plan["memory"];
    rows.push_back({"planned peak (live)", bytes_text(number(m, "peak_live_bytes"))});
    rows.push_back({"planned peak (reserved)", bytes_text(number(m, "peak_reserved_bytes"))});
    rows.push_back({"planned total (reserved + CUDA context + NCCL)", bytes_text(number(m, "total_bytes"))});
    rows.push_back({"capacity of the planned GPU", bytes_text(number(m, "capacity_bytes"))});
    if (!m.value("peak_at", std::string()).empty()) rows.push_back({"planned peak at", m.value("peak_at", std::string())});
  }
  if (device_capacity > 0) rows.push_back({"this run's device memory", bytes_text(device_capacity)});
  page.table({"", "bytes"}, rows, {1});
  if (!plan_available(data))
    page.note("No prediction: " + (data.plan_problem.empty() ? "the run directory has no plan.json" : data.plan_problem));
  else if (!comparable)
    page.note("The planner models GPUs; this run was on " + data.plan.value("run_device", std::string("another device")) +
              ", so the prediction is what the same config needs on " + plan_target(data.plan) +
              ", not a forecast of this run's figures.");
  page.close_section();
}

void step_time_section(Page& page, const ReportData& data) {
  page.open_section("step-time", "Step time: the planner's breakdown and the measured step");
  const double measured_ms = median_step_ms(data.records);
  BarChartSpec chart;
  chart.title = "one optimizer step (ms)";
  chart.x_tick = [](double v) { return strf("%g", v); };
  std::vector<std::vector<std::string>> rows;
  if (plan_available(data) && data.plan.contains("time")) {
    const json& t = data.plan["time"];
    struct Part {
      const char* key;
      const char* name;
      const char* color;
    };
    const Part parts[] = {{"gemm_s", "GEMMs", "#2f6fd0"},
                          {"attention_s", "attention", "#16a085"},
                          {"memory_bound_s", "memory-bound ops", "#e07b00"},
                          {"recompute_s", "recompute", "#8e44ad"},
                          {"optimizer_s", "optimizer", "#c0392b"},
                          {"communication_exposed_s", "exposed communication", "#7f8c8d"}};
    BarRow planned{"planned, " + plan_target(data.plan), {}, "", false};
    double sum = 0;
    for (const Part& part : parts) {
      const double ms = 1e3 * number(t, part.key);
      planned.segments.push_back({ms, part.color, part.name});
      rows.push_back({std::string("planned ") + part.name, strf("%.2f", ms)});
      sum += ms;
    }
    const double step_ms = 1e3 * number(t, "step_s");
    planned.value_text = strf("%.1f ms", step_ms);
    rows.push_back({"planned step", strf("%.2f", step_ms)});
    if (std::fabs(sum - step_ms) > 0.01 * step_ms)
      rows.push_back({"(parts do not add up: the step overlaps communication or launches)", strf("%.2f", sum)});
    chart.rows.push_back(planned);
  }
  chart.rows.push_back({"measured (median)", {{measured_ms, "#1d2330", "measured"}}, strf("%.1f ms", measured_ms), false});
  rows.push_back({"measured step (median)", strf("%.2f", measured_ms)});
  page.add(render_bar_chart_svg(chart));
  if (plan_available(data)) {
    std::vector<double> speeds;
    for (const StepRecord& s : data.records.steps) speeds.push_back(s.tokens_per_s);
    rows.push_back({"planned tokens/s", log::with_commas(number(data.plan, "tokens_per_s"))});
    if (!speeds.empty()) rows.push_back({"measured tokens/s (median)", log::with_commas(median(speeds))});
    const double mfu = number(data.plan, "mfu", -1);
    if (mfu >= 0) rows.push_back({"planned MFU", strf("%.1f%%", 100 * mfu)});
  }
  page.table({"", "ms or rate"}, rows, {1});
  if (!plan_available(data))
    page.note("No prediction: " + (data.plan_problem.empty() ? "the run directory has no plan.json" : data.plan_problem));
  else if (!data.plan.value("comparable", false))
    page.note("The planner prices GPU kernels; this run was on " + data.plan.value("run_device", std::string("?")) +
              ": the planned bar is the same config on " + plan_target(data.plan) + ".");
  page.close_section();
}

void startup_section(Page& page, const ReportData& data) {
  page.open_section("startup", "Start-up");
  if (data.records.starts.empty()) {
    page.note("metrics.jsonl has no start record (a run of an mxtrain before the run report).");
    page.close_section();
    return;
  }
  std::vector<std::vector<std::string>> rows;
  for (const json& start : data.records.starts) {
    const std::string resumed = text_of(start, "resumed_from");
    rows.push_back({text_of(start, "started_utc"),
                    strf("%lld", static_cast<long long>(start.value("step", int64_t{0}))),
                    text_of(start, "device_name") + (number(start, "device_memory_bytes") > 0
                                                         ? " (" + bytes_text(number(start, "device_memory_bytes")) + ")"
                                                         : ""),
                    strf("%d", start.value("world_size", 1)), text_of(start, "precision"), text_of(start, "recompute"),
                    text_of(start, "strategy"), text_of(start, "commit"),
                    resumed.empty() ? "fresh start" : resumed});
  }
  page.table({"started (UTC)", "at step", "device", "ranks", "precision", "recompute", "sharding", "commit",
              "resumed from"},
             rows);
  const json& last = *data.last_start;
  std::vector<std::vector<std::string>> facts;
  for (const char* key : {"model", "parameters", "batch", "precision_detail", "mxtrain_version"})
    if (!text_of(last, key).empty()) facts.push_back({key, text_of(last, key)});
  page.table({"latest start", ""}, facts);
  page.close_section();
}

void config_section(Page& page, const ReportData& data) {
  page.open_section("config", "Effective config");
  if (data.config_text.empty())
    page.note("config.toml is missing from the run directory.");
  else
    page.add("<pre class=\"config\">" + html(data.config_text) + "</pre>\n");
  page.close_section();
}

void checkpoints_section(Page& page, const ReportData& data) {
  page.open_section("checkpoints", "Checkpoints");
  std::vector<std::vector<std::string>> rows;
  std::set<std::string> listed;
  for (const CheckpointEvent& c : data.records.checkpoints) {
    const bool kept = fs::exists(fs::path(c.path) / "manifest.json") ||
                      fs::exists(fs::path(data.run_dir) / "checkpoints" / fs::path(c.path).filename() / "manifest.json");
    rows.push_back({strf("%lld", static_cast<long long>(c.step)), c.path, strf("%.1f s", c.seconds),
                    bytes_text(static_cast<double>(c.bytes)), kept ? "yes" : "no (pruned: checkpoint.keep)"});
    listed.insert(fs::path(c.path).filename().string());
  }
  std::error_code error;
  const fs::path directory = fs::path(data.run_dir) / "checkpoints";
  std::vector<std::string> unlisted;
  if (fs::is_directory(directory, error))
    for (const auto& entry : fs::directory_iterator(directory, error)) {
      const std::string name = entry.path().filename().string();
      if (fs::exists(entry.path() / "manifest.json") && !listed.count(name)) unlisted.push_back(name);
    }
  std::sort(unlisted.begin(), unlisted.end());
  for (const std::string& name : unlisted) rows.push_back({"", (directory / name).string(), "", "", "yes"});
  if (rows.empty())
    page.note("No checkpoint was written.");
  else
    page.table({"step", "directory", "write time", "size", "on disk now"}, rows, {0, 2, 3});
  page.close_section();
}

void samples_section(Page& page, const ReportData& data) {
  page.open_section("samples", "Generated samples");
  if (data.records.samples.empty()) page.note("No samples: set log.sample_every = N to generate one every N steps.");
  for (const auto& [step, text] : data.records.samples) {
    page.add(strf("<p class=\"note\">step %lld</p>\n", static_cast<long long>(step)));
    page.add("<pre>" + html(text) + "</pre>\n");
  }
  page.close_section();
}

void warnings_section(Page& page, const ReportData& data) {
  page.open_section("warnings", "Warnings");
  const std::vector<Warning> warnings = run_warnings(data.records);
  page.note(strf("A step is slow when it takes more than %.0f× the run's median step time (%.1f ms), a process's "
                 "first step (warm-up) excluded.",
                 kSlowStepFactor, median_step_ms(data.records)));
  if (warnings.empty()) {
    page.add("<p class=\"ok\" id=\"no-warnings\">No skipped updates, loss-scale backoffs, non-finite losses or slow "
             "steps.</p>\n");
    page.close_section();
    return;
  }
  std::map<std::string, int> counts;
  for (const Warning& w : warnings) ++counts[w.kind];
  std::string summary;
  for (const auto& [kind, count] : counts) summary += strf("%s%s: %d", summary.empty() ? "" : ", ", kind.c_str(), count);
  page.note(summary);
  page.add("<ul class=\"warnings\">\n");
  const size_t shown = std::min<size_t>(warnings.size(), 50);
  for (size_t i = 0; i < shown; ++i)
    page.add("<li data-kind=\"" + warnings[i].kind + "\">" + html(warnings[i].text) + "</li>\n");
  page.add("</ul>\n");
  if (shown < warnings.size()) page.note(strf("and %zu more", warnings.size() - shown));
  page.close_section();
}

}  // namespace

std::string render_run_report(const RunReportInputs& inputs) {
  ReportData data;
  data.run_dir = inputs.run_dir;
  const std::string metrics_path = inputs.metrics_path.empty() ? inputs.run_dir + "/metrics.jsonl" : inputs.metrics_path;
  data.records = read_run_records(metrics_path);
  if (!data.records.starts.empty()) data.last_start = &data.records.starts.back();
  const std::string plan_path = inputs.run_dir + "/plan.json";
  const std::string plan_text = read_text(plan_path);
  if (!plan_text.empty()) {
    try {
      data.plan = json::parse(plan_text);
      if (data.plan.contains("error")) data.plan_problem = "the planner failed at start: " + text_of(data.plan, "error");
    } catch (const json::exception&) {
      data.plan_problem = plan_path + " is not JSON";
      data.plan = nullptr;
    }
  }
  data.config_text = read_text(inputs.run_dir + "/config.toml");

  Page page;
  summary_section(page, data);
  loss_section(page, data);
  throughput_section(page, data);
  memory_section(page, data);
  step_time_section(page, data);
  startup_section(page, data);
  config_section(page, data);
  checkpoints_section(page, data);
  samples_section(page, data);
  warnings_section(page, data);

  std::string title = "mxtrain run report: " + inputs.run_dir;
  std::string subtitle;
  if (data.last_start)
    subtitle = text_of(*data.last_start, "model") + " · " + text_of(*data.last_start, "device_name") + " · " +
               text_of(*data.last_start, "precision");
  std::string nav;
  for (const std::string& id : run_report_sections()) nav += "<a href=\"#" + id + "\">" + id + "</a>";
  return "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
         "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">\n"
         "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>" +
         html(title) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n<header><h1>" + html(title) +
         "</h1><p>" + html(subtitle) + "</p></header>\n<nav>" + nav + "</nav>\n<main>\n" + page.body() +
         "</main>\n</body>\n</html>\n";
}

std::string write_run_report(const RunReportInputs& inputs, const std::string& out_path) {
  const std::string path = out_path.empty() ? inputs.run_dir + "/report.html" : out_path;
  write_file_atomically(path, render_run_report(inputs), "give --out a writable path, or free space in the run directory");
  return path;
}

}  // namespace mxtrain
