#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <vector>
#include <string>

#include "mxtrain/cli/commands.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain::cli {
namespace {

// `mxtrain train ARGS`: the arguments from the first option `train` does not know on, which
// SageMaker's script mode passes as `--name value` hyperparameters; cut off `arguments` (in
// order, the subcommand first) so CLI11 parses the rest. CLI11 would take the value after an
// unknown option as the CONFIG positional.
std::vector<std::string> split_hyperparameter_arguments(const CLI::App& train, std::vector<std::string>& arguments) {
  if (arguments.empty() || arguments.front() != train.get_name()) return {};
  size_t index = 1;
  while (index < arguments.size()) {
    const std::string& argument = arguments[index];
    if (argument.size() < 2 || argument[0] != '-') {  // the CONFIG positional
      ++index;
      continue;
    }
    const bool long_name = argument.rfind("--", 0) == 0;
    const std::string name = long_name ? argument.substr(0, argument.find('=')) : argument.substr(0, 2);
    const CLI::Option* option = train.get_option_no_throw(name);
    if (!option) break;
    const bool value_attached = long_name ? argument.find('=') != std::string::npos : argument.size() > 2;
    index += option->get_items_expected_max() == 0 || value_attached ? 1 : 2;  // a flag, or --name=value
  }
  std::vector<std::string> rest(arguments.begin() + static_cast<std::ptrdiff_t>(std::min(index, arguments.size())),
                                arguments.end());
  arguments.resize(std::min(index, arguments.size()));
  return rest;
}

}  // namespace

int run(int argc, char** argv) {
  // MXTRAIN_LOG_LEVEL: the least severe log line printed (info by default).
  if (const char* setting = std::getenv("MXTRAIN_LOG_LEVEL"); setting && *setting) {
    log::Level level = log::Level::info;
    if (!log::parse_level(setting, &level))
      throw Error(ErrorKind::config, std::string("MXTRAIN_LOG_LEVEL=") + setting + " is not a log level",
                  "use debug, info, warn or error (or unset it: info)");
    log::set_level(level);
  }
  CLI::App app{"mxtrain: train decoder-only transformers on NVIDIA GPUs (and CPUs), plan their memory and speed, "
               "and tune them"};
  app.require_subcommand(1);
  app.fallthrough(false);
  auto hyperparameter_arguments = std::make_shared<std::vector<std::string>>();
  add_train_command(app, hyperparameter_arguments);
  add_prepare_command(app);
  add_bench_command(app);
  add_launch_command(app);
  add_plan_command(app);
  add_tune_command(app);
  add_compare_precision_command(app);
  add_export_command(app);
  add_generate_command(app);
  add_report_command(app);
  add_version_command(app);
  // The command comes first; CLI11 would answer a missing, misplaced or unknown one with "A
  // subcommand is required", naming nothing.
  std::string verbs;
  bool known = false;
  const std::string first = argc > 1 ? argv[1] : "";
  for (const CLI::App* command : app.get_subcommands({})) {
    verbs += (verbs.empty() ? "" : ", ") + command->get_name();
    known = known || (argc > 1 && command->check_name(first));
  }
  const std::string usage = "write `mxtrain COMMAND [options]` with COMMAND one of: " + verbs +
                            " (`mxtrain --help` describes each)";
  if (argc < 2) throw Error(ErrorKind::config, "no command given", usage);
  if (first != "-h" && first != "--help" && !known)
    throw Error(ErrorKind::config,
                first.rfind('-', 0) == 0 ? "option '" + first + "' before the command" : "unknown command '" + first + "'",
                usage);
  std::vector<std::string> arguments(argv + 1, argv + argc);
  *hyperparameter_arguments = split_hyperparameter_arguments(*app.get_subcommand("train"), arguments);
  std::reverse(arguments.begin(), arguments.end());  // CLI11 takes them last first
  try {
    app.parse(arguments);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  return 0;
}

}  // namespace mxtrain::cli
