#include "mxtrain/train/checkpoint.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "mxtrain/core/checksum.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/core/progress.hpp"

namespace fs = std::filesystem;

namespace mxtrain {
namespace {

constexpr int kFormatVersion = 1;
// A checkpoint write shows a progress line only when it runs longer than this (a small model's
// write takes milliseconds, a 1B model's about a second on a local disk), then every few seconds
// in a log (several times a second on a terminal).
constexpr double kCheckpointQuiet_s = 3.0;
constexpr double kCheckpointProgressInterval_s = 5.0;
const char* const kKinds[] = {"master", "adam_m", "adam_v"};

std::string rank_file_name(int rank) { return strf("rank_%05d.bin", rank); }

// Test hook: MXT_TEST_CHECKPOINT_PAUSE=STEP:SECONDS makes rank 0 sleep when every rank file
// of checkpoint STEP is written but before the manifest and the rename, so a test can SIGKILL
// the job in the worst moment and check that the previous checkpoint still loads.
void pause_for_crash_test(int64_t step, const std::string& temporary) {
  const char* setting = std::getenv("MXT_TEST_CHECKPOINT_PAUSE");
  long long pause_step = 0;
  double seconds = 0;
  if (!setting || std::sscanf(setting, "%lld:%lf", &pause_step, &seconds) != 2 || pause_step != step) return;
  log::warn(strf("MXT_TEST_CHECKPOINT_PAUSE: pausing %.0f s before finishing %s", seconds, temporary.c_str()));
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

// The optimizer state of kinds 1 and 2 (the master, kind 0, goes through download_master and
// upload_master).
const Tensor& shard_tensor(const ParamShard& shard, int kind) { return kind == 1 ? shard.m : shard.v; }

}  // namespace

std::string step_directory_name(int64_t step) { return strf("step_%08lld", static_cast<long long>(step)); }

CheckpointStore::CheckpointStore(std::string run_dir, int rank, int world_size, std::function<void()> barrier)
    : run_dir_(std::move(run_dir)), rank_(rank), world_size_(world_size), barrier_(std::move(barrier)) {}

std::string CheckpointStore::save(const CheckpointMeta& meta, const std::vector<ParamShard>& shards,
                                  Backend& backend) {
  const std::string final_dir = directory() + "/" + step_directory_name(meta.step);
  const std::string temporary = final_dir + ".tmp";
  std::error_code error;
  if (rank_ == 0) {
    fs::create_directories(directory(), error);
    fs::remove_all(temporary, error);
    if (!fs::create_directories(temporary, error) && error)
      throw Error(ErrorKind::system, "cannot create checkpoint directory " + temporary + ": " + error.message(),
                  "check that checkpoint.dir is writable and has free space");
  }
  barrier();

  // This rank's file: master, m and v of each shard, one segment each.
  nlohmann::json segments = nlohmann::json::array();
  const std::string file_name = rank_file_name(rank_);
  {
    std::string path = temporary + "/" + file_name;
    std::FILE* file = std::fopen(path.c_str(), "wb");
    if (!file) throw Error(ErrorKind::system, "cannot create " + path, "check that checkpoint.dir is writable");
    uint64_t offset = 0;
    std::vector<float> host;
    // A line with an ETA when the write takes more than a few seconds (rank 0's file; the ranks
    // write theirs at the same time).
    double total_bytes = 0;
    for (const ParamShard& shard : shards) total_bytes += 3.0 * sizeof(float) * static_cast<double>(shard.count);
    std::optional<Progress> progress;
    if (rank_ == 0) {
      progress.emplace(strf("checkpoint step %lld", static_cast<long long>(meta.step)), total_bytes, "bytes",
                       kCheckpointProgressInterval_s);
      progress->quiet_for(kCheckpointQuiet_s);
    }
    for (const ParamShard& shard : shards) {
      host.resize(static_cast<size_t>(shard.count));
      for (int kind = 0; kind < 3; ++kind) {
        if (kind == 0)
          download_master(backend, shard, host.data());  // f32, also when the store splits it
        else
          backend.copy_to_host(shard_tensor(shard, kind), host.data());
        size_t bytes = host.size() * sizeof(float);
        if (std::fwrite(host.data(), 1, bytes, file) != bytes) {
          std::fclose(file);
          throw Error(ErrorKind::system, "short write to " + path, "check free disk space in checkpoint.dir");
        }
        segments.push_back({{"file", file_name}, {"group", shard.group}, {"kind", kKinds[kind]},
                            {"begin", shard.begin}, {"count", shard.count}, {"offset", offset}, {"bytes", bytes},
                            {"crc32", crc32(host.data(), bytes)}});
        offset += bytes;
        if (progress) progress->update(static_cast<double>(offset));
      }
    }
    std::fflush(file);
    ::fsync(::fileno(file));
    std::fclose(file);
    if (progress) progress->finish();
    write_file_atomically(temporary + "/" + strf("rank_%05d.json", rank_), segments.dump());
  }
  barrier();

  if (rank_ == 0) {
    pause_for_crash_test(meta.step, temporary);
    nlohmann::json all_segments = nlohmann::json::array();
    for (int r = 0; r < world_size_; ++r) {
      std::string sidecar = temporary + "/" + strf("rank_%05d.json", r);
      std::ifstream in(sidecar);
      if (!in) throw Error(ErrorKind::checkpoint, "rank " + std::to_string(r) + " did not write " + sidecar,
                           "all ranks must share checkpoint.dir (a shared filesystem across nodes)");
      nlohmann::json rank_segments = nlohmann::json::parse(in);
      for (auto& segment : rank_segments) all_segments.push_back(segment);
      in.close();
      fs::remove(sidecar, error);
    }
    nlohmann::json manifest = {{"format", "mxtrain-checkpoint"},
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
    write_file_atomically(temporary + "/manifest.json", manifest.dump(1));
    fsync_path(temporary, true);
    fs::remove_all(final_dir, error);
    fs::rename(temporary, final_dir, error);
    if (error)
      throw Error(ErrorKind::system, "cannot rename " + temporary + " to " + final_dir + ": " + error.message(),
                  "check permissions of checkpoint.dir");
    fsync_path(directory(), true);
  }
  barrier();
  return final_dir;
}

std::vector<std::string> CheckpointStore::list() const {
  std::vector<std::string> found;
  std::error_code error;
  if (!fs::is_directory(directory(), error)) return found;
  for (const auto& entry : fs::directory_iterator(directory(), error)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) != 0 || name.find(".tmp") != std::string::npos) continue;
    if (fs::exists(entry.path() / "manifest.json")) found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end(), std::greater<>());
  return found;
}

CheckpointReader::CheckpointReader(std::string path) : path_(std::move(path)) {
  const std::string manifest_path = path_ + "/manifest.json";
  {
    std::ifstream in(manifest_path);
    if (!in) throw Error(ErrorKind::checkpoint, "cannot read " + manifest_path, "the checkpoint is incomplete");
    try {
      manifest_ = nlohmann::json::parse(in);
    } catch (const nlohmann::json::exception& parse_error) {
      throw Error(ErrorKind::checkpoint, manifest_path + " is not valid JSON: " + parse_error.what(),
                  "the checkpoint is damaged; an older one can be used by deleting this directory");
    }
  }
  if (manifest_.value("format", "") != "mxtrain-checkpoint" || manifest_.value("version", 0) != kFormatVersion)
    throw Error(ErrorKind::checkpoint, manifest_path + " is not an mxtrain checkpoint of format version 1",
                "point checkpoint.dir at a run directory written by this mxtrain");
  meta_.step = manifest_.at("step").get<int64_t>();
  meta_.tokens = manifest_.value("tokens", int64_t{0});
  meta_.seed = manifest_.value("seed", uint64_t{0});
  meta_.data_state = manifest_.at("data_state");
  meta_.config = manifest_.at("config");
  meta_.extra = manifest_.value("extra", nlohmann::json::object());
  meta_.world_size = manifest_.value("world_size", 1);
  meta_.strategy = manifest_.value("strategy", std::string("local"));
}

void CheckpointReader::read(int group, CheckpointKind kind, int64_t begin, int64_t count, float* out) const {
  const char* kind_name = kKinds[static_cast<int>(kind)];
  std::vector<float> segment_data;
  int64_t covered = 0;
  for (const auto& segment : manifest_.at("segments")) {
    if (segment.at("group").get<int>() != group || segment.at("kind").get<std::string>() != kind_name) continue;
    const int64_t seg_begin = segment.at("begin").get<int64_t>();
    const int64_t seg_count = segment.at("count").get<int64_t>();
    const int64_t lo = std::max(seg_begin, begin);
    const int64_t hi = std::min(seg_begin + seg_count, begin + count);
    if (lo >= hi) continue;
    const std::string file_path = path_ + "/" + segment.at("file").get<std::string>();
    const uint64_t offset = segment.at("offset").get<uint64_t>();
    const uint64_t bytes = segment.at("bytes").get<uint64_t>();
    std::FILE* file = std::fopen(file_path.c_str(), "rb");
    if (!file) throw Error(ErrorKind::checkpoint, "missing checkpoint file " + file_path, "the checkpoint is incomplete");
    segment_data.resize(static_cast<size_t>(seg_count));
    const bool ok = std::fseek(file, static_cast<long>(offset), SEEK_SET) == 0 &&
                    std::fread(segment_data.data(), 1, bytes, file) == bytes;
    std::fclose(file);
    if (!ok)
      throw Error(ErrorKind::checkpoint,
                  strf("%s is truncated: segment %s of group %d needs bytes [%llu, %llu)", file_path.c_str(), kind_name,
                       group, static_cast<unsigned long long>(offset), static_cast<unsigned long long>(offset + bytes)),
                  "the checkpoint was not written completely; use an older one");
    if (crc32(segment_data.data(), bytes) != segment.at("crc32").get<uint32_t>())
      throw Error(ErrorKind::checkpoint,
                  strf("checksum mismatch in %s at byte offset %llu (segment %s of group %d)", file_path.c_str(),
                       static_cast<unsigned long long>(offset), kind_name, group),
                  "the checkpoint is corrupt; use an older one");
    std::copy(segment_data.begin() + (lo - seg_begin), segment_data.begin() + (hi - seg_begin), out + (lo - begin));
    covered += hi - lo;
  }
  if (covered != count)
    throw Error(ErrorKind::checkpoint,
                strf("%s covers %lld of the %lld elements of group %d (%s) asked for", path_.c_str(),
                     static_cast<long long>(covered), static_cast<long long>(count), group, kind_name),
                "the checkpoint belongs to a different model shape; check model.* against its manifest");
}

ParameterValues CheckpointReader::master_values(const ModelLayout& layout) const {
  return [this, layout](const ParamSpec& spec, int64_t begin, int64_t count, float* out) {
    int group = 0, index = 0;
    MXTRAIN_ASSERT(layout.locate(spec.name, &group, &index), "parameter %s not in the layout", spec.name.c_str());
    read(group, CheckpointKind::master, spec.offset + begin, count, out);
  };
}

CheckpointMeta CheckpointStore::load(const std::string& path, const std::vector<ParamShard>& shards,
                                     Backend& backend) {
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
  return reader.meta();
}

std::string CheckpointStore::load_latest(const std::vector<ParamShard>& shards, Backend& backend,
                                         CheckpointMeta* meta) {
  for (const std::string& path : list()) {
    try {
      *meta = load(path, shards, backend);
      return path;
    } catch (const Error& error) {
      if (error.kind() != ErrorKind::checkpoint) throw;
      log::warn("skipping checkpoint " + path + ": " + error.what() + "; trying the previous one");
    }
  }
  return "";
}

void CheckpointStore::prune(int64_t keep) {
  if (rank_ != 0) return;
  std::vector<std::string> complete = list();
  std::error_code error;
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep, 1)); i < complete.size(); ++i)
    fs::remove_all(complete[i], error);
  if (!fs::is_directory(directory(), error)) return;
  for (const auto& entry : fs::directory_iterator(directory(), error)) {
    std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.size() > 4 && name.substr(name.size() - 4) == ".tmp")
      fs::remove_all(entry.path(), error);
  }
}

std::string resolve_checkpoint(const std::string& run_or_checkpoint) {
  std::error_code error;
  if (fs::is_regular_file(fs::path(run_or_checkpoint) / "manifest.json", error)) return run_or_checkpoint;
  const std::vector<std::string> found = CheckpointStore(run_or_checkpoint, 0, 1).list();
  if (found.empty())
    throw Error(ErrorKind::checkpoint,
                run_or_checkpoint + " is neither a checkpoint directory nor a run directory with checkpoints",
                "pass a run directory (train -o DIR) or one of its checkpoints/step_* directories");
  return found.front();
}

}  // namespace mxtrain
