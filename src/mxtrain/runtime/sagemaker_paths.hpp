// Where a SageMaker training job keeps things (docs/sagemaker.md, "The job contract"). Every path
// comes from one root, MXTRAIN_SAGEMAKER_ROOT (default /opt/ml, what SageMaker mounts), unless
// the training toolkit's SM_* variable names it: a test lays out a fake /opt/ml in a temporary
// directory by setting the root alone.
#pragma once
#include <string>

#include "mxtrain/runtime/rank_environment.hpp"

namespace mxtrain::runtime {

struct SageMakerPaths {
  std::string root;              // MXTRAIN_SAGEMAKER_ROOT, or /opt/ml
  std::string input_config_dir;  // SM_INPUT_CONFIG_DIR, or ROOT/input/config
  std::string input_data_dir;    // SM_INPUT_DATA_DIR, or ROOT/input/data
  std::string model_dir;         // SM_MODEL_DIR, or ROOT/model (uploaded when the job ends)
  std::string output_dir;        // SM_OUTPUT_DIR, or ROOT/output (holds the failure file)
  std::string output_data_dir;   // SM_OUTPUT_DATA_DIR, or OUTPUT/data (uploaded when the job ends)
  std::string checkpoint_dir;    // ROOT/checkpoints: CheckpointConfig's default local path
  std::string prepared_dir;      // ROOT/prepared: token shards made from raw-text channels

  std::string hyperparameters_file() const { return input_config_dir + "/hyperparameters.json"; }
  std::string resource_config_file() const { return input_config_dir + "/resourceconfig.json"; }
  std::string failure_file() const { return output_dir + "/failure"; }
};

SageMakerPaths sagemaker_paths(const EnvironmentLookup& lookup);

// A channel's directory: SM_CHANNEL_<NAME> (upper case), or INPUT_DATA/<name>.
std::string sagemaker_channel_dir(const SageMakerPaths& paths, const std::string& channel,
                                  const EnvironmentLookup& lookup);

// Why this process runs inside a SageMaker training job, or "" when it does not: the root
// override, a training-toolkit variable (SM_TRAINING_ENV, SM_MODEL_DIR, SM_CHANNELS), or the
// job's files (hyperparameters.json, resourceconfig.json) under the input config directory.
std::string sagemaker_job_evidence(const EnvironmentLookup& lookup, const SageMakerPaths& paths);

}  // namespace mxtrain::runtime
