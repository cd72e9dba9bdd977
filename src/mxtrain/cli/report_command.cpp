// `mxtrain report RUN_DIR [--out FILE]`: the run report (report/run_report.hpp) of a run
// directory, written to RUN_DIR/report.html unless --out says otherwise. The trainer writes the
// same page at the end of a run and on stop; this command rewrites it at any time, also while the
// run goes on (it only reads the run's files).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "mxtrain/cli/commands.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/report/run_report.hpp"

namespace mxtrain::cli {
namespace {

struct ReportArguments {
  std::string run_dir, out;
};

void run_report(const ReportArguments& arguments) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(arguments.run_dir))
    throw Error(ErrorKind::config, arguments.run_dir + " is not a directory",
                "give the run directory of a training run (checkpoint.dir, -o; runs/<model> by default)");
  RunReportInputs inputs;
  inputs.run_dir = arguments.run_dir;
  // The metrics file's name is a config key (log.metrics): the run's saved config says which.
  std::string metrics = "metrics.jsonl";
  const std::string config_path = arguments.run_dir + "/config.toml";
  if (fs::exists(config_path)) {
    ConfigSources sources;
    sources.toml_path = config_path;
    sources.read_environment = false;
    metrics = load_config(sources).log.metrics;
  }
  inputs.metrics_path = arguments.run_dir + "/" + metrics;
  const std::string path = write_run_report(inputs, arguments.out);
  std::printf("report: %s\n", path.c_str());
}

}  // namespace

void add_report_command(CLI::App& app) {
  auto arguments = std::make_shared<ReportArguments>();
  CLI::App* command = app.add_subcommand(
      "report", "Write a training run's report: one self-contained HTML page (curves, memory, plan, checkpoints)");
  command->footer(
      "Reads the run directory (metrics.jsonl, plan.json, config.toml, checkpoints/) and writes one HTML\n"
      "page with inline SVG charts and no external resources. `mxtrain train` writes the same page to\n"
      "RUN_DIR/report.html when a run ends or stops.\n"
      "Example: mxtrain report runs/tiny --out tiny-report.html");
  command->add_option("run_dir", arguments->run_dir, "The run directory (checkpoint.dir of the run)")
      ->required()
      ->type_name("DIR");
  command->add_option("--out", arguments->out, "Where to write the page (default RUN_DIR/report.html)")
      ->type_name("FILE");
  command->callback([arguments]() { run_report(*arguments); });
}

}  // namespace mxtrain::cli
