#include <CLI/CLI.hpp>

#include <cstdlib>
#include <string>

#include "mxtrain/cli/commands.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain::cli {

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
  add_train_command(app);
  add_prepare_command(app);
  add_bench_command(app);
  add_launch_command(app);
  add_plan_command(app);
  add_tune_command(app);
  add_compare_precision_command(app);
  add_export_command(app);
  add_generate_command(app);
  add_version_command(app);
  // CLI11 answers an unknown verb with "A subcommand is required": name it instead.
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
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& error) {
    return app.exit(error);
  }
  return 0;
}

}  // namespace mxtrain::cli
