#include "mxtrain/cli/flags.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/interop/hf_checkpoint.hpp"

namespace mxtrain::cli {

const std::vector<FlagSpec>& train_flags() {
  static const std::vector<FlagSpec> flags = {
      {"-m,--model", "model.preset"},          {"--steps", "train.steps"},
      {"-b,--batch", "train.micro_batch_size"}, {"--global-batch", "train.global_batch_size"},
      {"-s,--seq", "train.seq_len"},            {"-p,--precision", "train.precision"},
      {"-r,--recompute", "train.recompute"},    {"-d,--device", "train.device"},
      {"--lr", "optimizer.lr"},                 {"-o,--run-dir", "checkpoint.dir"},
      {"--seed", "train.seed"},                 {"--strategy", "dist.strategy"},
      {"--init-from", "model.init_from"},
  };
  return flags;
}

static const char* type_name(FieldType type) {
  switch (type) {
    case FieldType::integer: return "integer";
    case FieldType::real: return "number";
    case FieldType::boolean: return "boolean";
    case FieldType::text: return "string";
    case FieldType::choice: return "choice";
  }
  return "?";
}

void add_config_arguments(CLI::App& command, ConfigArguments& arguments, const std::vector<FlagSpec>& flags) {
  RunConfig defaults;
  std::vector<Field> list = fields(defaults);
  command.add_option("config", arguments.config_path, "TOML file describing the run (optional)");
  command.add_option("--set", arguments.assignments, "override any config key: --set train.steps=100 (repeatable)")
      ->type_name("KEY=VALUE")
      ->allow_extra_args(false);
  for (const FlagSpec& flag : flags) {
    const Field* field = nullptr;
    for (const Field& candidate : list)
      if (candidate.key == flag.key) field = &candidate;
    MXTRAIN_ASSERT(field != nullptr, "flag %s maps to unknown key %s", flag.names.c_str(), flag.key.c_str());
    std::string help = field->help + " [" + flag.key + ", default: " + field->get() + "]";
    if (field->type == FieldType::choice) {
      std::string choices;
      for (const std::string& c : field->choices) choices += (choices.empty() ? "" : "|") + c;
      help += " {" + choices + "}";
    }
    std::string key = flag.key;
    command.add_option_function<std::string>(
        flag.names, [&arguments, key](const std::string& value) { arguments.flag_values.emplace_back(key, value); },
        help);
  }
  command.add_flag_callback(
      "--help-config",
      [] {
        std::fputs(config_reference().c_str(), stdout);
        throw CLI::Success();
      },
      "list every config key with its type, default and meaning, then exit");
}

std::vector<std::pair<std::string, std::string>> overrides(const ConfigArguments& arguments) {
  std::vector<std::pair<std::string, std::string>> result;
  for (const std::string& assignment : arguments.assignments) result.push_back(parse_assignment(assignment));
  for (const auto& flag : arguments.flag_values) result.push_back(flag);
  return result;
}

std::string config_reference() {
  RunConfig defaults;
  std::string text = "config keys (set them in the TOML file under [section], with --set section.key=value, or with "
                     "MXTRAIN_SECTION_KEY=value):\n";
  for (const Field& field : fields(defaults)) {
    text += strf("  %-30s %-8s default %-28s %s", field.key.c_str(), type_name(field.type),
                 ("\"" + field.get() + "\"").c_str(), field.help.c_str());
    if (field.type == FieldType::choice) {
      std::string choices;
      for (const std::string& c : field.choices) choices += (choices.empty() ? "" : ", ") + c;
      text += " (" + choices + ")";
    }
    if (!field.range.empty()) text += " [" + field.range + "]";
    text += "\n";
  }
  return text;
}

std::string config_reference_markdown() {
  RunConfig defaults;
  auto cell = [](std::string text) {
    std::string escaped;
    for (char c : text) escaped += c == '|' ? std::string("\\|") : std::string(1, c);
    return escaped;
  };
  std::string text = "| key | type | default | accepted values | meaning |\n|---|---|---|---|---|\n";
  for (const Field& field : fields(defaults)) {
    std::string accepted = field.range;
    if (field.type == FieldType::choice)
      for (const std::string& c : field.choices) accepted += (accepted.empty() ? "" : ", ") + c;
    if (field.type == FieldType::boolean) accepted = "true, false";
    if (accepted.empty()) accepted = "any text";
    text += "| `" + field.key + "` | " + type_name(field.type) + " | `" + cell(field.get()) + "` | " + cell(accepted) +
            " | " + cell(field.help) + " |\n";
  }
  return text;
}

RunConfig load_run_config(const ConfigSources& sources) {
  RunConfig config = load_config(sources);
  interop::apply_init_from(config);
  return config;
}

}  // namespace mxtrain::cli
