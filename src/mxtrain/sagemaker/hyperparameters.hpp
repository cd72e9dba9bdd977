// SageMaker hyperparameters → config overrides. A hyperparameter arrives three ways, read in
// this order (a later one wins): hyperparameters.json (every value a string), SM_HP_<NAME>
// variables (the name upper-cased) and `--name value` arguments. A name is
//   - a config key, dotted or with dashes or underscores in any place of the dots
//     (`train.micro_batch_size`, `train-micro-batch-size`), in any case;
//   - one of the seed's names (hyperparameter_aliases(): `model`, `precision`, `num-layers`,
//     `batch-size`, `seq-length`, `steps`, ...);
//   - `config` (a TOML file), `train-channel` or `validation-channel` (which channels hold the data),
//     `text-field` (alias `dataset-text-field`) and `val-fraction` (how documents are prepared);
//   - SageMaker's own `sagemaker_*` names, which are reported and otherwise ignored.
// Anything else is an error that lists the accepted names; a bad value is an error naming the
// hyperparameter and the config key. parse_hyperparameters() is pure (text in, overrides out,
// only mxtrain::Error thrown), so a fuzzer can call it.
#pragma once
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace mxtrain::sagemaker {

struct Hyperparameter {
  std::string name, value;
  std::string origin;  // "hyperparameters.json", "SM_HP_NUM-LAYERS", "the arguments"
};

struct HyperparameterAlias {
  std::string name;  // as the seed's scripts spell it
  std::string key;   // the config key it sets
};
// The seed's names, the table docs/sagemaker.md prints.
const std::vector<HyperparameterAlias>& hyperparameter_aliases();

struct HyperparameterSettings {
  std::vector<std::pair<std::string, std::string>> overrides;  // config key, value; later ones win
  std::string config_file;                                     // `config`, "" when not given
  std::string train_channel = "train";
  std::string validation_channel = "validation";
  std::string text_field = "text";  // the JSON field of a .jsonl line that holds its text
  double val_fraction = 0.05;       // the share of a train channel's documents held out, in (0, 0.5]
  std::vector<std::string> ignored;  // SageMaker's own sagemaker_* names
  bool sets(const std::string& key) const;
  // The value the last override of `key` gives ("" when none does).
  std::string value(const std::string& key) const;
};

// hyperparameters.json's text: a JSON object whose values are strings (numbers and booleans are
// taken as their text, for files written by hand), in name order. Throws Error(config) naming
// `origin`.
std::vector<Hyperparameter> parse_hyperparameters_json(std::string_view text, const std::string& origin);
// SM_HP_* entries of an environment ("NAME=value" strings, as in environ).
std::vector<Hyperparameter> hyperparameters_from_environment(const std::vector<std::string>& environment);
// `--name value` and `--name=value` pairs; anything else is an Error(config).
std::vector<Hyperparameter> hyperparameters_from_arguments(const std::vector<std::string>& arguments);

// Maps names onto config keys and checks every value against its key's rules.
HyperparameterSettings map_hyperparameters(const std::vector<Hyperparameter>& hyperparameters);

// The fuzz entry point: hyperparameters.json text → settings (parse, then map).
HyperparameterSettings parse_hyperparameters(std::string_view hyperparameters_json);

// "model, precision, num-layers, ...": for error messages and the docs test.
std::string accepted_hyperparameter_names();

}  // namespace mxtrain::sagemaker
