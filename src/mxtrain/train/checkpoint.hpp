// Checkpoints: run_dir/checkpoints/step_00000100/{manifest.json, rank_00000.bin, ...}.
// Each rank writes the f32 master weights and Adam moments of the ranges it owns as segments
// with a CRC-32 each; rank 0 writes the manifest (step, data position, RNG seed, config, world
// size, strategy, every segment's file/offset/range/checksum) after every rank has finished, and
// the directory becomes visible by one rename of step_X.tmp. A crash at any point leaves the
// previous checkpoint intact. Loading reads whichever segments overlap the ranges this rank now
// owns, so a checkpoint saved at one world size or strategy loads at any other (resharding).
#pragma once
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/model/parameters.hpp"

namespace mxtrain {

struct CheckpointMeta {
  int64_t step = 0;
  int64_t tokens = 0;
  uint64_t seed = 0;
  nlohmann::json data_state;   // sampler position
  nlohmann::json config;       // config_to_json() of the run
  nlohmann::json extra = nlohmann::json::object();  // precision state (loss scale, amax histories)
  int world_size = 1;
  std::string strategy = "local";
};

// What a checkpoint holds for each element of each group.
enum class CheckpointKind { master = 0, adam_m = 1, adam_v = 2 };

// One checkpoint directory, read: the manifest on construction, then any element range of any
// group's masters or Adam moments, each segment's CRC-32 checked (load() and `mxtrain export`
// both read through it). Throws Error(checkpoint) naming the file and what is wrong.
class CheckpointReader {
 public:
  explicit CheckpointReader(std::string path);
  const CheckpointMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }
  // Elements [begin, begin + count) of `group` into out; every element must be covered.
  void read(int group, CheckpointKind kind, int64_t begin, int64_t count, float* out) const;
  // The master weights as a source of parameter values (export, generate), for the layout of
  // the checkpoint's model; valid while this reader lives.
  ParameterValues master_values(const ModelLayout& layout) const;

 private:
  std::string path_;
  nlohmann::json manifest_;
  CheckpointMeta meta_;
};

class CheckpointStore {
 public:
  // barrier: synchronises all ranks (no-op for one process). All ranks must share run_dir.
  CheckpointStore(std::string run_dir, int rank, int world_size, std::function<void()> barrier = {});

  std::string directory() const { return run_dir_ + "/checkpoints"; }
  // Collective: every rank calls it with its shards. Returns the final directory.
  std::string save(const CheckpointMeta& meta, const std::vector<ParamShard>& shards, Backend& backend);
  // Complete checkpoints (with a manifest), newest first.
  std::vector<std::string> list() const;
  // Loads into this rank's shards (compute copies refreshed from the masters); verifies sizes and
  // checksums. Throws Error(checkpoint) naming the file and what is wrong.
  CheckpointMeta load(const std::string& path, const std::vector<ParamShard>& shards, Backend& backend);
  // Newest valid checkpoint: a corrupt one is reported and the previous tried. Returns the path
  // loaded, or "" when the run directory has none.
  std::string load_latest(const std::vector<ParamShard>& shards, Backend& backend, CheckpointMeta* meta);
  // Removes all but the newest `keep` complete checkpoints and stale temporaries (rank 0).
  void prune(int64_t keep);

 private:
  void barrier() const {
    if (barrier_) barrier_();
  }
  std::string run_dir_;
  int rank_, world_size_;
  std::function<void()> barrier_;
};

std::string step_directory_name(int64_t step);  // "step_00000100"

// A checkpoint directory itself, or the newest complete checkpoint of a run directory; throws
// Error(checkpoint) saying what to pass when it is neither.
std::string resolve_checkpoint(const std::string& run_or_checkpoint);

}  // namespace mxtrain
