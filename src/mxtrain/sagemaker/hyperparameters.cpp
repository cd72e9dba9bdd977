#include "mxtrain/sagemaker/hyperparameters.hpp"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <map>

#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/spelling.hpp"

namespace mxtrain::sagemaker {
namespace {

// Names that are not config keys but say where the run's inputs are.
constexpr const char* kConfigFile = "config";
constexpr const char* kTrainChannel = "train-channel";
constexpr const char* kValidationChannel = "validation-channel";
// How a documents channel is prepared (mxtrain prepare's --field and --val-fraction).
constexpr const char* kTextField = "text-field";
constexpr const char* kDatasetTextField = "dataset-text-field";  // TRL's SFTConfig name for it
constexpr const char* kValFraction = "val-fraction";

// Lower case, '-' and '.' as '_': `TRAIN.MICRO-BATCH_SIZE` and `train.micro_batch_size` match.
std::string normalized(const std::string& name) {
  std::string text;
  for (char c : name) {
    const char lower = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    text += lower == '-' || lower == '.' ? '_' : lower;
  }
  return text;
}

// A name the job accepts: how the docs write it (the config key, the alias or the input name) and
// the config key it sets ("" for the three input names).
struct KnownName {
  std::string written;
  std::string key;
};

// Every accepted name, by its normalized form; built once.
const std::map<std::string, KnownName>& known_names() {
  static const std::map<std::string, KnownName> table = [] {
    std::map<std::string, KnownName> names;
    RunConfig defaults;
    for (const Field& field : fields(defaults)) names.emplace(normalized(field.key), KnownName{field.key, field.key});
    for (const HyperparameterAlias& alias : hyperparameter_aliases())
      names.emplace(normalized(alias.name), KnownName{alias.name, alias.key});
    for (const char* name : {kConfigFile, kTrainChannel, kValidationChannel, kTextField, kValFraction})
      names.emplace(normalized(name), KnownName{name, ""});
    names.emplace(normalized(kDatasetTextField), KnownName{kTextField, ""});
    return names;
  }();
  return table;
}

// SageMaker's framework estimators pass every value through json.dumps, so a string arrives as
// "\"bf16\"": such a value is decoded; anything else is taken as it is.
std::string decoded_value(const std::string& value) {
  if (value.size() < 2 || value.front() != '"' || value.back() != '"') return value;
  nlohmann::json parsed = nlohmann::json::parse(value, nullptr, false);
  return parsed.is_string() ? parsed.get<std::string>() : value;
}

// A channel name: letters, digits, '-', '_', '.' (SageMaker's own rule is stricter).
void check_channel_name(const Hyperparameter& h) {
  bool good = !h.value.empty();
  for (char c : h.value) good = good && (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.');
  if (!good || h.value == "." || h.value == "..")
    throw Error(ErrorKind::config, "hyperparameter " + h.name + "='" + h.value + "' (from " + h.origin +
                                       ") is not a channel name",
                "give the name of an input channel of the job, e.g. train");
}

// The share of a documents channel held out, as mxtrain prepare takes it: in (0, 0.5].
double val_fraction_of(const Hyperparameter& h) {
  const char* text = h.value.c_str();
  char* end = nullptr;
  errno = 0;
  const double value = std::strtod(text, &end);
  if (h.value.empty() || end != text + h.value.size() || errno != 0 || !(value > 0.0 && value <= 0.5))
    throw Error(ErrorKind::config,
                "hyperparameter " + h.name + "='" + h.value + "' (from " + h.origin + ") is not a fraction in (0, 0.5]",
                "give the share of the train channel's documents held out for the validation loss, e.g. 0.05 "
                "(one 4,096-token block in 20)");
  return value;
}

}  // namespace

const std::vector<HyperparameterAlias>& hyperparameter_aliases() {
  static const std::vector<HyperparameterAlias> aliases = {
      {"model", "model.preset"},
      {"precision", "train.precision"},
      {"num-layers", "model.layers"},
      {"hidden-size", "model.hidden"},
      {"num-heads", "model.heads"},
      {"num-kv-heads", "model.kv_heads"},
      {"ffn-hidden-size", "model.ffn_hidden"},
      {"batch-size", "train.micro_batch_size"},
      {"micro-batch-size", "train.micro_batch_size"},
      {"global-batch-size", "train.global_batch_size"},
      {"seq-length", "train.seq_len"},
      {"steps", "train.steps"},
      {"max-steps", "train.steps"},
      {"lr", "optimizer.lr"},
      {"learning-rate", "optimizer.lr"},
      {"warmup-steps", "schedule.warmup_steps"},
      {"weight-decay", "optimizer.weight_decay"},
      {"seed", "train.seed"},
      {"recompute", "train.recompute"},
      {"strategy", "dist.strategy"},
      {"device", "train.device"},
      {"tokenizer", "data.tokenizer"},
      {"init-from", "model.init_from"},
  };
  return aliases;
}

bool HyperparameterSettings::sets(const std::string& key) const {
  for (const auto& [set_key, value] : overrides)
    if (set_key == key) return true;
  return false;
}

std::string HyperparameterSettings::value(const std::string& key) const {
  std::string found;
  for (const auto& [set_key, value] : overrides)
    if (set_key == key) found = value;
  return found;
}

std::string accepted_hyperparameter_names() {
  std::string text;
  for (const HyperparameterAlias& alias : hyperparameter_aliases()) text += alias.name + ", ";
  return text + kConfigFile + ", " + kTrainChannel + ", " + kValidationChannel + ", " + kTextField + ", " +
         kValFraction + ", and every config key, dotted or with dashes (train.steps, train-steps; `mxtrain train --help-config` "
         "lists them)";
}

std::vector<Hyperparameter> parse_hyperparameters_json(std::string_view text, const std::string& origin) {
  nlohmann::json json = nlohmann::json::parse(text.begin(), text.end(), nullptr, false);
  if (json.is_discarded() || !json.is_object())
    throw Error(ErrorKind::config, origin + " is not a JSON object of hyperparameters",
                "SageMaker writes {\"name\": \"value\", ...}; fix the Estimator's hyperparameters or the file");
  std::vector<Hyperparameter> result;
  for (const auto& [name, value] : json.items()) {
    Hyperparameter h{name, "", origin};
    if (value.is_string()) h.value = value.get<std::string>();
    else if (value.is_boolean()) h.value = value.get<bool>() ? "true" : "false";
    else if (value.is_number()) h.value = value.dump();
    else
      throw Error(ErrorKind::config, "hyperparameter " + name + " in " + origin + " is a JSON " + value.type_name(),
                  "give a string, a number or a boolean");
    result.push_back(std::move(h));
  }
  return result;
}

std::vector<Hyperparameter> hyperparameters_from_environment(const std::vector<std::string>& environment) {
  std::vector<Hyperparameter> result;
  for (const std::string& entry : environment) {
    if (entry.rfind("SM_HP_", 0) != 0) continue;
    const size_t equals = entry.find('=');
    if (equals == std::string::npos || equals == 6) continue;
    const std::string variable = entry.substr(0, equals);
    std::string name = variable.substr(6);
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    result.push_back({name, entry.substr(equals + 1), variable});
  }
  return result;
}

std::vector<Hyperparameter> hyperparameters_from_arguments(const std::vector<std::string>& arguments) {
  std::vector<Hyperparameter> result;
  for (size_t i = 0; i < arguments.size(); ++i) {
    const std::string& argument = arguments[i];
    if (argument.size() < 3 || argument.rfind("--", 0) != 0)
      throw Error(ErrorKind::config, "unexpected argument '" + argument + "' among the hyperparameter arguments",
                  "pass hyperparameters as --name value or --name=value (the CONFIG file comes before them)");
    const size_t equals = argument.find('=');
    if (equals != std::string::npos) {
      result.push_back({argument.substr(2, equals - 2), argument.substr(equals + 1), "the arguments"});
      continue;
    }
    if (i + 1 >= arguments.size())
      throw Error(ErrorKind::config, "hyperparameter argument " + argument + " has no value",
                  "pass --name value (SageMaker's script mode) or --name=value");
    result.push_back({argument.substr(2), arguments[i + 1], "the arguments"});
    ++i;
  }
  return result;
}

HyperparameterSettings map_hyperparameters(const std::vector<Hyperparameter>& hyperparameters) {
  const std::map<std::string, KnownName>& table = known_names();
  HyperparameterSettings settings;
  std::vector<Hyperparameter> mapped;  // name = the config key
  std::vector<std::string> given_names;
  for (const Hyperparameter& given : hyperparameters) {
    Hyperparameter h = given;
    h.value = decoded_value(h.value);
    const std::string name = normalized(h.name);
    if (name.rfind("sagemaker_", 0) == 0) {
      settings.ignored.push_back(h.name);
      continue;
    }
    const auto found = table.find(name);
    if (found == table.end()) {
      std::vector<std::string> known;
      for (const auto& entry : table) known.push_back(entry.first);
      const std::string nearest = nearest_name(known, name);
      throw Error(ErrorKind::config, "unknown hyperparameter '" + h.name + "' (from " + h.origin + ")",
                  (nearest.empty() ? "" : "did you mean '" + table.at(nearest).written + "'? ") +
                      "accepted names: " + accepted_hyperparameter_names());
    }
    if (!found->second.key.empty()) {
      given_names.push_back(h.name);
      mapped.push_back({found->second.key, h.value, h.origin});
    } else if (name == normalized(kConfigFile)) {
      settings.config_file = h.value;
    } else if (found->second.written == kTextField) {
      if (h.value.empty())
        throw Error(ErrorKind::config, "hyperparameter " + h.name + " (from " + h.origin + ") is empty",
                    "give the JSON field that holds each .jsonl line's text, e.g. text or content");
      settings.text_field = h.value;
    } else if (name == normalized(kValFraction)) {
      settings.val_fraction = val_fraction_of(h);
    } else {
      check_channel_name(h);
      (name == normalized(kTrainChannel) ? settings.train_channel : settings.validation_channel) = h.value;
    }
  }
  // Every value against its key's rules now, so the message names the hyperparameter; the
  // preset first, as the config loader applies it (it resets the model.* keys).
  RunConfig scratch;
  std::vector<Field> list = fields(scratch);
  for (const bool preset_pass : {true, false}) {
    for (size_t i = 0; i < mapped.size(); ++i) {
      if ((mapped[i].name == "model.preset") != preset_pass) continue;
      for (Field& field : list) {
        if (field.key != mapped[i].name) continue;
        try {
          field.set(mapped[i].value);
        } catch (const Error& error) {
          throw Error(ErrorKind::config,
                      "hyperparameter " + given_names[i] + " (from " + mapped[i].origin + "): " + error.what(),
                      error.advice());
        }
      }
    }
  }
  for (const Hyperparameter& h : mapped) settings.overrides.emplace_back(h.name, h.value);
  return settings;
}

HyperparameterSettings parse_hyperparameters(std::string_view hyperparameters_json) {
  return map_hyperparameters(parse_hyperparameters_json(hyperparameters_json, "hyperparameters.json"));
}

}  // namespace mxtrain::sagemaker
