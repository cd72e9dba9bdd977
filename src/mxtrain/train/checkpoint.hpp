// Checkpoints: run_dir/checkpoints/step_00000100/{manifest.json, rank_00000.bin, ...}.
// Each rank writes the f32 master weights and Adam moments of the ranges it owns as segments
// with a CRC-32 each; rank 0 writes the manifest (step, data position, RNG seed, config, world
// size, strategy, every segment's file/offset/range/checksum) after every rank has finished, and
// the directory becomes visible by one rename of step_X.tmp. A crash at any point leaves the
// previous checkpoint intact. Loading reads whichever segments overlap the ranges this rank now
// owns, so a checkpoint saved at one world size or strategy loads at any other (resharding).
//
// Integrity is a property of the format (version 2): the manifest carries a CRC-32 of itself
// (`manifest_crc32`, over its compact dump without that key), so the step, the data position, the
// config and every segment's place and size are covered as the data is by the segments' CRCs.
// Before any buffer is sized from it, a manifest is checked field by field (keys, types, ranges,
// `bytes` = 4 x `count`, segments inside their files, no two overlapping, the directory's step =
// the manifest's); any failure is an Error(checkpoint) naming the reason, so the caller skips to
// the previous checkpoint. Version 1 manifests (no checksum) still load, checked the same way.
// Version 3 adds each rank's resume state (FP8 delayed scaling's amax histories and scales) as
// segments of kind "state" in its own file, named in the manifest's extra.state_buffers;
// checkpoints of versions 1 and 2 load without it.
// Nothing non-finite is saved: a NaN or Inf in any master or moment stops the save (all ranks
// agree) before a manifest exists. Pruning deletes only checkpoints it verified (every segment
// read and its CRC checked) and older than the newest verified one, which it always keeps.
#pragma once
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/model/parameters.hpp"
#include "mxtrain/train/rank_group.hpp"

namespace mxtrain {

struct CheckpointMeta {
  int64_t step = 0;
  int64_t tokens = 0;
  uint64_t seed = 0;
  nlohmann::json data_state = nlohmann::json::object();  // sampler position
  nlohmann::json config = nlohmann::json::object();      // config_to_json() of the run
  nlohmann::json extra = nlohmann::json::object();  // precision state (loss scale, amax histories)
  int world_size = 1;
  std::string strategy = "local";
};

// What a checkpoint holds for each element of each group; `state`: a rank's resume state buffer
// (group = its index in the manifest's extra.state_buffers, one segment per rank that has it).
enum class CheckpointKind { master = 0, adam_m = 1, adam_v = 2, state = 3 };

// Named device buffers (f32) a resume restores besides the parameters: FP8 delayed scaling's amax
// histories and scales (TrainingSession::resume_buffers), each rank's own.
using NamedBuffers = std::vector<std::pair<std::string, Tensor>>;

// One checkpoint directory, read: the manifest on construction, then any element range of any
// group's masters or Adam moments, each segment's CRC-32 checked (load() and `mxtrain export`
// both read through it). Throws Error(checkpoint) naming the file and what is wrong.
// The constructor validates the whole manifest (see the file comment) and the sizes of the files
// it names; nothing else is trusted.
class CheckpointReader {
 public:
  struct Segment {
    std::string file;  // rank_NNNNN.bin in the checkpoint directory
    int group = 0;
    CheckpointKind kind = CheckpointKind::master;
    int64_t begin = 0, count = 0;  // elements of the group
    uint64_t offset = 0, bytes = 0;
    uint32_t crc32 = 0;
  };

  explicit CheckpointReader(std::string path);
  const CheckpointMeta& meta() const { return meta_; }
  const std::string& path() const { return path_; }
  int format_version() const { return version_; }
  const std::vector<Segment>& segments() const { return segments_; }
  // Elements [begin, begin + count) of `group` into out; every element must be covered.
  void read(int group, CheckpointKind kind, int64_t begin, int64_t count, float* out) const;
  // Resume state buffer `index` of `rank` (its CRC checked) into out, when the checkpoint has it
  // with `count` elements; false when it does not (an older format, another precision).
  bool read_state(int rank, int index, int64_t count, float* out) const;
  // Reads every segment and checks its CRC-32; throws Error(checkpoint) at the first mismatch.
  // part/parts: only the files of ranks r with r % parts == part (a collective verification).
  void verify_segments(int part = 0, int parts = 1) const;
  // The master weights as a source of parameter values (export, generate), for the layout of
  // the checkpoint's model; valid while this reader lives.
  ParameterValues master_values(const ModelLayout& layout) const;

 private:
  std::vector<float> read_segment(const Segment& segment) const;
  std::string path_;
  int version_ = 0;
  CheckpointMeta meta_;
  std::vector<Segment> segments_;
};

// The fuzzing and verification entry point: the checkpoint directory `path` read as resume
// would, manifest validated and every segment's checksum checked. Returns its metadata, or throws
// Error(checkpoint) naming the reason; never anything else, for any directory contents.
CheckpointMeta verify_checkpoint(const std::string& path);

// The CRC-32 that a version 2 manifest stores under "manifest_crc32": of its compact dump
// without that key.
uint32_t manifest_checksum(const nlohmann::json& manifest);

class CheckpointStore {
 public:
  // barrier: synchronises all ranks (no-op for one process). All ranks must share run_dir.
  CheckpointStore(std::string run_dir, int rank, int world_size, std::function<void()> barrier = {});
  // The ranks that agree on each stage of a save and on each verdict of pruning; without them,
  // each rank decides alone (one process, or ranks that are threads of a test).
  void set_ranks(RankGroup ranks) { ranks_ = ranks; }

  std::string directory() const { return run_dir_ + "/checkpoints"; }
  // Collective, before a run's first step: every rank creates the checkpoint directory (or finds
  // it) and writes and removes a small file in it, so a path that cannot hold checkpoints stops
  // the run now, not at its first save hours later. On any failure every rank throws the same
  // Error(system) naming the lowest failing rank, why (its errno) and what to do about it.
  void check_writable();
  // Collective: every rank calls it with its shards. Returns the final directory. Throws
  // Error(numerics) without writing a checkpoint when any rank's values are not finite. When any
  // rank fails its part (a full disk on its node), every rank learns it at the end of that stage
  // and throws the same Error(system) naming the lowest failing rank, what it could not write and
  // why (its errno); the temporary directory is removed and the previous checkpoint is intact.
  // state: this rank's resume state buffers, saved in its file (every rank passes the same names).
  std::string save(const CheckpointMeta& meta, const std::vector<ParamShard>& shards, Backend& backend,
                   const NamedBuffers& state = {});
  // Complete checkpoints (step_N directories with a manifest), newest first by step.
  std::vector<std::string> list() const;
  // Loads into this rank's shards (compute copies refreshed from the masters); verifies sizes and
  // checksums. Throws Error(checkpoint) naming the file and what is wrong. state: the resume
  // state buffers to restore, this rank's own (rank 0's when the checkpoint had fewer ranks);
  // those the checkpoint lacks, or holds under another name or size, keep their values, with a
  // warning that the continuation will differ from an uninterrupted run.
  CheckpointMeta load(const std::string& path, const std::vector<ParamShard>& shards, Backend& backend,
                      const NamedBuffers& state = {});
  // Newest valid checkpoint: a corrupt one is reported and the previous tried. Returns the path
  // loaded, or "" when the run directory has none.
  std::string load_latest(const std::vector<ParamShard>& shards, Backend& backend, CheckpointMeta* meta,
                          const NamedBuffers& state = {});
  // Rank 0: keeps the newest `keep` verified checkpoints (and always `protect`, the one just
  // saved, when it verifies) and deletes the older verified ones and stale temporaries. A
  // checkpoint that fails verification is never deleted, never counted, and reported once.
  void prune(int64_t keep, const std::string& protect = "");

 private:
  void barrier() const {
    if (barrier_) barrier_();
  }
  // Collective: runs this rank's `part` (empty where it has none) and has every rank learn which
  // ranks failed it (a WriteFailure's errno travels; any other failure's text stays in
  // *own_message and this rank's log).
  RankFailures agree_on(const std::function<void()>& part, std::string* own_message);
  // One stage of a save, collective: this rank's part of it (empty where it has none), then the
  // agreement described at save(). `what(rank)`: what that rank could not do, for the message.
  void agree_on_stage(int64_t step, const std::string& temporary, const std::function<void()>& part,
                      const std::function<std::string(int)>& what);
  // verify_checkpoint's verdict ("" = verified) per directory, remembered by this store (a
  // checkpoint is immutable once renamed into place; a re-save of a step clears its entry).
  const std::string& verdict(const std::string& path);
  // load()'s restore of the resume state buffers from `reader`.
  void restore_state(const CheckpointReader& reader, const NamedBuffers& state, Backend& backend);
  std::string run_dir_;
  int rank_, world_size_;
  std::function<void()> barrier_;
  RankGroup ranks_{nullptr};
  std::map<std::string, std::string> verdicts_;
};

std::string step_directory_name(int64_t step);  // "step_00000100"

// A checkpoint directory itself, or the newest complete checkpoint of a run directory; throws
// Error(checkpoint) saying what to pass when it is neither.
std::string resolve_checkpoint(const std::string& run_or_checkpoint);

}  // namespace mxtrain
