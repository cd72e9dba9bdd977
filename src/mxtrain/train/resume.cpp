#include "mxtrain/train/resume.hpp"

#include <vector>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/train/trainer.hpp"  // run_directory

namespace mxtrain {

namespace {

// The newest checkpoint every rank could load (a damaged segment may be read by one rank only,
// so the ranks agree on each candidate before using it). Returns "" when none loads.
std::string load_agreed_checkpoint(CheckpointStore& checkpoints, const std::vector<std::string>& candidates,
                                   ParameterStore& params, const NamedBuffers& state, Backend& backend,
                                   const RankGroup& ranks, CheckpointMeta* meta) {
  const int64_t count = static_cast<int64_t>(ranks.max(static_cast<double>(candidates.size())));
  for (int64_t i = 0; i < count; ++i) {
    const std::string path = i < static_cast<int64_t>(candidates.size()) ? candidates[static_cast<size_t>(i)] : "";
    bool loaded = false;
    if (!path.empty()) {
      try {
        *meta = checkpoints.load(path, params.shards(), backend, state);
        config_from_json(meta->config);  // a config this mxtrain cannot read is a damaged checkpoint too
        loaded = true;
      } catch (const Error& error) {
        if (error.kind() != ErrorKind::checkpoint && error.kind() != ErrorKind::config) throw;
        log::warn("skipping checkpoint " + path + ": " + error.what() + "; trying the previous one");
      }
    }
    if (!ranks.all(loaded)) {
      if (loaded) log::warn("another rank could not load " + path + "; trying the previous one");
      continue;
    }
    const double step = static_cast<double>(meta->step);
    if (ranks.max(step) != -ranks.max(-step))
      throw Error(ErrorKind::checkpoint, "the ranks found different newest checkpoints in " + checkpoints.directory(),
                  "all ranks must see the same checkpoint.dir (a shared filesystem across nodes)");
    return path;
  }
  return "";
}

// The model must be the checkpoint's; other training settings may change, with a warning,
// except for another split of the same global batch (other ranks, micro-batches or threads),
// which trains alike. By value: config_differences walks non-const field tables.
void check_saved_config(RunConfig saved, int saved_world_size, RunConfig config, int world_size,
                        const std::string& path) {
  const std::vector<std::string> differing = config_differences(saved, config, {"model."});
  if (!differing.empty()) {
    std::string keys;
    for (const std::string& key : differing) keys += (keys.empty() ? "" : ", ") + key;
    throw Error(ErrorKind::checkpoint, "the checkpoint in " + path + " has a different model: " + keys + " differ",
                "resume with the model settings of that run (see its config.toml), or train in another directory");
  }
  const int64_t saved_global = saved.train.global_batch(saved_world_size);
  const int64_t global = config.train.global_batch(world_size);
  for (const std::string& key : config_differences(saved, config, {"train.", "optimizer.", "schedule.", "data."})) {
    if (key == "train.threads" ||
        (saved_global == global && (key == "train.micro_batch_size" || key == "train.global_batch_size")))
      continue;
    log::warn("resuming with a changed " + key + " (the continuation will differ from the original run)");
  }
}

}  // namespace

ResumePoint resume_run(const RunConfig& config, int world_size, CheckpointStore& checkpoints, ParameterStore& params,
                       const NamedBuffers& state, Backend& backend, data::TrainLoader& loader,
                       const RankGroup& ranks) {
  const std::string& resume = config.checkpoint.resume;
  const std::string run_dir = run_directory(config);
  const std::vector<std::string> existing = checkpoints.list();
  if (!ranks.all(existing.empty() || resume != "never"))
    throw Error(ErrorKind::checkpoint,
                "run directory " + run_dir + " already has checkpoints and checkpoint.resume = never",
                "resume it (drop --no-resume), or start the new run elsewhere with -o DIR");
  if (resume == "never" || ranks.all(existing.empty())) {
    if (resume == "always")
      throw Error(ErrorKind::checkpoint, "--resume given but " + run_dir + " has no checkpoint",
                  "check -o/checkpoint.dir, or drop --resume to start a new run");
    return {};
  }
  CheckpointMeta meta;
  const std::string loaded = load_agreed_checkpoint(checkpoints, existing, params, state, backend, ranks, &meta);
  if (loaded.empty())
    throw Error(ErrorKind::checkpoint, "no checkpoint in " + run_dir + " could be loaded",
                "all are damaged; move the directory away to start fresh, or point -o elsewhere");
  check_saved_config(config_from_json(meta.config), meta.world_size, config, world_size, loaded);
  loader.restore_state(meta.data_state);
  log::info(strf("resumed from %s at step %lld", loaded.c_str(), static_cast<long long>(meta.step)));
  const std::string strategy = params.strategy_name();
  if (meta.world_size != world_size || meta.strategy != strategy)
    log::info(strf("resharded: saved by %d rank%s with %s, loaded by %d with %s", meta.world_size,
                   meta.world_size == 1 ? "" : "s", meta.strategy.c_str(), world_size, strategy.c_str()));
  return ResumePoint{meta.step, meta.tokens, meta.extra};
}

}  // namespace mxtrain
