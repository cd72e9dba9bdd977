// Checkpoint integrity as a property of the format: a manifest that was edited, truncated, has a
// missing key or a wrong type, or sizes that disagree with its segments is skipped with a reason
// and the previous checkpoint loads; pruning keeps the newest verified checkpoint and deletes only
// checkpoints it verified; weights that are not finite are never saved.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

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

}  // namespace
}  // namespace mxtrain
