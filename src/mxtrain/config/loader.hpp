// Where a RunConfig comes from, in increasing precedence: the built-in defaults (the embedded
// default run), a TOML file, MXTRAIN_* environment variables, then --set key=value and the
// short flags, in command-line order. model.preset is applied before any other key from any
// source, so "preset plus overrides" means the same thing wherever the pieces come from.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "mxtrain/config/run_config.hpp"

namespace mxtrain {

struct ConfigSources {
  std::string toml_path;                 // "" = none
  std::string toml_text;                 // parsed instead of a file when not empty (tests)
  std::vector<std::pair<std::string, std::string>> overrides;  // key, value; command-line order
  bool read_environment = true;
};

RunConfig load_config(const ConfigSources& sources);

// "MXTRAIN_TRAIN_MICRO_BATCH_SIZE" for "train.micro_batch_size".
std::string environment_name(const std::string& key);
// Splits "key=value"; throws Error(config) without '='.
std::pair<std::string, std::string> parse_assignment(const std::string& text);

// The effective config as TOML, every key, grouped by section (printed at start, saved as
// config.toml in the run directory, loadable again).
std::string config_to_toml(RunConfig& config);
nlohmann::json config_to_json(RunConfig& config);
RunConfig config_from_json(const nlohmann::json& json);
// Keys whose values differ between a and b, restricted to keys starting with one of prefixes
// (all keys when prefixes is empty).
std::vector<std::string> config_differences(RunConfig& a, RunConfig& b, const std::vector<std::string>& prefixes = {});

}  // namespace mxtrain
