#include "mxtrain/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <optional>
#include <thread>
#include <tuple>

#include "mxtrain/core/checksum.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/core/progress.hpp"

namespace fs = std::filesystem;
using nlohmann::json;

namespace mxtrain {
namespace {

// 4: llama's mlp.up.weight (and its optimizer moments) hold the gate and up rows interleaved
//    (gate j at row 2j, up j at 2j + 1) instead of [gate; up]: a llama checkpoint of an older
//    version is refused (its rows would be read in the wrong order); other models load.
// 3: segments of kind "state" (a rank's resume state, e.g. FP8 delayed scaling's histories).
// 2: the manifest carries manifest_crc32. 1 (no checksum) is still read.
constexpr int kFormatVersion = 4;
constexpr int kInterleavedGateUpVersion = 4;
constexpr int kOldestReadableVersion = 1;
// A checkpoint write shows a progress line only when it runs longer than this (a small model's
// write takes milliseconds, a 1B model's about a second on a local disk), then every few seconds
// in a log (several times a second on a terminal).
constexpr double kCheckpointQuiet_s = 3.0;
constexpr double kCheckpointProgressInterval_s = 5.0;
const char* const kKinds[] = {"master", "adam_m", "adam_v", "state"};
// A rank's resume state: at most this many buffers (the FP8 delayed recipe has six).
constexpr int64_t kMaxStateBuffers = 64;
// Bounds no real checkpoint comes near; they keep every size computed from a manifest exact.
constexpr int64_t kMaxElements = int64_t{1} << 44;  // of one segment (64 TiB of f32)
constexpr int64_t kMaxStep = int64_t{1} << 52;
constexpr int64_t kMaxGroups = int64_t{1} << 20;
constexpr int64_t kMaxWorldSize = int64_t{1} << 20;

std::string rank_file_name(int rank) { return strf("rank_%05d.bin", rank); }
// A rank's list of the segments it wrote, which rank 0 gathers into the manifest.
std::string rank_sidecar_name(int rank) { return strf("rank_%05d.json", rank); }

// The rank a segment file name stands for, or -1 when the name is not rank_NNNNN.bin.
int rank_of_file(const std::string& name) {
  if (name.size() != 14 || name.rfind("rank_", 0) != 0 || name.substr(10) != ".bin") return -1;
  int rank = 0;
  for (size_t i = 5; i < 10; ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    rank = rank * 10 + (name[i] - '0');
  }
  return rank;
}

// The step of a step_N directory name, or -1 for anything else (temporaries included).
int64_t step_of_name(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

// Test hook: MXT_TEST_CHECKPOINT_PAUSE=STEP:SECONDS[:POINT] makes rank 0 sleep during the save of
// checkpoint STEP, so a test can SIGKILL the job there and check what survives. POINT:
// rank_files (this rank's file is written, nothing else), manifest (every rank file written, no
// manifest: the default), rename (the manifest written, not yet renamed into place), prune (the
// checkpoint in place, older ones not yet pruned).
void pause_for_crash_test(int64_t step, const std::string& point, const std::string& temporary) {
  const char* setting = std::getenv("MXT_TEST_CHECKPOINT_PAUSE");
  long long pause_step = 0;
  double seconds = 0;
  char wanted[32] = "manifest";
  if (!setting || std::sscanf(setting, "%lld:%lf:%31s", &pause_step, &seconds, wanted) < 2 || pause_step != step ||
      point != wanted)
    return;
  log::warn(strf("MXT_TEST_CHECKPOINT_PAUSE: pausing %.0f s at %s of %s", seconds, point.c_str(), temporary.c_str()));
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// The optimizer state of kinds 1 and 2 (the master, kind 0, goes through download_master and
// upload_master).
const Tensor& shard_tensor(const ParamShard& shard, int kind) { return kind == 1 ? shard.m : shard.v; }

bool all_finite(const std::vector<float>& values) {
  for (float value : values)
    if (!std::isfinite(value)) return false;
  return true;
}

// Field-by-field reading of a manifest: every failure is an Error(checkpoint) naming the
// manifest and the reason.
class ManifestFields {
 public:
  explicit ManifestFields(std::string manifest_path) : where_(std::move(manifest_path)) {}

  [[noreturn]] void fail(const std::string& reason) const {
    throw Error(ErrorKind::checkpoint, where_ + ": " + reason,
                "the checkpoint is damaged or was edited by hand; the previous checkpoint is used instead (delete "
                "this directory once you no longer need to inspect it)");
  }
  const json& member(const json& object, const char* key) const {
    const auto found = object.find(key);
    if (found == object.end()) fail(strf("missing key '%s'", key));
    return *found;
  }
  int64_t integer(const json& object, const char* key, int64_t minimum, int64_t maximum) const {
    const json& value = member(object, key);
    if (!value.is_number_integer()) fail(strf("'%s' is %s, not an integer", key, value.type_name()));
    if (value.is_number_unsigned() && value.get<uint64_t>() > static_cast<uint64_t>(maximum))
      fail(strf("'%s' = %llu is out of range", key, static_cast<unsigned long long>(value.get<uint64_t>())));
    const int64_t number = value.get<int64_t>();
    if (number < minimum || number > maximum)
      fail(strf("'%s' = %lld is outside [%lld, %lld]", key, static_cast<long long>(number),
                static_cast<long long>(minimum), static_cast<long long>(maximum)));
    return number;
  }
  uint64_t unsigned_integer(const json& object, const char* key, uint64_t maximum) const {
    const json& value = member(object, key);
    if (!value.is_number_integer() || (!value.is_number_unsigned() && value.get<int64_t>() < 0))
      fail(strf("'%s' is not an unsigned integer", key));
    const uint64_t number = value.get<uint64_t>();
    if (number > maximum) fail(strf("'%s' = %llu is out of range", key, static_cast<unsigned long long>(number)));
    return number;
  }
  const std::string& text(const json& object, const char* key) const {
    const json& value = member(object, key);
    if (!value.is_string()) fail(strf("'%s' is %s, not a string", key, value.type_name()));
    return value.get_ref<const std::string&>();
  }
  const json& object(const json& parent, const char* key) const {
    const json& value = member(parent, key);
    if (!value.is_object()) fail(strf("'%s' is %s, not an object", key, value.type_name()));
    return value;
  }

 private:
  std::string where_;
};

}  // namespace

std::string step_directory_name(int64_t step) { return strf("step_%08lld", static_cast<long long>(step)); }

uint32_t manifest_checksum(const json& manifest) {
  json covered = manifest;
  if (covered.is_object()) covered.erase("manifest_crc32");
  const std::string text = covered.dump(-1, ' ', false, json::error_handler_t::replace);
  return crc32(text.data(), text.size());
}

CheckpointStore::CheckpointStore(std::string run_dir, int rank, int world_size, std::function<void()> barrier)
    : run_dir_(std::move(run_dir)), rank_(rank), world_size_(world_size), barrier_(std::move(barrier)) {}

namespace {

// A failed write of a save: an Error(system) with the errno behind it, which the other ranks learn
// as a number (the text cannot travel). The stage it fails in turns it into the message every
// rank stops with (CheckpointStore::agree_on_stage).
class WriteFailure : public Error {
 public:
  WriteFailure(std::string what, int error_number)
      : Error(ErrorKind::system, std::move(what)), error_number_(error_number) {}
  int error_number() const { return error_number_; }

 private:
  int error_number_;
};

[[noreturn]] void throw_write_failure(const char* what, const std::string& path, int error_number) {
  throw WriteFailure(strf("%s %s: %s", what, path.c_str(), std::strerror(error_number)), error_number);
}

// Writes a whole small file of a save (throws WriteFailure).
void write_save_file(const std::string& path, const std::string& contents) {
  const int failure = try_write_file_atomically(path, contents);
  if (failure != 0) throw_write_failure("cannot write", path, failure);
}

// This rank's file: master, m and v of each shard, one segment each. Returns its segments, and
// in *finite whether every value written was finite. Every write, flush and sync is checked.
json write_rank_file(const std::string& path, const std::string& file_name, const std::vector<ParamShard>& shards,
                     const NamedBuffers& state, Backend& backend, bool* finite, std::optional<Progress>& progress) {
  std::FILE* file = std::fopen(path.c_str(), "wb");
  if (!file) throw_write_failure("cannot create", path, errno);
  json segments = json::array();
  uint64_t offset = 0;
  std::vector<float> host;
  *finite = true;
  auto fail = [&](const char* what) {
    const int saved = errno;
    std::fclose(file);
    throw_write_failure(what, path, saved);
  };
  // Writes `host` as the file's next segment.
  auto append = [&](int64_t group, const char* kind, int64_t begin) {
    const size_t bytes = host.size() * sizeof(float);
    if (std::fwrite(host.data(), 1, bytes, file) != bytes) fail("short write to");
    segments.push_back({{"file", file_name}, {"group", group}, {"kind", kind}, {"begin", begin},
                        {"count", static_cast<int64_t>(host.size())}, {"offset", offset}, {"bytes", bytes},
                        {"crc32", crc32(host.data(), bytes)}});
    offset += bytes;
  };
  for (const ParamShard& shard : shards) {
    host.resize(static_cast<size_t>(shard.count));
    for (int kind = 0; kind < 3; ++kind) {
      if (kind == 0)
        download_master(backend, shard, host.data());  // f32, also when the store splits it
      else
        backend.copy_to_host(shard_tensor(shard, kind), host.data());
      *finite = *finite && all_finite(host);
      append(shard.group, kKinds[kind], shard.begin);
      if (progress) progress->update(static_cast<double>(offset));
    }
  }
  // This rank's resume state, buffer i as segment "state" of group i.
  for (size_t i = 0; i < state.size(); ++i) {
    host.resize(static_cast<size_t>(state[i].second.numel()));
    backend.copy_to_host(state[i].second, host.data());
    append(static_cast<int64_t>(i), "state", 0);
  }
  if (std::fflush(file) != 0) fail("cannot write");
  if (::fsync(::fileno(file)) != 0) fail("cannot sync");
  if (std::fclose(file) != 0) throw_write_failure("cannot write", path, errno);
  if (progress) progress->finish();
  return segments;
}

// The manifest of every rank's segments (rank 0, once every rank has written its file).
json checkpoint_manifest(const CheckpointMeta& meta, const std::string& temporary, int world_size) {
  json all_segments = json::array();
  std::error_code error;
  for (int r = 0; r < world_size; ++r) {
    const std::string sidecar = temporary + "/" + rank_sidecar_name(r);
    std::ifstream in(sidecar);
    if (!in) throw Error(ErrorKind::checkpoint, "rank " + std::to_string(r) + " did not write " + sidecar,
                         "all ranks must share checkpoint.dir (a shared filesystem across nodes)");
    const json rank_segments = json::parse(in, nullptr, false);
    if (!rank_segments.is_array())
      throw Error(ErrorKind::checkpoint, sidecar + " is damaged", "all ranks must share checkpoint.dir");
    for (const auto& segment : rank_segments) all_segments.push_back(segment);
    in.close();
    fs::remove(sidecar, error);
  }
  json manifest = {{"format", "mxtrain-checkpoint"},
                   {"version", kFormatVersion},
                   {"step", meta.step},
                   {"tokens", meta.tokens},
                   {"seed", meta.seed},
                   {"data_state", meta.data_state},
                   {"config", meta.config},
                   {"extra", meta.extra},
                   {"world_size", meta.world_size},
                   {"strategy", meta.strategy},
                   {"segments", all_segments}};
  manifest["manifest_crc32"] = manifest_checksum(manifest);
  return manifest;
}

// What to do about a checkpoint write the lowest failing rank could not make, from its errno.
std::string write_fix(const RankFailures& failed, const std::string& directory) {
  switch (failed.first_code) {
    case ENOSPC:
    case EDQUOT:
    case EFBIG:
      return strf("free space in the filesystem of %s as rank %d sees it (or point checkpoint.dir elsewhere)",
                  directory.c_str(), failed.first_rank);
    case EACCES:
    case EPERM:
    case EROFS:
      return strf("make %s writable for rank %d (it is read-only or belongs to another user), or point "
                  "checkpoint.dir elsewhere",
                  directory.c_str(), failed.first_rank);
    case ENOTDIR:
    case EISDIR:
    case EEXIST:
      return strf("a file is where a directory of %s should be, or the reverse, as rank %d sees it: move it away, "
                  "or point checkpoint.dir elsewhere",
                  directory.c_str(), failed.first_rank);
    default:
      return strf("check the filesystem of %s as rank %d sees it (free space, permissions, that it is mounted), "
                  "or point checkpoint.dir elsewhere",
                  directory.c_str(), failed.first_rank);
  }
}

// Why the lowest failing rank failed, as this rank can say it: the text of its errno, its own
// message when it is that rank, or where to look.
std::string failure_reason(const RankFailures& failed, int rank, const std::string& own_message) {
  if (failed.first_code > 0) return std::strerror(failed.first_code);
  if (rank == failed.first_rank) return own_message;
  return strf("rank %d's log says why", failed.first_rank);
}

}  // namespace

RankFailures CheckpointStore::agree_on(const std::function<void()>& part, std::string* own_message) {
  std::optional<int> failure;
  try {
    if (part) part();
  } catch (const std::exception& error) {
    const auto* write = dynamic_cast<const WriteFailure*>(&error);
    failure = write ? write->error_number() : 0;
    *own_message = error.what();
    log::error(*own_message);  // this rank's own detail; the message every rank stops with follows
  }
  return ranks_.failures(rank_, world_size_, failure);
}

void CheckpointStore::agree_on_stage(int64_t step, const std::string& temporary, const std::function<void()>& part,
                                     const std::function<std::string(int)>& what) {
  std::string own_message;
  const RankFailures failed = agree_on(part, &own_message);
  if (failed.count == 0) return;
  std::error_code error;
  if (rank_ == 0) fs::remove_all(temporary, error);
  const std::vector<std::string> saved = list();
  std::string message = strf("checkpoint step %lld was not saved: rank %d could not %s: %s",
                             static_cast<long long>(step), failed.first_rank, what(failed.first_rank).c_str(),
                             failure_reason(failed, rank_, own_message).c_str());
  if (failed.count > 1) message += strf(" (and %d more ranks failed; their logs say why)", failed.count - 1);
  message += saved.empty() ? "; no earlier checkpoint exists" : "; the previous checkpoint " + saved.front() + " is intact";
  throw Error(ErrorKind::system, message,
              write_fix(failed, directory()) + ", then re-run the same command: " +
                  (saved.empty() ? "it starts again" : "it resumes from the previous checkpoint"));
}

void CheckpointStore::check_writable() {
  const std::string dir = directory();
  std::string own_message;
  bool created = false;
  const RankFailures failed = agree_on(
      [&] {
        std::error_code error;
        created = fs::create_directories(dir, error);
        if (!error && !fs::is_directory(dir, error)) error = std::make_error_code(std::errc::not_a_directory);
        if (error) throw_write_failure("cannot create the directory", dir, error.value());
        // A probe file, written and removed: a read-only or full filesystem shows now, not at step N.
        const std::string probe = dir + strf("/.mxtrain-write-test-rank%05d", rank_);
        write_save_file(probe, "mxtrain checks at start-up that it can write here\n");
        fs::remove(probe, error);
      },
      &own_message);
  // The rank that made the directory takes it away again once every rank has probed it (the
  // agreement above is collective): a run that stops before its first save leaves no empty
  // checkpoint directory behind; the first save makes it again. (fs::remove takes only an empty
  // directory: one another rank still writes in is left.)
  if (created) {
    std::error_code error;
    fs::remove(dir, error);
  }
  if (failed.count == 0) return;
  std::string message = strf("rank %d cannot write checkpoints to %s: %s", failed.first_rank, dir.c_str(),
                             failure_reason(failed, rank_, own_message).c_str());
  if (failed.count > 1) message += strf(" (and %d more ranks cannot; their logs say why)", failed.count - 1);
  throw Error(ErrorKind::system, message + "; nothing was trained or written",
              write_fix(failed, dir) + ", then re-run the same command");
}

std::string CheckpointStore::save(const CheckpointMeta& meta, const std::vector<ParamShard>& shards,
                                  Backend& backend, const NamedBuffers& state) {
  const std::string final_dir = directory() + "/" + step_directory_name(meta.step);
  const std::string temporary = final_dir + ".tmp";
  std::error_code error;
  agree_on_stage(
      meta.step, temporary,
      [&] {
        if (rank_ != 0) return;
        fs::create_directories(directory(), error);
        fs::remove_all(temporary, error);
        if (!fs::create_directories(temporary, error) && error)
          throw_write_failure("cannot create the checkpoint directory", temporary, error.value());
      },
      [&](int) { return "create the checkpoint directory " + temporary; });
  barrier();

  const std::string file_name = rank_file_name(rank_);
  bool finite = true;
  // A line with an ETA when the write takes more than a few seconds (rank 0's file; the ranks
  // write theirs at the same time).
  std::optional<Progress> progress;
  if (rank_ == 0) {
    double total_bytes = 0;
    for (const ParamShard& shard : shards) total_bytes += 3.0 * sizeof(float) * static_cast<double>(shard.count);
    progress.emplace(strf("checkpoint step %lld", static_cast<long long>(meta.step)), total_bytes, "bytes",
                     kCheckpointProgressInterval_s);
    progress->quiet_for(kCheckpointQuiet_s);
  }
  // Every rank learns whether each rank wrote its file (a full disk on one node stops them all).
  agree_on_stage(
      meta.step, temporary,
      [&] {
        const json segments =
            write_rank_file(temporary + "/" + file_name, file_name, shards, state, backend, &finite, progress);
        write_save_file(temporary + "/" + rank_sidecar_name(rank_), segments.dump());
      },
      [&](int rank) {
        return "write its part of the checkpoint, " + temporary + "/" + rank_file_name(rank) + " and .json";
      });
  // Nothing non-finite is saved: every rank learns whether any rank holds a NaN or an Inf.
  if (!ranks_.all(finite)) {
    if (rank_ == 0) fs::remove_all(temporary, error);
    throw Error(ErrorKind::numerics,
                strf("the weights or optimizer moments at step %lld are not finite (NaN or Inf%s); the checkpoint "
                     "was not saved",
                     static_cast<long long>(meta.step), finite ? " on another rank" : ""),
                "resume from the last checkpoint with a lower optimizer.lr or more schedule.warmup_steps, or set "
                "train.nonfinite = skip");
  }
  if (rank_ == 0) pause_for_crash_test(meta.step, "rank_files", temporary);
  barrier();

  agree_on_stage(
      meta.step, temporary,
      [&] {
        if (rank_ != 0) return;
        pause_for_crash_test(meta.step, "manifest", temporary);
        CheckpointMeta described = meta;
        if (!state.empty()) {
          json names = json::array();
          for (const auto& [name, tensor] : state) names.push_back(name);
          described.extra["state_buffers"] = names;  // what each rank's "state" segment i holds
        }
        const json manifest = checkpoint_manifest(described, temporary, world_size_);
        write_save_file(temporary + "/manifest.json", manifest.dump(1, ' ', false, json::error_handler_t::replace));
        fsync_path(temporary, true);
        pause_for_crash_test(meta.step, "rename", temporary);
        fs::remove_all(final_dir, error);
        fs::rename(temporary, final_dir, error);
        if (error) throw_write_failure(("cannot rename " + temporary + " to").c_str(), final_dir, error.value());
        fsync_path(directory(), true);
        pause_for_crash_test(meta.step, "prune", final_dir);
      },
      [&](int) { return "write the manifest of " + temporary + " and rename it to " + final_dir; });
  verdicts_.erase(final_dir);  // a step saved again is verified again
  barrier();
  return final_dir;
}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code error;
  if (!fs::is_directory(directory(), error)) return {};
  for (const auto& entry : fs::directory_iterator(directory(), error)) {
    const int64_t step = step_of_name(entry.path().filename().string());
    if (step >= 0 && fs::is_regular_file(entry.path() / "manifest.json", error))
      found.emplace_back(step, entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  std::vector<std::string> paths;
  for (auto& [step, path] : found) paths.push_back(std::move(path));
  return paths;
}

CheckpointReader::CheckpointReader(std::string path) : path_(std::move(path)) {
  const std::string manifest_path = path_ + "/manifest.json";
  const ManifestFields fields(manifest_path);
  json manifest;
  {
    std::ifstream in(manifest_path);
    if (!in) throw Error(ErrorKind::checkpoint, "cannot read " + manifest_path, "the checkpoint is incomplete");
    manifest = json::parse(in, nullptr, false);
    if (manifest.is_discarded()) fields.fail("not valid JSON (cut short or damaged)");
  }
  if (!manifest.is_object()) fields.fail("not a JSON object");
  try {
    const auto format = manifest.find("format");
    if (format == manifest.end() || *format != "mxtrain-checkpoint")
      throw Error(ErrorKind::checkpoint, manifest_path + " is not an mxtrain checkpoint manifest",
                  "point checkpoint.dir at a run directory written by mxtrain");
    version_ = static_cast<int>(fields.integer(manifest, "version", 0, std::numeric_limits<int>::max()));
    if (version_ < kOldestReadableVersion || version_ > kFormatVersion)
      throw Error(ErrorKind::checkpoint,
                  strf("%s has checkpoint format version %d; this mxtrain reads versions %d to %d",
                       manifest_path.c_str(), version_, kOldestReadableVersion, kFormatVersion),
                  version_ > kFormatVersion ? "use the mxtrain that wrote it (or a newer one)"
                                            : "resave it with the mxtrain that wrote it");
    // Everything below, the segments' places and sizes included, is covered by this checksum.
    if (version_ >= 2) {
      const uint64_t stored = fields.unsigned_integer(manifest, "manifest_crc32", 0xffffffffu);
      const uint32_t computed = manifest_checksum(manifest);
      if (stored != computed)
        fields.fail(strf("manifest checksum mismatch (stored %08llx, computed %08x): edited or damaged",
                         static_cast<unsigned long long>(stored), computed));
    }
    meta_.step = fields.integer(manifest, "step", 0, kMaxStep);
    const int64_t named_step = step_of_name(fs::path(path_).filename().string());
    if (named_step >= 0 && named_step != meta_.step)
      fields.fail(strf("the directory is step %lld but the manifest says step %lld", static_cast<long long>(named_step),
                       static_cast<long long>(meta_.step)));
    meta_.tokens = fields.integer(manifest, "tokens", 0, std::numeric_limits<int64_t>::max());
    meta_.seed = fields.unsigned_integer(manifest, "seed", std::numeric_limits<uint64_t>::max());
    meta_.data_state = fields.object(manifest, "data_state");
    meta_.config = fields.object(manifest, "config");
    for (const auto& [key, value] : meta_.config.items())
      if (!value.is_string()) fields.fail("config key '" + key + "' is not a string");
    if (version_ < kInterleavedGateUpVersion && meta_.config.value("model.family", "") == "llama")
      throw Error(ErrorKind::checkpoint,
                  strf("%s is a llama checkpoint of format version %d, which stores the MLP's gate/up weight as "
                       "[gate; up]; this mxtrain (format %d) stores it interleaved and would read it wrongly",
                       manifest_path.c_str(), version_, kFormatVersion),
                  "export it to Hugging Face format with the mxtrain that wrote it (mxtrain export), then start "
                  "from that with model.init_from (the optimizer state does not carry over)");
    meta_.extra = version_ >= 2 || manifest.contains("extra") ? fields.object(manifest, "extra") : json::object();
    size_t state_buffers = 0;
    if (meta_.extra.contains("state_buffers")) {
      const json& names = meta_.extra["state_buffers"];
      if (!names.is_array() || names.size() > static_cast<size_t>(kMaxStateBuffers))
        fields.fail(strf("'extra.state_buffers' is not an array of at most %lld names",
                         static_cast<long long>(kMaxStateBuffers)));
      for (const json& name : names)
        if (!name.is_string()) fields.fail("'extra.state_buffers' holds a name that is not a string");
      state_buffers = names.size();
    }
    meta_.world_size = static_cast<int>(fields.integer(manifest, "world_size", 1, kMaxWorldSize));
    meta_.strategy = fields.text(manifest, "strategy");

    const json& segments = fields.member(manifest, "segments");
    if (!segments.is_array()) fields.fail("'segments' is not an array");
    std::map<std::string, uintmax_t> file_sizes;
    for (const json& entry : segments) {
      if (!entry.is_object()) fields.fail("a segment is not an object");
      Segment segment;
      segment.file = fields.text(entry, "file");
      const int file_rank = rank_of_file(segment.file);
      if (file_rank < 0 || file_rank >= meta_.world_size)
        fields.fail("segment file '" + segment.file + "' is not rank_NNNNN.bin of a rank below world_size");
      segment.group = static_cast<int>(fields.integer(entry, "group", 0, kMaxGroups));
      const std::string& kind = fields.text(entry, "kind");
      const auto known = std::find(std::begin(kKinds), std::end(kKinds), kind);
      const bool state = known != std::end(kKinds) && kind == "state";
      if (known == std::end(kKinds) || (state && version_ < 3))
        fields.fail("segment kind '" + kind + "' is not master, adam_m or adam_v" +
                    (version_ >= 3 ? " or state" : " (format version " + std::to_string(version_) + ")"));
      segment.kind = static_cast<CheckpointKind>(known - std::begin(kKinds));
      // A state segment is buffer `group` of extra.state_buffers, whole.
      if (state && static_cast<size_t>(segment.group) >= state_buffers)
        fields.fail(strf("state segment %d has no name in extra.state_buffers (%zu names)", segment.group,
                         state_buffers));
      segment.begin = fields.integer(entry, "begin", 0, state ? 0 : kMaxElements);
      segment.count = fields.integer(entry, "count", 0, kMaxElements);
      segment.offset = static_cast<uint64_t>(fields.integer(entry, "offset", 0, kMaxElements * 64));
      segment.bytes = static_cast<uint64_t>(fields.integer(entry, "bytes", 0, kMaxElements * 4));
      segment.crc32 = static_cast<uint32_t>(fields.unsigned_integer(entry, "crc32", 0xffffffffu));
      if (segment.bytes != static_cast<uint64_t>(segment.count) * sizeof(float))
        fields.fail(strf("segment %s of group %d has %llu bytes for %lld elements (4 bytes each)", kind.c_str(),
                         segment.group, static_cast<unsigned long long>(segment.bytes),
                         static_cast<long long>(segment.count)));
      auto size = file_sizes.find(segment.file);
      if (size == file_sizes.end()) {
        std::error_code error;
        const uintmax_t bytes = fs::file_size(path_ + "/" + segment.file, error);
        if (error)
          throw Error(ErrorKind::checkpoint, "missing checkpoint file " + path_ + "/" + segment.file,
                      "the checkpoint is incomplete; the previous one is used instead");
        size = file_sizes.emplace(segment.file, bytes).first;
      }
      if (segment.offset + segment.bytes > size->second)
        throw Error(ErrorKind::checkpoint,
                    strf("%s/%s is truncated: segment %s of group %d needs bytes [%llu, %llu) of its %llu",
                         path_.c_str(), segment.file.c_str(), kind.c_str(), segment.group,
                         static_cast<unsigned long long>(segment.offset),
                         static_cast<unsigned long long>(segment.offset + segment.bytes),
                         static_cast<unsigned long long>(size->second)),
                    "the checkpoint was not written completely; the previous one is used instead");
      segments_.push_back(std::move(segment));
    }
    // No element is held twice: then "every element covered" is a count (read()).
    std::vector<const Segment*> ordered;
    for (const Segment& segment : segments_) ordered.push_back(&segment);
    // (A state segment belongs to its rank: those of one buffer on two ranks do not overlap.)
    auto owner = [](const Segment* segment) {
      return segment->kind == CheckpointKind::state ? rank_of_file(segment->file) : -1;
    };
    std::sort(ordered.begin(), ordered.end(), [&](const Segment* a, const Segment* b) {
      return std::make_tuple(a->group, a->kind, owner(a), a->begin) <
             std::make_tuple(b->group, b->kind, owner(b), b->begin);
    });
    for (size_t i = 1; i < ordered.size(); ++i) {
      const Segment& before = *ordered[i - 1];
      const Segment& after = *ordered[i];
      if (before.group == after.group && before.kind == after.kind && owner(&before) == owner(&after) &&
          before.begin + before.count > after.begin)
        fields.fail(strf("segments of group %d (%s) overlap at element %lld", after.group,
                         kKinds[static_cast<int>(after.kind)], static_cast<long long>(after.begin)));
    }
  } catch (const json::exception& error) {
    fields.fail(error.what());
  }
  if (version_ < 2)
    log::warn(path_ + " has checkpoint format version 1, whose manifest has no checksum: its fields are checked "
                      "for consistency only");
}

std::vector<float> CheckpointReader::read_segment(const Segment& segment) const {
  const char* kind_name = kKinds[static_cast<int>(segment.kind)];
  const std::string file_path = path_ + "/" + segment.file;
  std::FILE* file = std::fopen(file_path.c_str(), "rb");
  if (!file) throw Error(ErrorKind::checkpoint, "missing checkpoint file " + file_path, "the checkpoint is incomplete");
  std::vector<float> data(static_cast<size_t>(segment.count));  // bytes = 4 x count, inside the file
  const bool ok = ::fseeko(file, static_cast<off_t>(segment.offset), SEEK_SET) == 0 &&
                  std::fread(data.data(), 1, segment.bytes, file) == segment.bytes;
  std::fclose(file);
  if (!ok)
    throw Error(ErrorKind::checkpoint,
                strf("%s is truncated: segment %s of group %d needs bytes [%llu, %llu)", file_path.c_str(), kind_name,
                     segment.group, static_cast<unsigned long long>(segment.offset),
                     static_cast<unsigned long long>(segment.offset + segment.bytes)),
                "the checkpoint was not written completely; use an older one");
  if (crc32(data.data(), segment.bytes) != segment.crc32)
    throw Error(ErrorKind::checkpoint,
                strf("checksum mismatch in %s at byte offset %llu (segment %s of group %d)", file_path.c_str(),
                     static_cast<unsigned long long>(segment.offset), kind_name, segment.group),
                "the checkpoint is corrupt; use an older one");
  return data;
}

void CheckpointReader::read(int group, CheckpointKind kind, int64_t begin, int64_t count, float* out) const {
  int64_t covered = 0;
  for (const Segment& segment : segments_) {
    if (segment.group != group || segment.kind != kind) continue;
    const int64_t lo = std::max(segment.begin, begin);
    const int64_t hi = std::min(segment.begin + segment.count, begin + count);
    if (lo >= hi) continue;
    const std::vector<float> data = read_segment(segment);
    std::copy(data.begin() + (lo - segment.begin), data.begin() + (hi - segment.begin), out + (lo - begin));
    covered += hi - lo;
  }
  if (covered != count)
    throw Error(ErrorKind::checkpoint,
                strf("%s covers %lld of the %lld elements of group %d (%s) asked for", path_.c_str(),
                     static_cast<long long>(covered), static_cast<long long>(count), group,
                     kKinds[static_cast<int>(kind)]),
                "the checkpoint belongs to a different model shape; check model.* against its manifest");
}

bool CheckpointReader::read_state(int rank, int index, int64_t count, float* out) const {
  for (const Segment& segment : segments_) {
    if (segment.kind != CheckpointKind::state || segment.group != index || rank_of_file(segment.file) != rank)
      continue;
    if (segment.count != count) return false;
    const std::vector<float> data = read_segment(segment);
    std::copy(data.begin(), data.end(), out);
    return true;
  }
  return false;
}

void CheckpointReader::verify_segments(int part, int parts) const {
  for (const Segment& segment : segments_)
    if (rank_of_file(segment.file) % parts == part) read_segment(segment);
}

ParameterValues CheckpointReader::master_values(const ModelLayout& layout) const {
  return [this, layout](const ParamSpec& spec, int64_t begin, int64_t count, float* out) {
    int group = 0, index = 0;
    MXTRAIN_ASSERT(layout.locate(spec.name, &group, &index), "parameter %s not in the layout", spec.name.c_str());
    read(group, CheckpointKind::master, spec.offset + begin, count, out);
  };
}

CheckpointMeta verify_checkpoint(const std::string& path) {
  const CheckpointReader reader(path);
  reader.verify_segments();
  return reader.meta();
}

CheckpointMeta CheckpointStore::load(const std::string& path, const std::vector<ParamShard>& shards,
                                     Backend& backend, const NamedBuffers& state) {
  const CheckpointReader reader(path);
  std::vector<float> local;
  for (const ParamShard& shard : shards) {
    local.assign(static_cast<size_t>(shard.count), 0.0f);
    for (CheckpointKind kind : {CheckpointKind::master, CheckpointKind::adam_m, CheckpointKind::adam_v}) {
      reader.read(shard.group, kind, shard.begin, shard.count, local.data());
      if (kind == CheckpointKind::master)
        upload_master(backend, shard, local.data());  // and the compute copy
      else
        backend.copy_from_host(local.data(), shard_tensor(shard, static_cast<int>(kind)));
    }
    if (shard.grad.defined()) backend.fill(shard.grad, 0.0f);
  }
  restore_state(reader, state, backend);
  return reader.meta();
}

void CheckpointStore::restore_state(const CheckpointReader& reader, const NamedBuffers& state, Backend& backend) {
  if (state.empty()) return;
  const json& names = reader.meta().extra.contains("state_buffers") ? reader.meta().extra["state_buffers"]
                                                                     : json::array();
  // This rank's own state; a rank the saving run did not have takes rank 0's.
  const int source = rank_ < reader.meta().world_size ? rank_ : 0;
  std::vector<float> host;
  std::string missing;
  for (size_t i = 0; i < state.size(); ++i) {
    const auto& [name, tensor] = state[i];
    host.resize(static_cast<size_t>(tensor.numel()));
    const bool named = i < names.size() && names[i] == name;
    if (named && reader.read_state(source, static_cast<int>(i), tensor.numel(), host.data()))
      backend.copy_from_host(host.data(), tensor);
    else
      missing += (missing.empty() ? "" : ", ") + name;
  }
  if (!missing.empty())
    log::warn("checkpoint " + reader.path() + " does not hold " + missing +
              " as this run has them (it was written by an mxtrain before format version 3, or with another "
              "precision): they start afresh, so the continuation differs from an uninterrupted run");
}

std::string CheckpointStore::load_latest(const std::vector<ParamShard>& shards, Backend& backend,
                                         CheckpointMeta* meta, const NamedBuffers& state) {
  for (const std::string& path : list()) {
    try {
      *meta = load(path, shards, backend, state);
      return path;
    } catch (const Error& error) {
      if (error.kind() != ErrorKind::checkpoint) throw;
      log::warn("skipping checkpoint " + path + ": " + error.what() + "; trying the previous one");
    }
  }
  return "";
}

const std::string& CheckpointStore::verdict(const std::string& path) {
  auto found = verdicts_.find(path);
  if (found != verdicts_.end()) return found->second;
  // Each rank reads the files of every world_size-th rank, so a checkpoint is read once in all.
  std::string reason;
  try {
    const CheckpointReader reader(path);
    reader.verify_segments(rank_, world_size_);
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::checkpoint) throw;
    reason = error.what();
  }
  const bool verified = ranks_.all(reason.empty());
  if (!verified) {
    if (reason.empty()) reason = "another rank could not verify it";
    log::warn("checkpoint " + path + " does not verify (" + reason + "): pruning leaves it in place and does not "
              "count it");
  }
  return verdicts_.emplace(path, verified ? "" : reason).first->second;
}

void CheckpointStore::prune(int64_t keep, const std::string& protect) {
  std::error_code error;
  // Temporaries are unfinished saves (a kill or a full disk): never checkpoints. One run per
  // directory (run_lock.hpp) means no save is in progress now.
  if (rank_ == 0 && fs::is_directory(directory(), error))
    for (const auto& entry : fs::directory_iterator(directory(), error)) {
      const std::string name = entry.path().filename().string();
      const bool temporary = name.size() > 4 && name.substr(name.size() - 4) == ".tmp";
      if (temporary && step_of_name(name.substr(0, name.size() - 4)) >= 0) fs::remove_all(entry.path(), error);
    }
  // Collective: every rank walks the same list and agrees on each verdict.
  std::vector<std::string> verified;
  for (const std::string& path : list())
    if (verdict(path).empty()) verified.push_back(path);
  if (rank_ == 0) {
    int64_t kept = 0;
    for (const std::string& path : verified) {
      if (kept < std::max<int64_t>(keep, 1) || path == protect) {
        ++kept;
        continue;
      }
      // Verified, and older than the newest verified checkpoint (`verified` is newest first).
      fs::remove_all(path, error);
      verdicts_.erase(path);
    }
  }
  barrier();
}

std::string resolve_checkpoint(const std::string& run_or_checkpoint) {
  std::error_code error;
  if (fs::is_regular_file(fs::path(run_or_checkpoint) / "manifest.json", error)) return run_or_checkpoint;
  const std::vector<std::string> found = CheckpointStore(run_or_checkpoint, 0, 1).list();
  if (found.empty())
    throw Error(ErrorKind::checkpoint,
                run_or_checkpoint + " is neither a checkpoint directory nor a run directory with checkpoints",
                "pass a run directory (train -o DIR) or one of its checkpoints/step_* directories");
  // The newest whose manifest is valid (its segments' checksums are checked as they are read).
  for (const std::string& path : found) {
    try {
      CheckpointReader reader(path);
      return path;
    } catch (const Error& failure) {
      if (failure.kind() != ErrorKind::checkpoint) throw;
      log::warn("skipping checkpoint " + path + ": " + failure.what() + "; trying the previous one");
    }
  }
  throw Error(ErrorKind::checkpoint, "no checkpoint in " + run_or_checkpoint + " has a valid manifest",
              "the checkpoints are damaged; pass another run directory");
}

}  // namespace mxtrain
