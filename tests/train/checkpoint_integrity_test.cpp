// Checkpoint integrity as a property of the format: a manifest that was edited, truncated, has a
// missing key or a wrong type, or sizes that disagree with its segments is skipped with a reason
// and the previous checkpoint loads; pruning keeps the newest verified checkpoint and deletes only
// checkpoints it verified; weights that are not finite are never saved.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace mxtrain {
namespace {

struct Shards {
  std::vector<Buffer> buffers;
  std::vector<ParamShard> shards;
};

// One group of `count` elements whose master, m and v hold `value` + their index.
Shards make_shards(Backend& backend, int64_t count, float value) {
  Shards result;
  ParamShard shard;
  shard.group = 0;
  shard.begin = 0;
  shard.count = count;
  Tensor* slots[] = {&shard.master, &shard.m, &shard.v, &shard.grad};
  for (int k = 0; k < 4; ++k) {
    std::vector<float> values(static_cast<size_t>(count));
    for (int64_t i = 0; i < count; ++i) values[static_cast<size_t>(i)] = value + static_cast<float>(k * count + i);
    result.buffers.push_back(test::upload(backend, values, Shape{count}));
    *slots[k] = result.buffers.back();
  }
  result.shards.push_back(shard);
  return result;
}

nlohmann::json read_manifest(const std::string& checkpoint) {
  std::ifstream in(checkpoint + "/manifest.json");
  return nlohmann::json::parse(in);
}

void write_manifest(const std::string& checkpoint, const nlohmann::json& manifest) {
  std::ofstream(checkpoint + "/manifest.json") << manifest.dump(1);
}

// A manifest's checksum recomputed after an edit (the edit itself is then what must be caught).
void reseal(nlohmann::json& manifest) { manifest["manifest_crc32"] = manifest_checksum(manifest); }

// Edits of a manifest, each with the reason its rejection must give.
using ManifestEdits = std::vector<std::pair<std::string, std::function<void(nlohmann::json&)>>>;

class CheckpointIntegrity : public ::testing::Test {
 protected:
  // Checkpoints of steps 1 and 2 (different contents); returns step 2's directory.
  std::string save_two() {
    meta_.data_state = {{"epoch", 0}, {"index", 16}};
    meta_.step = 1;
    store_.save(meta_, first_.shards, *backend_);
    meta_.step = 2;
    return store_.save(meta_, second_.shards, *backend_);
  }
  // The checkpoint load_latest falls back to (expects step 1, loaded with step 1's values).
  void expect_falls_back_to_step_one() {
    Shards target = make_shards(*backend_, 256, 500.0f);
    CheckpointMeta loaded;
    const std::string used = store_.load_latest(target.shards, *backend_, &loaded);
    EXPECT_NE(used.find("step_00000001"), std::string::npos) << used;
    EXPECT_EQ(loaded.step, 1);
    EXPECT_EQ(test::download(*backend_, target.shards[0].master), test::download(*backend_, first_.shards[0].master));
  }
  // Loading `checkpoint` fails with Error(checkpoint) whose text holds `reason`.
  void expect_rejected(const std::string& checkpoint, const std::string& reason) {
    Shards target = make_shards(*backend_, 256, 500.0f);
    try {
      store_.load(checkpoint, target.shards, *backend_);
      ADD_FAILURE() << "loaded " << checkpoint;
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::checkpoint);
      EXPECT_NE(error.full_message().find(reason), std::string::npos) << error.full_message();
    }
  }

  // Each edit of `original`, resealed (checksum recomputed) and written to `checkpoint`, is
  // rejected with its reason; then `after` (the fallback to check), if any.
  void expect_each_rejected(const std::string& checkpoint, const nlohmann::json& original, const ManifestEdits& edits,
                            const std::function<void()>& after = {}) {
    for (const auto& [reason, edit] : edits) {
      nlohmann::json manifest = original;
      edit(manifest);
      reseal(manifest);
      write_manifest(checkpoint, manifest);
      expect_rejected(checkpoint, reason);
      if (after) after();
    }
  }

  test::TempDir dir_;
  std::unique_ptr<Backend> backend_ = create_backend("cpu");
  CheckpointStore store_{dir_.path(), 0, 1};
  CheckpointMeta meta_;
  Shards first_ = make_shards(*backend_, 256, 1.0f), second_ = make_shards(*backend_, 256, 2.0f);
};

// The loader once trusted `bytes` over `count` and overflowed its buffer (free(): invalid pointer).
TEST_F(CheckpointIntegrity, SizesThatDisagreeWithTheSegmentsAreSkipped) {
  const std::string newest = save_two();
  nlohmann::json manifest = read_manifest(newest);
  manifest["segments"][0]["bytes"] = manifest["segments"][0]["bytes"].get<uint64_t>() * 64;
  write_manifest(newest, manifest);
  expect_rejected(newest, "manifest");
  expect_falls_back_to_step_one();
}

TEST_F(CheckpointIntegrity, AMissingKeyOrAWrongTypeIsSkipped) {
  const std::string newest = save_two();
  nlohmann::json manifest = read_manifest(newest);
  manifest.erase("data_state");
  write_manifest(newest, manifest);
  expect_rejected(newest, "manifest");
  expect_falls_back_to_step_one();

  manifest = read_manifest(newest);
  manifest["data_state"] = {{"epoch", 0}, {"index", 16}};
  manifest["segments"][1]["count"] = "many";
  write_manifest(newest, manifest);
  expect_rejected(newest, "manifest");
  expect_falls_back_to_step_one();
}

// Fields outside the segments' checksums (step, data position) are covered too.
TEST_F(CheckpointIntegrity, AnEditedStepOrDataPositionIsDetected) {
  const std::string newest = save_two();
  const nlohmann::json original = read_manifest(newest);
  nlohmann::json manifest = original;
  manifest["data_state"]["index"] = 999;
  write_manifest(newest, manifest);
  expect_rejected(newest, "checksum");
  manifest = original;
  manifest["step"] = 7;
  write_manifest(newest, manifest);
  expect_rejected(newest, "checksum");
  expect_falls_back_to_step_one();
}

TEST_F(CheckpointIntegrity, PruningKeepsTheNewestVerifiedWhenTheNewestIsCorrupt) {
  const std::string newest = save_two();
  {
    std::fstream file(newest + "/rank_00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(20);
    file.put('\x55');
  }
  store_.prune(1);
  expect_falls_back_to_step_one();
  EXPECT_TRUE(fs::exists(newest)) << "pruning deleted a checkpoint it had not verified as older";
}

TEST_F(CheckpointIntegrity, PruningIgnoresAJunkDirectoryAndKeepsTheCheckpointJustSaved) {
  meta_.step = 1;
  const std::string first = store_.save(meta_, first_.shards, *backend_);
  const std::string junk = store_.directory() + "/step_99999999";
  fs::copy(first, junk);  // a manifest and valid data, but not of step 99999999
  meta_.step = 2;
  const std::string saved = store_.save(meta_, second_.shards, *backend_);
  store_.prune(1);
  ASSERT_TRUE(fs::exists(saved + "/manifest.json")) << "pruning deleted the checkpoint just saved";
  Shards target = make_shards(*backend_, 256, 500.0f);
  CheckpointMeta loaded;
  EXPECT_NE(store_.load_latest(target.shards, *backend_, &loaded).find("step_00000002"), std::string::npos);
  EXPECT_EQ(loaded.step, 2);
  EXPECT_EQ(test::download(*backend_, target.shards[0].master), test::download(*backend_, second_.shards[0].master));
  EXPECT_TRUE(fs::exists(junk)) << "pruning deleted a directory it did not verify";
}

TEST_F(CheckpointIntegrity, NonFiniteWeightsAreNeverSaved) {
  meta_.step = 1;
  store_.save(meta_, first_.shards, *backend_);
  std::vector<float> values = test::download(*backend_, second_.shards[0].master);
  values[3] = std::nanf("");
  backend_->copy_from_host(values.data(), second_.shards[0].master);
  meta_.step = 2;
  try {
    store_.save(meta_, second_.shards, *backend_);
    ADD_FAILURE() << "a checkpoint with a NaN weight was saved";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::numerics);
    EXPECT_NE(error.full_message().find("not finite"), std::string::npos) << error.full_message();
  }
  const std::vector<std::string> left = store_.list();
  ASSERT_EQ(left.size(), 1u);
  EXPECT_NE(left[0].find("step_00000001"), std::string::npos);
  expect_falls_back_to_step_one();
}

// A manifest whose checksum was recomputed after the edit (a forged or buggy one) is still
// validated field by field before any buffer is sized from it.

TEST_F(CheckpointIntegrity, AResealedManifestIsStillCheckedFieldByField) {
  const std::string newest = save_two();
  const nlohmann::json original = read_manifest(newest);
  const ManifestEdits edits = {
      {"bytes for", [](nlohmann::json& m) { m["segments"][0]["bytes"] = 4 * 256 * 64; }},
      {"is truncated", [](nlohmann::json& m) {
         m["segments"][0]["count"] = 256 * 64;
         m["segments"][0]["bytes"] = 4 * 256 * 64;
       }},
      {"not rank_NNNNN.bin", [](nlohmann::json& m) { m["segments"][0]["file"] = "../../manifest.json"; }},
      {"overlap", [](nlohmann::json& m) { m["segments"].push_back(m["segments"][0]); }},
      {"the directory is step 2", [](nlohmann::json& m) { m["step"] = 1; }},
      {"'world_size' = 0", [](nlohmann::json& m) { m["world_size"] = 0; }},
      {"not an integer", [](nlohmann::json& m) { m["segments"][2]["offset"] = 1.5; }},
      {"outside", [](nlohmann::json& m) { m["segments"][1]["begin"] = -4; }},
      {"not master, adam_m or adam_v", [](nlohmann::json& m) { m["segments"][1]["kind"] = "adam_w"; }},
  };
  expect_each_rejected(newest, original, edits, [&] { expect_falls_back_to_step_one(); });
}

TEST_F(CheckpointIntegrity, AVersionOneCheckpointStillLoads) {
  const std::string newest = save_two();
  nlohmann::json manifest = read_manifest(newest);
  manifest.erase("manifest_crc32");
  manifest["version"] = 1;
  write_manifest(newest, manifest);
  Shards target = make_shards(*backend_, 256, 500.0f);
  EXPECT_EQ(store_.load(newest, target.shards, *backend_).step, 2);
  EXPECT_EQ(test::download(*backend_, target.shards[0].master), test::download(*backend_, second_.shards[0].master));
  manifest["version"] = 5;
  write_manifest(newest, manifest);
  expect_rejected(newest, "format version 5");
}

// Format 4 stores llama's gate/up weight rows interleaved: a llama checkpoint of an older format
// is refused with the way out; another model's (GPT-2's MLP has no gate) still loads.
TEST_F(CheckpointIntegrity, AnOlderLlamaCheckpointIsRefusedWithTheWayOut) {
  const std::string newest = save_two();
  nlohmann::json manifest = read_manifest(newest);
  EXPECT_EQ(manifest["version"], 4);
  manifest["version"] = 3;
  manifest["config"]["model.family"] = "gpt2";
  reseal(manifest);
  write_manifest(newest, manifest);
  Shards target = make_shards(*backend_, 256, 500.0f);
  EXPECT_EQ(store_.load(newest, target.shards, *backend_).step, 2);
  manifest["config"]["model.family"] = "llama";
  reseal(manifest);
  write_manifest(newest, manifest);
  expect_rejected(newest, "stores the MLP's gate/up weight as [gate; up]");
  expect_rejected(newest, "mxtrain export");
  manifest["version"] = 4;
  reseal(manifest);
  write_manifest(newest, manifest);
  EXPECT_EQ(store_.load(newest, target.shards, *backend_).step, 2);
}

// Each rank's resume state (FP8 delayed scaling's histories and scales) is saved in its own file
// as segments of kind "state", named in extra.state_buffers, and loads back bit for bit; a
// checkpoint without it leaves the buffers as they were; its fields are checked like the others'.
TEST_F(CheckpointIntegrity, ResumeStateRoundTripsAndIsCheckedLikeTheRest) {
  Buffer history = test::upload(*backend_, {0.5f, 2.0f, 0.25f, 8.0f}, Shape{2, 2});
  Buffer scale = test::upload(*backend_, {3.0f, 7.0f}, Shape{2});
  const NamedBuffers state = {{"fp8.forward.amax_history", history.tensor()}, {"fp8.forward.scale", scale.tensor()}};
  meta_.step = 1;
  store_.save(meta_, first_.shards, *backend_);  // no state
  meta_.step = 2;
  const std::string newest = store_.save(meta_, second_.shards, *backend_, state);
  const nlohmann::json original = read_manifest(newest);
  EXPECT_EQ(original["version"], 4);
  EXPECT_EQ(original["extra"]["state_buffers"], nlohmann::json({"fp8.forward.amax_history", "fp8.forward.scale"}));

  Shards target = make_shards(*backend_, 256, 500.0f);
  Buffer history_back = test::upload(*backend_, {0, 0, 0, 0}, Shape{2, 2});
  Buffer scale_back = test::upload(*backend_, {1, 1}, Shape{2});
  const NamedBuffers into = {{"fp8.forward.amax_history", history_back.tensor()},
                             {"fp8.forward.scale", scale_back.tensor()}};
  EXPECT_EQ(store_.load(newest, target.shards, *backend_, into).step, 2);
  EXPECT_EQ(test::download(*backend_, history_back), test::download(*backend_, history));
  EXPECT_EQ(test::download(*backend_, scale_back), test::download(*backend_, scale));
  // Step 1 has no state: the buffers keep what they hold. A name that differs is not restored.
  Buffer kept = test::upload(*backend_, {9, 9}, Shape{2});
  const NamedBuffers renamed = {{"fp8.forward.amax_history", history_back.tensor()}, {"other.scale", kept.tensor()}};
  store_.load(newest, target.shards, *backend_, renamed);
  EXPECT_EQ(test::download(*backend_, kept), (std::vector<float>{9, 9}));
  store_.load(dir_.path() + "/checkpoints/step_00000001", target.shards, *backend_, into);
  EXPECT_EQ(test::download(*backend_, scale_back), test::download(*backend_, scale));
  EXPECT_NO_THROW(verify_checkpoint(newest));

  auto state_segment = [](nlohmann::json& m) -> nlohmann::json& {
    for (nlohmann::json& segment : m["segments"])
      if (segment["kind"] == "state") return segment;
    throw std::runtime_error("no state segment");
  };
  const ManifestEdits edits = {
      {"(format version 2)", [](nlohmann::json& m) { m["version"] = 2; }},
      {"has no name in extra.state_buffers", [](nlohmann::json& m) { m["extra"]["state_buffers"].erase(1); }},
      {"'extra.state_buffers' is not an array", [](nlohmann::json& m) { m["extra"]["state_buffers"] = "all"; }},
      {"is not a string", [](nlohmann::json& m) { m["extra"]["state_buffers"][0] = 5; }},
      {"'begin' = 1", [&](nlohmann::json& m) { state_segment(m)["begin"] = 1; }},
      {"overlap", [&](nlohmann::json& m) { m["segments"].push_back(state_segment(m)); }},
  };
  expect_each_rejected(newest, original, edits);
  // A damaged state segment fails its checksum.
  write_manifest(newest, original);
  nlohmann::json unchanged = original;
  const nlohmann::json& segment = state_segment(unchanged);
  {
    std::fstream file(newest + "/" + segment["file"].get<std::string>(), std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(segment["offset"].get<std::streamoff>());
    file.put('\x7f');
  }
  EXPECT_THROW(verify_checkpoint(newest), Error);
}

// Random damage to a manifest (bytes flipped, cut short, or values replaced and the checksum
// recomputed) never ends verify_checkpoint with anything but Error(checkpoint) or a checkpoint
// that verifies: a short, fixed-seed version of what the fuzz target runs.
TEST_F(CheckpointIntegrity, RandomlyDamagedManifestsAreErrorsNeverCrashes) {
  const std::string newest = save_two();
  const nlohmann::json original = read_manifest(newest);
  const std::string text = original.dump(1);
  uint64_t state = 0x9e3779b97f4a7c15ull;
  auto next = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  };
  const std::vector<nlohmann::json> values = {nullptr, -1, 0, 1, 3, int64_t{1} << 62, ~uint64_t{0}, 1e300, "x",
                                              nlohmann::json::array(), nlohmann::json::object(), true};
  int rejected = 0, verified = 0;
  for (int trial = 0; trial < 1500; ++trial) {
    std::string damaged;
    if (trial % 3 == 0) {  // bytes
      damaged = text;
      for (int flips = 1 + static_cast<int>(next() % 4); flips > 0; --flips)
        damaged[next() % damaged.size()] = static_cast<char>(next() % 256);
      if (next() % 4 == 0) damaged.resize(next() % damaged.size());
    } else {  // a value replaced or removed, the checksum recomputed
      nlohmann::json manifest = original;
      nlohmann::json* target = &manifest;
      if (next() % 2) target = &manifest["segments"][next() % manifest["segments"].size()];
      auto field = target->begin();
      std::advance(field, static_cast<long>(next() % target->size()));
      if (next() % 5 == 0)
        target->erase(field.key());
      else
        *field = values[next() % values.size()];
      reseal(manifest);
      damaged = manifest.dump(1, ' ', false, nlohmann::json::error_handler_t::replace);
    }
    std::ofstream(newest + "/manifest.json", std::ios::binary | std::ios::trunc) << damaged;
    try {
      verify_checkpoint(newest);
      ++verified;
    } catch (const Error& error) {
      ASSERT_EQ(error.kind(), ErrorKind::checkpoint) << error.full_message() << "\n" << damaged;
      ++rejected;
    } catch (const std::exception& error) {
      FAIL() << "trial " << trial << ": " << error.what() << "\n" << damaged;
    }
  }
  EXPECT_GT(rejected, 1000);
  std::printf("%d damaged manifests rejected, %d still verified (edits to values the format allows, e.g. another seed)\n", rejected, verified);
}

}  // namespace
}  // namespace mxtrain
