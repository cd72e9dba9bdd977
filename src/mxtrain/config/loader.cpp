#include "mxtrain/config/loader.hpp"

#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>

#include "mxtrain/config/toml_unicode_fix.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/spelling.hpp"

extern char** environ;

namespace mxtrain {
namespace {

// Environment variables with the MXTRAIN_ prefix that are not config keys.
const char* const kNonConfigEnvironment[] = {"MXTRAIN_LOG_LEVEL", "MXTRAIN_LAUNCH_ID", "MXTRAIN_LAUNCH_LOG_DIR",
                                                   "MXTRAIN_SAGEMAKER_ROOT"};

Field& find_field(std::vector<Field>& list, const std::string& key, const std::string& where) {
  for (Field& field : list)
    if (field.key == key) return field;
  std::string section = key.substr(0, key.find('.'));
  std::string known;
  for (const Field& field : list)
    if (field.key.rfind(section + ".", 0) == 0) known += (known.empty() ? "" : ", ") + field.key;
  if (known.empty())
    for (const Field& field : list) {
      std::string s = field.key.substr(0, field.key.find('.'));
      if (known.find(s) == std::string::npos) known += (known.empty() ? "" : ", ") + s;
    }
  std::vector<std::string> keys;
  for (const Field& field : list) keys.push_back(field.key);
  const std::string nearest = nearest_name(keys, key);
  const std::string guess = nearest.empty() ? "" : "did you mean '" + nearest + "'? ";
  throw Error(ErrorKind::config, "unknown config key '" + key + "'" + (where.empty() ? "" : " in " + where),
              guess + (known.empty() ? "see `mxtrain train --help-config`" : "known keys: " + known));
}

std::string node_text(const toml::node& node, const std::string& key, const std::string& where) {
  if (auto value = node.as_string()) return value->get();
  if (auto value = node.as_integer()) return std::to_string(value->get());
  if (auto value = node.as_floating_point()) return strf("%.17g", value->get());
  if (auto value = node.as_boolean()) return value->get() ? "true" : "false";
  throw Error(ErrorKind::config, "config key '" + key + "' in " + where + " has an array or table value",
              "give a single string, number or boolean");
}

// A config is a small regular file: a directory would parse as an empty table (silently the
// defaults), and a device or FIFO could be read without end.
void check_config_file(const std::string& path) {
  constexpr uintmax_t kMaxConfigBytes = 16u << 20;
  std::error_code error;
  const std::filesystem::file_status status = std::filesystem::status(path, error);
  if (error || !std::filesystem::exists(status))
    throw Error(ErrorKind::config, "cannot read config file " + path + ": no such file", "check the path");
  if (std::filesystem::is_directory(status))
    throw Error(ErrorKind::config, "config file " + path + " is a directory, not a TOML file",
                "pass the TOML file itself (a run directory's is " + path + "/config.toml)");
  if (!std::filesystem::is_regular_file(status))
    throw Error(ErrorKind::config, "config file " + path + " is not a regular file", "pass a TOML file");
  const uintmax_t bytes = std::filesystem::file_size(path, error);
  if (error || bytes > kMaxConfigBytes)
    throw Error(ErrorKind::config,
                error ? "cannot read config file " + path
                      : strf("config file %s has %ju bytes; a config is a small TOML file (at most 16 MiB)",
                             path.c_str(), bytes),
                "check the path");
}

std::vector<std::pair<std::string, std::string>> read_toml(const ConfigSources& sources) {
  std::vector<std::pair<std::string, std::string>> assignments;
  if (sources.toml_path.empty() && sources.toml_text.empty()) return assignments;
  const std::string where = sources.toml_path.empty() ? std::string("the config text") : sources.toml_path;
  if (sources.toml_text.empty()) check_config_file(sources.toml_path);
  toml::table table;
  try {
    table = sources.toml_text.empty() ? toml::parse_file(sources.toml_path) : toml::parse(sources.toml_text);
  } catch (const toml::parse_error& error) {
    const auto& begin = error.source().begin;
    std::string what = strf("%s:%u:%u: %s", where.c_str(), begin.line, begin.column,
                            std::string(error.description()).c_str());
    if (!sources.toml_path.empty() && error.description().find("File could not be opened") != std::string_view::npos)
      throw Error(ErrorKind::config, "cannot read config file " + where, "check the path");
    throw Error(ErrorKind::config, what, "fix the TOML syntax at that line");
  }
  for (const auto& [section_key, section_node] : table) {
    std::string section(section_key.str());
    const toml::table* section_table = section_node.as_table();
    if (!section_table)
      throw Error(ErrorKind::config, "top-level key '" + section + "' in " + where + " is not a [section]",
                  "put keys under [model], [data], [train], [precision], [optimizer], [schedule], [eval], [log], [checkpoint] or "
                  "[dist]");
    for (const auto& [key, node] : *section_table) {
      std::string full = section + "." + std::string(key.str());
      assignments.emplace_back(full, node_text(node, full, where));
    }
  }
  return assignments;
}

std::vector<std::pair<std::string, std::string>> read_environment(std::vector<Field>& list) {
  std::vector<std::pair<std::string, std::string>> assignments;
  std::map<std::string, std::string> known;
  for (const Field& field : list) known[environment_name(field.key)] = field.key;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string text(*entry);
    if (text.rfind("MXTRAIN_", 0) != 0) continue;
    std::string name = text.substr(0, text.find('='));
    std::string value = text.substr(text.find('=') + 1);
    bool other = false;
    for (const char* allowed : kNonConfigEnvironment) other = other || name == allowed;
    if (other) continue;
    auto found = known.find(name);
    if (found == known.end())
      throw Error(ErrorKind::config, "unknown environment variable " + name,
                  "MXTRAIN_* variables set config keys (MXTRAIN_TRAIN_STEPS sets train.steps); unset it or fix the "
                  "name");
    assignments.emplace_back(found->second, value);
  }
  return assignments;
}

}  // namespace

std::string environment_name(const std::string& key) {
  std::string name = "MXTRAIN_";
  for (char c : key) name += c == '.' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return name;
}

std::pair<std::string, std::string> parse_assignment(const std::string& text) {
  size_t equals = text.find('=');
  if (equals == std::string::npos || equals == 0)
    throw Error(ErrorKind::config, "bad override '" + text + "'", "write --set section.key=value, e.g. --set train.steps=100");
  return {text.substr(0, equals), text.substr(equals + 1)};
}

RunConfig load_config(const ConfigSources& sources) {
  RunConfig config;
  std::vector<Field> list = fields(config);
  struct Source {
    std::vector<std::pair<std::string, std::string>> assignments;
    std::string where;
  };
  std::vector<Source> ordered;
  ordered.push_back({read_toml(sources), sources.toml_path.empty() ? "the config" : sources.toml_path});
  if (sources.read_environment) ordered.push_back({read_environment(list), "the environment"});
  ordered.push_back({sources.overrides, "the command line"});
  // model.preset first, from whichever source sets it last.
  for (const Source& source : ordered)
    for (const auto& [key, value] : source.assignments)
      if (key == "model.preset") find_field(list, key, source.where).set(value);
  bool vocab_set = false, padded_set = false;
  for (const Source& source : ordered)
    for (const auto& [key, value] : source.assignments) {
      if (key != "model.preset") find_field(list, key, source.where).set(value);
      vocab_set = vocab_set || key == "model.vocab_size";
      padded_set = padded_set || key == "model.padded_vocab";
    }
  // A vocabulary size given without padded_vocab brings the rows with it (rounded up to 64, as the
  // presets pad), instead of keeping the preset's rows for another vocabulary.
  if (vocab_set && !padded_set && config.model.vocab_size > 0)
    config.model.padded_vocab = (config.model.vocab_size + 63) / 64 * 64;
  validate(config);
  return config;
}

std::string config_to_toml(RunConfig& config) {
  std::string text, section;
  for (const Field& field : fields(config)) {
    std::string field_section = field.key.substr(0, field.key.find('.'));
    if (field_section != section) {
      text += (text.empty() ? "[" : "\n[") + field_section + "]\n";
      section = field_section;
    }
    std::string value = field.get();
    if (field.type == FieldType::text || field.type == FieldType::choice) {
      std::string quoted = "\"";
      for (char c : value) quoted += (c == '"' || c == '\\') ? std::string("\\") + c : std::string(1, c);
      value = quoted + "\"";
    }
    text += field.key.substr(field.key.find('.') + 1) + " = " + value + "\n";
  }
  return text;
}

nlohmann::json config_to_json(RunConfig& config) {
  nlohmann::json json = nlohmann::json::object();
  for (const Field& field : fields(config)) json[field.key] = field.get();
  return json;
}

RunConfig config_from_json(const nlohmann::json& json) {
  ConfigSources sources;
  sources.read_environment = false;
  for (const auto& [key, value] : json.items()) sources.overrides.emplace_back(key, value.get<std::string>());
  return load_config(sources);
}

std::vector<std::string> config_differences(RunConfig& a, RunConfig& b, const std::vector<std::string>& prefixes) {
  std::vector<Field> fa = fields(a), fb = fields(b);
  std::vector<std::string> differing;
  for (size_t i = 0; i < fa.size(); ++i) {
    bool wanted = prefixes.empty();
    for (const std::string& prefix : prefixes) wanted = wanted || fa[i].key.rfind(prefix, 0) == 0;
    if (wanted && fa[i].get() != fb[i].get()) differing.push_back(fa[i].key);
  }
  return differing;
}

}  // namespace mxtrain
