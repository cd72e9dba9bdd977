// `mxtrain plan`: memory breakdown and predicted speed of a config on a GPU type and count,
// ranked recommendations (--recommend), and the planner's accuracy harness (--accuracy-configs).
// The options are one table (plan_options below); the work lives in plan/.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <fstream>
#include <memory>

#include "mxtrain/cli/bounds.hpp"
#include "mxtrain/cli/commands.hpp"
#include "mxtrain/cli/flags.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/plan/accuracy.hpp"
#include "mxtrain/plan/planner.hpp"
#include "mxtrain/plan/recommend.hpp"

namespace mxtrain::cli {
namespace {

struct PlanArguments {
  ConfigArguments config;
  PlanTarget target;
  PlanOptions options;
  RecommendOptions recommend;
  std::string calibration_path;
  std::string output_path;
  std::string accuracy_configs;
  std::string cross_validate;
  std::string precisions;  // "" = the config's precision
  bool json = false;
  bool summary = false;
  bool do_recommend = false;
  bool measure = false;
};

void emit(const PlanArguments& arguments, const std::string& human, const nlohmann::json& json) {
  const std::string text = arguments.json ? json.dump(2) + "\n" : human;
  std::fputs(text.c_str(), stdout);
  if (!arguments.output_path.empty()) write_file_atomically(arguments.output_path, json.dump(2) + "\n");
}

void run_plan(const PlanArguments& arguments) {
  const Calibration calibration = Calibration::load(arguments.calibration_path);
  if (!arguments.cross_validate.empty()) {
    const nlohmann::json result = cross_validate_step_times(arguments.cross_validate, calibration);
    emit(arguments, format_cross_validation(result), result);
    return;
  }
  if (!arguments.accuracy_configs.empty()) {
    AccuracyOptions options;
    options.measure = arguments.measure;
    options.steps = arguments.options.steps;
    options.progress_path = arguments.output_path;
    const nlohmann::json report = run_accuracy_harness(arguments.accuracy_configs, arguments.target.gpu, calibration,
                                                       options);
    emit(arguments, format_accuracy(report), report);
    return;
  }
  if (arguments.summary && !arguments.do_recommend)
    throw Error(ErrorKind::config, "--summary prints a recommendation's table row", "add --recommend");
  ConfigSources sources;
  sources.toml_path = arguments.config.config_path;
  sources.overrides = overrides(arguments.config);
  const RunConfig config = load_run_config(sources);
  if (arguments.do_recommend) {
    RecommendOptions options = arguments.recommend;
    options.precisions = precision_list(arguments.precisions, config);
    options.headroom = arguments.options.headroom;
    const Recommendation recommendation = recommend(config, arguments.target, calibration, options);
    emit(arguments,
         arguments.summary ? recommendation_summary_row(recommendation) : format_recommendation(recommendation),
         recommendation_json(recommendation));
    return;
  }
  const Plan plan = make_plan(config, arguments.target, calibration, arguments.options);
  emit(arguments, format_plan(plan), plan_json(plan));
}

}  // namespace

void add_plan_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "plan", "memory breakdown and predicted throughput of a config on a GPU type and count, from a dry run of the "
              "real training step (no GPU needed); --recommend ranks the configs that fit");
  auto arguments = std::make_shared<PlanArguments>();
  add_config_arguments(*command, arguments->config, train_flags());
  PlanArguments& a = *arguments;
  command->add_option("--gpu", a.target.gpu, "GPU type: h100, h200, b200 or b300")->capture_default_str();
  command->add_option("--gpus", a.target.gpus, "GPUs in total")->capture_default_str()->check(integer_range(1, kMaxRanks));
  command->add_option("--nodes", a.target.nodes, "nodes the GPUs are spread over (0 = as few as hold them, 8 each)")
      ->capture_default_str()
      ->check(integer_range(0, kMaxRanks));
  command->add_flag("--json", a.json, "print JSON instead of the tables");
  command->add_option("--out", a.output_path, "also write the JSON to this file");
  command->add_option("--calibration", a.calibration_path,
                      "calibration overlay read over configs/plan/calibration.json (mxtrain tune writes one)");
  command->add_option("--plan-steps", a.options.steps, "dry-run steps (allocator peaks are over all of them)")
      ->capture_default_str()
      ->check(integer_range(1, 100));
  command->add_option("--headroom", a.options.headroom, "memory to keep free, as a fraction of the GPU's")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  command->add_flag("--recommend", a.do_recommend, "search and rank the configs that fit (see --objective)");
  command->add_flag("--summary", a.summary,
                    "with --recommend: one Markdown table row (model, GPUs, fits, config, memory, tokens/s, MFU)");
  command->add_option("--objective", a.recommend.objective,
                      "throughput (most tokens/s), context (longest sequence at a useful throughput) or gpus "
                      "(fewest GPUs reaching --target-tokens-per-s)")
      ->capture_default_str()
      ->check(CLI::IsMember({"throughput", "context", "gpus"}));
  command->add_option("--precisions", a.precisions,
                      "precisions the search may use, comma-separated (default: the config's, -p; auto = bf16)");
  command->add_option("--target-tokens-per-s", a.recommend.target_tokens_per_s,
                      "throughput the gpus objective must reach (global tokens/s)")
      ->check(CLI::Range(0.0, 1e15));
  command->add_option("--max-gpus", a.recommend.max_gpus, "largest GPU count the gpus objective tries")
      ->capture_default_str()
      ->check(integer_range(1, kMaxRanks));
  command->add_option("--max-seq", a.recommend.max_seq_len, "longest sequence the context objective tries")
      ->capture_default_str()
      ->check(integer_range(2, int64_t{1} << 22));
  command->add_option("--top", a.recommend.top, "ranked configs to show")->capture_default_str()->check(integer_range(1, 10000));
  command->add_option("--accuracy-configs", a.accuracy_configs,
                      "plan every config of this JSON list (bench/planner_accuracy_configs.json) for --gpu; with "
                      "--measure also run each with `bench` on this machine's GPU and compare")
      ->check(CLI::ExistingFile);
  command->add_option("--cross-validate", a.cross_validate,
                      "leave-one-out check of the step-time calibration on a measured accuracy report "
                      "(bench/results/planner_accuracy.json): each config predicted by a fit to the others")
      ->check(CLI::ExistingFile);
  command->add_flag("--measure", a.measure, "with --accuracy-configs: measure on the GPU (needs the cuda backend)");
  command->callback([arguments] { run_plan(*arguments); });
}

}  // namespace mxtrain::cli
