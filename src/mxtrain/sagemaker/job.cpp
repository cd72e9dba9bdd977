#include "mxtrain/sagemaker/job.hpp"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/data/prepare.hpp"
#include "mxtrain/data/tokenizer.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "mxtrain/train/checkpoint_export.hpp"
#include "mxtrain/train/trainer.hpp"

namespace fs = std::filesystem;

namespace mxtrain::sagemaker {
namespace {

constexpr uint64_t kExportShardBytes = 5'000'000'000;  // transformers' default shard size

bool starts_with(const std::string& text, const std::string& prefix) { return text.rfind(prefix, 0) == 0; }
bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Files a tokenizer directory carries beside its vocabulary: not documents.
bool tokenizer_side_file(const std::string& name) {
  return name == "tokenizer_config.json" || name == "special_tokens_map.json" || name == "meta.json";
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorKind::config, "cannot read " + path,
                "check the job's input config directory (SM_INPUT_CONFIG_DIR, MXTRAIN_SAGEMAKER_ROOT)");
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A file copied so that the destination is whole or absent: DEST.partial, then a rename.
void copy_file_whole(const fs::path& from, const fs::path& to) {
  const fs::path partial = to.string() + ".partial";
  std::error_code error;
  fs::copy_file(from, partial, fs::copy_options::overwrite_existing, error);
  if (!error) fs::rename(partial, to, error);
  if (error) {
    fs::remove(partial, error);
    throw Error(ErrorKind::system, "cannot copy " + from.string() + " to " + to.string() + ": " + error.message(),
                "check that the output data directory (SM_OUTPUT_DATA_DIR) is writable and has free space");
  }
}

void copy_tree(const fs::path& from, const fs::path& to) {
  std::error_code error;
  fs::create_directories(to, error);
  if (error)
    throw Error(ErrorKind::system, "cannot create " + to.string() + ": " + error.message(),
                "check that the output data directory (SM_OUTPUT_DATA_DIR) is writable");
  for (const fs::directory_entry& entry : fs::directory_iterator(from)) {
    if (entry.is_directory()) copy_tree(entry.path(), to / entry.path().filename());
    else if (entry.is_regular_file()) copy_file_whole(entry.path(), to / entry.path().filename());
  }
}

// The export goes to a folder inside the model directory first, then its files move up one by
// one: SageMaker may mount the model directory, which a rename cannot replace, and its parent
// need not be writable. An interrupted export leaves only the staging folder, which the next
// attempt removes.
CheckpointExport export_into_model_dir(const std::string& checkpoint, const std::string& model_dir) {
  const fs::path staging = fs::path(model_dir) / "mxtrain-export";
  std::error_code error;
  fs::remove_all(staging, error);
  fs::create_directories(model_dir, error);
  if (!fs::is_empty(model_dir, error))
    throw Error(ErrorKind::config, "the model directory " + model_dir + " is not empty",
                "the job's model directory (SM_MODEL_DIR) starts empty; remove what is in it");
  const CheckpointExport exported = export_checkpoint_to_hf(checkpoint, staging.string(), DType::bf16, kExportShardBytes);
  for (const fs::directory_entry& entry : fs::directory_iterator(staging)) {
    fs::rename(entry.path(), fs::path(model_dir) / entry.path().filename(), error);
    if (error)
      throw Error(ErrorKind::system, "cannot move " + entry.path().string() + " into " + model_dir + ": " + error.message(),
                  "check that the model directory (SM_MODEL_DIR) is writable");
  }
  fs::remove(staging, error);
  fsync_path(model_dir, true);
  return exported;
}

// The channel's entry in inputdataconfig.json ({} when the file or the entry is absent). The
// file is SageMaker's account of each channel's input mode and distribution; a damaged one is
// warned about and otherwise not used (nothing else depends on it).
nlohmann::json channel_input_config(const runtime::SageMakerPaths& paths, const std::string& channel) {
  const std::string file = paths.input_config_dir + "/inputdataconfig.json";
  std::error_code error;
  if (!fs::is_regular_file(file, error)) return nlohmann::json::object();
  const nlohmann::json all = nlohmann::json::parse(read_text(file), nullptr, /*allow_exceptions=*/false);
  if (!all.is_object()) {
    log::warn("cannot parse " + file + " (SageMaker's channel configuration): the channels' input modes are not "
              "checked");
    return nlohmann::json::object();
  }
  const auto entry = all.find(channel);
  return entry != all.end() && entry->is_object() ? *entry : nlohmann::json::object();
}

std::string string_field(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

// How many hosts the job has (resourceconfig.json's "hosts"; 1 when it does not say).
size_t job_hosts(const runtime::SageMakerPaths& paths) {
  std::error_code error;
  if (!fs::is_regular_file(paths.resource_config_file(), error)) return 1;
  const nlohmann::json config = nlohmann::json::parse(read_text(paths.resource_config_file()), nullptr, false);
  const auto hosts = config.is_object() ? config.find("hosts") : config.end();
  return config.is_object() && hosts != config.end() && hosts->is_array() && !hosts->empty() ? hosts->size() : 1;
}

// A channel mxtrain reads must be files (File or FastFile mode), and the same files on every
// host: ranks on different hosts draw their batches from one token stream.
void check_channel_mode(const runtime::SageMakerPaths& paths, const std::string& channel) {
  const nlohmann::json entry = channel_input_config(paths, channel);
  const std::string mode = string_field(entry, "TrainingInputMode");
  if (mode == "Pipe")
    throw Error(ErrorKind::config,
                "channel '" + channel + "' is in Pipe input mode (a stream in " + paths.input_data_dir + "/" + channel +
                    "_0, ...), which mxtrain does not read: it trains from files",
                "give the channel input_mode='File' (or 'FastFile', which streams from S3 behind a file view): "
                "TrainingInput(s3_data=..., input_mode='File'), or input_mode='File' on the Estimator");
  if (string_field(entry, "S3DistributionType") != "ShardedByS3Key") return;
  const size_t hosts = job_hosts(paths);  // resourceconfig.json: read only for a sharded channel
  if (hosts > 1)
    throw Error(ErrorKind::config,
                strf("channel '%s' is ShardedByS3Key over %zu hosts: each host receives different files, but "
                     "mxtrain's ranks take their batches from one token stream that every host must hold whole",
                     channel.c_str(), hosts),
                "give the channel distribution='FullyReplicated' (SageMaker's default): TrainingInput(s3_data=..., "
                "distribution='FullyReplicated')");
}

}  // namespace

ChannelContents inspect_channel(const std::string& name, const std::string& dir) {
  ChannelContents contents;
  contents.name = name;
  contents.dir = dir;
  std::error_code error;
  if (!fs::is_directory(dir, error))
    throw Error(ErrorKind::data, "channel '" + name + "' has no directory " + dir,
                "check the channel's name in the Estimator's fit() inputs (SM_CHANNEL_" + name + ")");
  std::vector<std::string> bins, others;
  for (auto it = fs::recursive_directory_iterator(dir, fs::directory_options::follow_directory_symlink, error);
       !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    const std::string file = it->path().filename().string();
    if (starts_with(file, ".")) {
      if (it->is_directory()) it.disable_recursion_pending();
      continue;
    }
    if (!it->is_regular_file()) continue;
    const std::string path = it->path().string();
    if (file == "tokenizer.json" || file == "tokenizer.model") {
      // Of a tokenizer.json and a tokenizer.model side by side, the one data::tokenizer_file_in
      // picks, whichever the listing gives first.
      contents.tokenizer_file = data::tokenizer_file_in(it->path().parent_path().string());
    }
    else if (ends_with(file, ".bin")) bins.push_back(path);
    else if (!tokenizer_side_file(file)) others.push_back(path);
  }
  if (error)
    throw Error(ErrorKind::data, "cannot list channel '" + name + "' (" + dir + "): " + error.message(),
                "check the channel's files and permissions");
  for (const std::string& path : bins) {
    const std::string file = fs::path(path).filename().string();
    contents.shards = contents.shards || starts_with(file, "train_");
    contents.has_val_shards = contents.has_val_shards || starts_with(file, "val_");
  }
  if (!bins.empty() && !contents.shards && !contents.has_val_shards)
    throw Error(ErrorKind::data, "channel '" + name + "' (" + dir + ") holds .bin files that are not token shards",
                "shards are named train_NNNNNN.bin and val_NNNNNN.bin (mxtrain prepare, llm.c); give documents "
                "(text, .jsonl, .jsonl.zst) or rename the shards");
  if (bins.empty()) {
    std::sort(others.begin(), others.end());
    contents.documents = others;
  }
  if (bins.empty() && contents.documents.empty())
    throw Error(ErrorKind::data, "channel '" + name + "' (" + dir + ") holds no documents and no token shards",
                "check the channel's S3 prefix: it needs text, .jsonl or .jsonl.zst files, or train_*.bin shards");
  return contents;
}

Job Job::open(const runtime::SageMakerPaths& paths, std::string evidence, const runtime::EnvironmentLookup& lookup,
              const std::vector<std::string>& environment, const std::vector<std::string>& arguments) {
  Job job;
  job.paths_ = paths;
  job.evidence_ = std::move(evidence);
  std::error_code error;
  if (fs::exists(paths.hyperparameters_file(), error))
    job.hyperparameters_ = parse_hyperparameters_json(read_text(paths.hyperparameters_file()), paths.hyperparameters_file());
  for (std::vector<Hyperparameter> more :
       {hyperparameters_from_environment(environment), hyperparameters_from_arguments(arguments)})
    job.hyperparameters_.insert(job.hyperparameters_.end(), more.begin(), more.end());
  job.settings_ = map_hyperparameters(job.hyperparameters_);
  const HyperparameterSettings& settings = job.settings_;

  if (!settings.sets("checkpoint.dir")) job.defaults_.emplace_back("checkpoint.dir", paths.checkpoint_dir);
  const std::string train_dir = runtime::sagemaker_channel_dir(paths, settings.train_channel, lookup);
  const std::string validation_dir = runtime::sagemaker_channel_dir(paths, settings.validation_channel, lookup);
  const bool have_validation = fs::is_directory(validation_dir, error);
  if (!settings.sets("data.val")) check_channel_mode(paths, settings.validation_channel);  // a Pipe one has no folder
  if (!settings.sets("data.train")) {
    check_channel_mode(paths, settings.train_channel);
    if (!fs::is_directory(train_dir, error))
      throw Error(ErrorKind::data,
                  "the job has no '" + settings.train_channel + "' channel (no directory " + train_dir + ")",
                  "give the Estimator's fit() a '" + settings.train_channel +
                      "' channel, name another with the train-channel hyperparameter, or set data.train to a glob "
                      "of token shards");
    const ChannelContents train = inspect_channel(settings.train_channel, train_dir);
    if (train.shards) {
      job.defaults_.emplace_back("data.train", train.dir + "/train_*.bin");
      if (!have_validation) job.defaults_.emplace_back("data.val", train.has_val_shards ? train.dir + "/val_*.bin" : "");
      job.channel_lines_.push_back(strf("channel %s: token shards in %s", train.name.c_str(), train.dir.c_str()));
    } else {
      const std::string out = paths.prepared_dir + "/" + train.name;
      job.preparations_.push_back(
          {train.name, out, out + "/train_*.bin", train.documents, settings.val_fraction, settings.text_field});
      job.defaults_.emplace_back("data.train", out + "/train_*.bin");
      if (!have_validation) job.defaults_.emplace_back("data.val", out + "/val_*.bin");
      job.channel_lines_.push_back(strf("channel %s: %zu document file(s) in %s, prepared into %s (.jsonl field '%s'; "
                                        "1 block in %lld held out%s)",
                                        train.name.c_str(), train.documents.size(), train.dir.c_str(), out.c_str(),
                                        settings.text_field.c_str(),
                                        static_cast<long long>(data::validation_block_period(settings.val_fraction)),
                                        have_validation ? ", unused: the validation channel is the held-out set" : ""));
    }
    if (!train.tokenizer_file.empty() && !settings.sets("data.tokenizer")) {
      job.defaults_.emplace_back("data.tokenizer", train.tokenizer_file);
      job.channel_lines_.push_back("tokenizer: " + train.tokenizer_file);
    } else if (!settings.sets("data.tokenizer") && settings.sets("model.init_from")) {
      // Continued training of a Hugging Face model: its own tokenizer, when its directory has one.
      const std::string model_dir = settings.value("model.init_from");
      const std::string file = data::tokenizer_file_in(model_dir);
      if (!file.empty()) {
        job.defaults_.emplace_back("data.tokenizer", model_dir);
        job.channel_lines_.push_back("tokenizer: the init-from model's, " + file);
      }
    }
  }
  if (settings.sets("data.train") && !have_validation && !settings.sets("data.val"))
    job.defaults_.emplace_back("data.val", "");  // not the built-in corpus's held-out shards
  if (have_validation && !settings.sets("data.val")) {
    const ChannelContents validation = inspect_channel(settings.validation_channel, validation_dir);
    if (validation.shards || validation.has_val_shards) {
      job.defaults_.emplace_back("data.val", validation.dir + (validation.has_val_shards ? "/val_*.bin" : "/*.bin"));
      job.channel_lines_.push_back(
          strf("channel %s: held-out token shards in %s", validation.name.c_str(), validation.dir.c_str()));
    } else {
      // prepare() holds out at most half; the held-out set is both halves.
      const std::string out = paths.prepared_dir + "/" + validation.name;
      job.preparations_.push_back(
          {validation.name, out, out + "/*.bin", validation.documents, 0.5, settings.text_field});
      job.defaults_.emplace_back("data.val", out + "/*.bin");
      job.channel_lines_.push_back(strf("channel %s: %zu held-out document file(s) in %s, prepared into %s",
                                        validation.name.c_str(), validation.documents.size(), validation.dir.c_str(),
                                        out.c_str()));
    }
  }
  return job;
}

std::vector<std::pair<std::string, std::string>> Job::overrides() const {
  std::vector<std::pair<std::string, std::string>> all = defaults_;
  all.insert(all.end(), settings_.overrides.begin(), settings_.overrides.end());
  return all;
}

void Job::announce() const {
  log::info("SageMaker training job (" + evidence_ + "): root " + paths_.root + ", model to " + paths_.model_dir +
            ", metrics to " + paths_.output_data_dir);
  std::string given;
  for (const Hyperparameter& h : hyperparameters_) given += (given.empty() ? "" : ", ") + h.name + "=" + h.value;
  log::info(strf("hyperparameters (%zu): %s", hyperparameters_.size(), given.empty() ? "none" : given.c_str()));
  if (!settings_.ignored.empty()) {
    std::string names;
    for (const std::string& name : settings_.ignored) names += (names.empty() ? "" : ", ") + name;
    log::info("SageMaker's own hyperparameters, not used by mxtrain: " + names);
  }
  for (const std::string& line : channel_lines_) log::info(line);
}

std::function<void()> Job::data_preparation(const RunConfig& config) const {
  std::vector<data::PrepareOptions> work;
  std::vector<std::string> channels;
  for (const Preparation& p : preparations_) {
    if (p.glob != config.data.train && p.glob != config.data.val) continue;  // the command line chose other data
    data::PrepareOptions options;
    options.output_dir = p.output_dir;
    options.input_files = p.documents;
    options.val_fraction = p.val_fraction;
    options.field = p.field;
    options.tokenizer = config.data.tokenizer;
    work.push_back(options);
    channels.push_back(p.channel);
  }
  if (work.empty()) return {};
  return [work, channels] {
    for (size_t i = 0; i < work.size(); ++i) {
      log::info(strf("preparing channel %s: %zu file(s), tokenizer %s -> %s", channels[i].c_str(),
                     work[i].input_files.size(), work[i].tokenizer.c_str(), work[i].output_dir.c_str()));
      const data::PrepareResult result = data::prepare_corpus(work[i]);
      log::info(strf("prepared channel %s: %lld documents, %lld train and %lld held-out tokens", channels[i].c_str(),
                     static_cast<long long>(result.documents), static_cast<long long>(result.meta.train_tokens),
                     static_cast<long long>(result.meta.val_tokens)));
    }
  };
}

void Job::finish(RunConfig& config, int nodes) const {
  const std::string run_dir = run_directory(config);
  const CheckpointReader newest(resolve_checkpoint(run_dir));
  const int64_t step = newest.meta().step;
  if (step < config.train.steps) {
    log::info(strf("stopped at step %lld of %lld: no model export; a restarted job resumes from %s",
                   static_cast<long long>(step), static_cast<long long>(config.train.steps), newest.path().c_str()));
  } else {
    try {
      const CheckpointExport exported = export_into_model_dir(newest.path(), paths_.model_dir);
      log::info(strf("exported %s (step %lld) to %s in Hugging Face format (%zu files)", exported.checkpoint.c_str(),
                     static_cast<long long>(exported.step), paths_.model_dir.c_str(), exported.result.files.size()));
    } catch (const Error& error) {
      if (nodes == 1) throw;
      // Every host keeps its own ranks' files when the checkpoint directory is not shared.
      log::warn("the model was not exported: " + error.full_message() +
                "\n  the checkpoint's rank files of every host are in checkpoint_s3_uri; export them after the job "
                "with `mxtrain export CHECKPOINT_DIR OUT_DIR` (docs/sagemaker.md)");
    }
  }
  const fs::path out = paths_.output_data_dir;
  for (const std::string& name : {config.log.metrics, std::string("config.toml"), std::string("report.html")}) {
    std::error_code error;
    if (!fs::is_regular_file(fs::path(run_dir) / name, error)) continue;
    fs::create_directories(out, error);
    copy_file_whole(fs::path(run_dir) / name, out / fs::path(name).filename());
  }
  std::error_code error;
  if (fs::is_directory(fs::path(run_dir) / "tensorboard", error))
    copy_tree(fs::path(run_dir) / "tensorboard", out / "tensorboard");
  log::info("metrics copied to " + out.string());
}

void record_failure(const runtime::SageMakerPaths& paths, const std::string& reason) {
  try {
    std::error_code error;
    if (fs::exists(paths.failure_file(), error)) return;
    fs::create_directories(paths.output_dir, error);
    write_file_atomically(paths.failure_file(), reason + "\n");
  } catch (const std::exception& failure) {
    std::fprintf(stderr, "mxtrain: could not write the failure file %s: %s\n", paths.failure_file().c_str(),
                 failure.what());
  }
}

}  // namespace mxtrain::sagemaker
