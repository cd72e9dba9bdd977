// The command line as declarative tables (docs/conventions.md #9): each short flag maps to one config key,
// so parsing, help text with live defaults, MXTRAIN_* variables and config files all agree.
// tests/cli/flags_test.cpp checks the tables for duplicates and against a committed list.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include "mxtrain/config/loader.hpp"

namespace CLI {
class App;
}

namespace mxtrain::cli {

struct FlagSpec {
  std::string names;  // CLI11 syntax: "-b,--batch"
  std::string key;    // config key it sets
};

const std::vector<FlagSpec>& train_flags();  // train and bench share them

// Collects a command's config inputs: optional CONFIG file, --set key=value, the short flags.
struct ConfigArguments {
  std::string config_path;
  std::vector<std::string> assignments;                         // --set, in order
  std::vector<std::pair<std::string, std::string>> flag_values; // short flags (applied after --set)
};

// Registers CONFIG, --set, the flag table and --help-config on `command`.
void add_config_arguments(CLI::App& command, ConfigArguments& arguments, const std::vector<FlagSpec>& flags);
// The overrides in precedence order: --set, then short flags.
std::vector<std::pair<std::string, std::string>> overrides(const ConfigArguments& arguments);
// Every config key with its type, default and help (for --help-config).
std::string config_reference();
// The same list as the Markdown table of docs/config-reference.md (key, type, default, accepted
// values, meaning); a test keeps that file equal to it.
std::string config_reference_markdown();

// load_config, then model.init_from applied (the shape of a Hugging Face model directory): what
// every subcommand that takes a run config uses.
RunConfig load_run_config(const ConfigSources& sources);

}  // namespace mxtrain::cli
