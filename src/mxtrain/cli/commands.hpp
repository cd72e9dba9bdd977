// The subcommands. Each lives in its own file (cli/<name>_command.cpp) and registers its
// options on a CLI11 subcommand; run() parses argv and dispatches.
#pragma once
#include <memory>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace mxtrain::cli {

int run(int argc, char** argv);

// Each adds its subcommand to `app` and returns a callable flag: the subcommand sets its
// own callback. Definitions in the command files.
void add_version_command(CLI::App& app);
// `train` reads `hyperparameter_arguments` when it runs: run() fills it with the `--name value`
// arguments train does not know, which are SageMaker hyperparameters (and errors outside a job).
void add_train_command(CLI::App& app, std::shared_ptr<std::vector<std::string>> hyperparameter_arguments);
void add_prepare_command(CLI::App& app);
void add_bench_command(CLI::App& app);
void add_launch_command(CLI::App& app);
void add_plan_command(CLI::App& app);
void add_tune_command(CLI::App& app);
void add_compare_precision_command(CLI::App& app);
void add_export_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_report_command(CLI::App& app);

}  // namespace mxtrain::cli
