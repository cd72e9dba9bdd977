#include "mxtrain/runtime/sagemaker_paths.hpp"

#include <cctype>
#include <filesystem>

namespace mxtrain::runtime {
namespace {

std::string value_or(const EnvironmentLookup& lookup, const std::string& name, const std::string& fallback) {
  std::optional<std::string> value = lookup(name);
  return value && !value->empty() ? *value : fallback;
}

}  // namespace

SageMakerPaths sagemaker_paths(const EnvironmentLookup& lookup) {
  SageMakerPaths paths;
  paths.root = value_or(lookup, "MXTRAIN_SAGEMAKER_ROOT", "/opt/ml");
  paths.input_config_dir = value_or(lookup, "SM_INPUT_CONFIG_DIR", paths.root + "/input/config");
  paths.input_data_dir = value_or(lookup, "SM_INPUT_DATA_DIR", paths.root + "/input/data");
  paths.model_dir = value_or(lookup, "SM_MODEL_DIR", paths.root + "/model");
  paths.output_dir = value_or(lookup, "SM_OUTPUT_DIR", paths.root + "/output");
  paths.output_data_dir = value_or(lookup, "SM_OUTPUT_DATA_DIR", paths.output_dir + "/data");
  paths.checkpoint_dir = paths.root + "/checkpoints";
  paths.prepared_dir = paths.root + "/prepared";
  return paths;
}

std::string sagemaker_channel_dir(const SageMakerPaths& paths, const std::string& channel,
                                  const EnvironmentLookup& lookup) {
  std::string variable = "SM_CHANNEL_";
  for (char c : channel) variable += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return value_or(lookup, variable, paths.input_data_dir + "/" + channel);
}

std::string sagemaker_job_evidence(const EnvironmentLookup& lookup, const SageMakerPaths& paths) {
  for (const char* variable : {"MXTRAIN_SAGEMAKER_ROOT", "SM_TRAINING_ENV", "SM_MODEL_DIR", "SM_CHANNELS"}) {
    std::optional<std::string> value = lookup(variable);
    if (value && !value->empty()) return std::string(variable) + " is set";
  }
  std::error_code error;
  for (const std::string& file : {paths.hyperparameters_file(), paths.resource_config_file()})
    if (std::filesystem::exists(file, error)) return file + " exists";
  return {};
}

}  // namespace mxtrain::runtime
