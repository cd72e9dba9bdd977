// `mxtrain tune`: short timed trials of the planner's best candidates (or a brute-force grid) on
// this machine's GPU; the work is plan/tune.cpp, this file parses and writes the outputs.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/cli/bounds.hpp"
#include "mxtrain/cli/commands.hpp"
#include "mxtrain/cli/flags.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/plan/tune.hpp"

namespace mxtrain::cli {
namespace {

struct TuneArguments {
  ConfigArguments config;
  TuneOptions options;
  std::string gpu;
  std::string precisions;  // "" = the config's precision
  std::string out_dir;
  std::string calibration_path;
};

// The catalog key of the GPU the trials will run on.
std::string detect_gpu() {
  if (!backend_available("cuda"))
    throw Error(ErrorKind::config, "tune runs its trials on a GPU, and this machine has none usable by mxtrain",
                "run it on the GPU machine, or pass --dry-run --gpu h200 to see the trials it would run");
  const std::string name = create_backend("cuda")->properties().name;
  const GpuSpec* gpu = find_gpu(name);
  if (!gpu)
    throw Error(ErrorKind::config, "the planner has no model of the GPU '" + name + "'",
                "pass --gpu with the closest of h100, h200, b200, b300");
  return gpu->key;
}

void run_tune(TuneArguments& arguments) {
  ConfigSources sources;
  sources.toml_path = arguments.config.config_path;
  sources.overrides = overrides(arguments.config);
  RunConfig config = load_run_config(sources);
  TuneOptions options = arguments.options;
  options.target.gpu = arguments.gpu.empty() ? (options.dry_run ? "h200" : detect_gpu()) : arguments.gpu;
  options.target.gpus = 1;
  options.precisions = precision_list(arguments.precisions, config);
  if (!options.dry_run && config.train.device == "auto") config.train.device = "cuda";
  const Calibration calibration = Calibration::load(arguments.calibration_path);
  const TuneResult result = tune(config, options, calibration, run_benchmark);
  std::fputs(format_tune(result).c_str(), stdout);
  if (options.dry_run) return;

  const std::string dir = arguments.out_dir.empty() ? "runs/tune-" + config.model.preset : arguments.out_dir;
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw Error(ErrorKind::system, "cannot create " + dir + ": " + error.message(), "pass --out DIR");
  write_file_atomically(dir + "/tune.json", tune_json(result).dump(2) + "\n");
  write_file_atomically(dir + "/tune.csv", tune_csv(result));
  write_file_atomically(dir + "/tune.svg", tune_svg(result));
  std::printf("wrote %s/tune.json, tune.csv, tune.svg\n", dir.c_str());
  if (!result.calibration_overlay.is_null()) {
    write_file_atomically(dir + "/calibration.json", result.calibration_overlay.dump(2) + "\n");
    std::printf("wrote %s/calibration.json: plan with --calibration %s/calibration.json, or merge it into "
                "configs/plan/calibration.json to commit it\n",
                dir.c_str(), dir.c_str());
  }
  if (result.best < 0)
    throw Error(ErrorKind::out_of_memory, "no trial fitted on this GPU",
                "lower train.micro_batch_size or train.seq_len, or turn on --recompute full");
}

}  // namespace

void add_tune_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "tune", "time the planner's best candidates on this machine's GPU (short trials; out-of-memory is 'does not "
              "fit'), pick the fastest, write JSON, CSV, an SVG chart and a calibration overlay");
  auto arguments = std::make_shared<TuneArguments>();
  add_config_arguments(*command, arguments->config, train_flags());
  TuneArguments& a = *arguments;
  command->add_option("--gpu", a.gpu, "GPU type of this machine (default: detected)");
  command->add_option("--top", a.options.top, "planner candidates to try")->capture_default_str()->check(integer_range(1, 10000));
  command->add_flag("--grid", a.options.grid,
                    "try every micro-batch x checkpointing (none, selective, full) x precision instead");
  command->add_option("--precisions", a.precisions,
                      "precisions to try, comma-separated (default: the config's, -p; auto = bf16)");
  command->add_option("--headroom", a.options.headroom, "memory the planner keeps free, as a fraction")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 0.5));
  command->add_option("--warmup", a.options.bench.warmup_steps, "untimed steps per trial")
      ->capture_default_str()
      ->check(integer_range(0, 1000000));
  command->add_option("--timed", a.options.bench.timed_steps, "timed steps per trial")
      ->capture_default_str()
      ->check(integer_range(1, 1000000));
  command->add_option("--out", a.out_dir, "directory for tune.json, tune.csv, tune.svg, calibration.json "
                                          "(default runs/tune-<preset>)");
  command->add_option("--calibration", a.calibration_path, "calibration overlay for the planner's predictions");
  command->add_flag("--dry-run", a.options.dry_run, "list the trials with the planner's predictions, run nothing");
  command->callback([arguments] { run_tune(*arguments); });
}

}  // namespace mxtrain::cli
