// `mxtrain train` inside a SageMaker training job (docs/sagemaker.md): what the job gives
// (hyperparameters, channels, the checkpoint, model and output directories) becomes config
// overrides and a data preparation, and what the job expects back is written when training
// ends: the model in Hugging Face format in SM_MODEL_DIR, the metrics in SM_OUTPUT_DATA_DIR, and
// on failure the reason in OUTPUT/failure.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/runtime/sagemaker_paths.hpp"
#include "mxtrain/sagemaker/hyperparameters.hpp"

namespace mxtrain::sagemaker {

// What a channel directory holds: llm.c token shards (train_*.bin, val_*.bin), or documents
// (text files, .jsonl, .jsonl.zst) that `prepare` turns into shards, with the tokenizer file it
// may carry (tokenizer.json or tokenizer.model).
struct ChannelContents {
  std::string name, dir;
  bool shards = false;
  bool has_val_shards = false;
  std::vector<std::string> documents;  // sorted paths, when not shards
  std::string tokenizer_file;          // "" when none
};
// Throws Error(data) for a missing or empty directory, or .bin files that are not shards.
ChannelContents inspect_channel(const std::string& name, const std::string& dir);

class Job {
 public:
  // Reads the hyperparameters (hyperparameters.json, the SM_HP_* entries of `environment`, then
  // `arguments`) and the channels they name. Throws Error(config) for a bad hyperparameter and
  // Error(data) for a channel that cannot be used.
  static Job open(const runtime::SageMakerPaths& paths, std::string evidence, const runtime::EnvironmentLookup& lookup,
                  const std::vector<std::string>& environment, const std::vector<std::string>& arguments);

  const runtime::SageMakerPaths& paths() const { return paths_; }
  const HyperparameterSettings& settings() const { return settings_; }
  // The TOML file the `config` hyperparameter names ("" for none).
  const std::string& config_file() const { return settings_.config_file; }
  // The job's defaults (checkpoint.dir, data.*) followed by the hyperparameters: config
  // overrides that the command line's --set and flags come after.
  std::vector<std::pair<std::string, std::string>> overrides() const;
  // Log lines: where the job's parts are and what the hyperparameters set.
  void announce() const;
  // Prepares the documents channels that `config` reads (TrainerContext::prepare_data); empty
  // when the data are shards already.
  std::function<void()> data_preparation(const RunConfig& config) const;
  // After a training that exited 0, on the job's first host: when the run reached train.steps,
  // the newest checkpoint exported to the model directory; in any case the metrics, TensorBoard
  // files, config.toml and report.html (when there is one) copied to the output data directory.
  void finish(RunConfig& config, int nodes) const;

 private:
  struct Preparation {
    std::string channel, output_dir, glob;
    std::vector<std::string> documents;
    double val_fraction = 0.05;
    std::string field = "text";
  };

  runtime::SageMakerPaths paths_;
  std::string evidence_;
  std::vector<Hyperparameter> hyperparameters_;
  HyperparameterSettings settings_;
  std::vector<std::pair<std::string, std::string>> defaults_;
  std::vector<Preparation> preparations_;
  std::vector<std::string> channel_lines_;
};

// Writes `reason` to the job's failure file unless one is there already (the first reason is
// the one that explains the failure; a launcher's "rank 3 failed" comes after the rank's own).
// Never throws: it runs while an error is on its way out.
void record_failure(const runtime::SageMakerPaths& paths, const std::string& reason);

}  // namespace mxtrain::sagemaker
