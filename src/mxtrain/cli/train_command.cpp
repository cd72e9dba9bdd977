#include <CLI/CLI.hpp>
#include <cstdio>
#include <memory>

#include "mxtrain/build_info.hpp"
#include "mxtrain/cli/commands.hpp"
#include "mxtrain/cli/flags.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/train/trainer.hpp"

namespace mxtrain::cli {

void add_train_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "train", "train a model; with no arguments, the embedded default (a 3M-parameter byte-level Llama on the "
               "fortunes corpus prepared by scripts/setup.sh)");
  auto arguments = std::make_shared<ConfigArguments>();
  auto print_config = std::make_shared<bool>(false);
  add_config_arguments(*command, *arguments, train_flags());
  command->add_flag_callback(
      "--resume", [arguments] { arguments->flag_values.emplace_back("checkpoint.resume", "always"); },
      "require resuming from the run directory's newest valid checkpoint [checkpoint.resume=always]");
  command->add_flag_callback(
      "--no-resume", [arguments] { arguments->flag_values.emplace_back("checkpoint.resume", "never"); },
      "start fresh; refuses a run directory that already has checkpoints [checkpoint.resume=never]");
  command->add_flag("--print-config", *print_config, "print the effective config as TOML and exit");
  command->callback([arguments, print_config] {
    ConfigSources sources;
    sources.toml_path = arguments->config_path;
    sources.overrides = overrides(*arguments);
    RunConfig config = load_config(sources);
    if (*print_config) {
      std::fputs(config_to_toml(config).c_str(), stdout);
      return;
    }
    TrainerContext context;
    context.source_dir = MXTRAIN_SOURCE_DIR;
    Trainer(config, context).run();
  });
}

}  // namespace mxtrain::cli
