// Checkpoint files: a save/load round trip restores master weights and Adam moments exactly,
// checkpoints reshard across different shard layouts, damage is detected by checksum, and an
// unfinished temporary directory is never taken for a checkpoint.
#include <gtest/gtest.h>

#include <barrier>
#include <filesystem>
#include <thread>
#include <fstream>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/split_master.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

struct Shards {
  std::vector<Buffer> buffers;
  std::vector<ParamShard> shards;
};

// Group g has `sizes[g]` elements, split into `pieces` equal shards (like FSDP ranks would own).
Shards make_shards(Backend& backend, const std::vector<int64_t>& sizes, int pieces, int piece, uint64_t seed) {
  Shards result;
  for (size_t g = 0; g < sizes.size(); ++g) {
    int64_t count = sizes[g] / pieces;
    ParamShard shard;
    shard.group = static_cast<int>(g);
    shard.begin = count * piece;
    shard.count = count;
    Tensor* slots[] = {&shard.master, &shard.m, &shard.v, &shard.grad};
    for (int k = 0; k < 4; ++k) {
      // Values are a function of the element's global index, so any layout can be checked.
      std::vector<float> values(static_cast<size_t>(count));
      for (int64_t i = 0; i < count; ++i)
        values[static_cast<size_t>(i)] = static_cast<float>(seed + 1000 * k + g) + 0.001f * static_cast<float>(shard.begin + i);
      result.buffers.push_back(test::upload(backend, values, Shape{count}));
      *slots[k] = result.buffers.back();
    }
    result.shards.push_back(shard);
  }
  return result;
}

TEST(Checkpoint, RoundTripAndReshardFromFourPiecesToOneAndTwo) {
  test::TempDir dir;
  std::unique_ptr<Backend> backend = create_backend("cpu");
  const std::vector<int64_t> sizes{64, 128, 32};
  // Four "ranks" (threads with a real barrier) write one checkpoint together.
  CheckpointMeta meta;
  meta.step = 12;
  meta.world_size = 4;
  meta.data_state = {{"epoch", 1}, {"index", 42}};
  std::barrier sync(4);
  std::vector<std::thread> ranks;
  for (int rank = 0; rank < 4; ++rank) {
    ranks.emplace_back([&, rank] {
      std::unique_ptr<Backend> own = create_backend("cpu");
      Shards written = make_shards(*own, sizes, 4, rank, 5);
      CheckpointStore(dir.path(), rank, 4, [&] { sync.arrive_and_wait(); }).save(meta, written.shards, *own);
    });
  }
  for (std::thread& thread : ranks) thread.join();
  CheckpointStore reader(dir.path(), 0, 1);
  ASSERT_EQ(reader.list().size(), 1u);
  for (int pieces : {1, 2}) {
    for (int piece = 0; piece < pieces; ++piece) {
      Shards target = make_shards(*backend, sizes, pieces, piece, 99);  // different contents
      CheckpointMeta loaded = reader.load(reader.list()[0], target.shards, *backend);
      EXPECT_EQ(loaded.step, 12);
      EXPECT_EQ(loaded.data_state["index"], 42);
      Shards expected = make_shards(*backend, sizes, pieces, piece, 5);
      for (size_t g = 0; g < sizes.size(); ++g) {
        EXPECT_EQ(test::download(*backend, target.shards[g].master), test::download(*backend, expected.shards[g].master));
        EXPECT_EQ(test::download(*backend, target.shards[g].m), test::download(*backend, expected.shards[g].m));
        EXPECT_EQ(test::download(*backend, target.shards[g].v), test::download(*backend, expected.shards[g].v));
        for (float value : test::download(*backend, target.shards[g].grad)) EXPECT_EQ(value, 0.0f);
      }
    }
  }
}

// The same shards with their masters split (the bf16 copy and the low halves, as a one-GPU bf16
// store keeps them) save the same FP32 values and load them back exactly, from and into either
// form: a checkpoint does not depend on how the store held its masters.
Shards split_masters(Backend& backend, const Shards& plain) {
  Shards result;
  for (const ParamShard& source : plain.shards) {
    ParamShard shard = source;
    shard.master = Tensor();
    result.buffers.push_back(backend.allocate("copy", Shape{shard.count}, DType::bf16, Lifetime::parameter));
    shard.compute_copy = result.buffers.back();
    result.buffers.push_back(backend.allocate("low", Shape{2 * shard.count}, DType::u8, Lifetime::master_parameter));
    shard.master_low = result.buffers.back();
    std::vector<float> values(static_cast<size_t>(shard.count));
    download_master(backend, source, values.data());
    upload_master(backend, shard, values.data());
    result.shards.push_back(shard);
  }
  return result;
}

TEST(Checkpoint, SplitMastersSaveAndLoadTheirFp32Values) {
  test::TempDir dir;
  std::unique_ptr<Backend> backend = create_backend("cpu");
  const std::vector<int64_t> sizes{64, 96};
  Shards plain = make_shards(*backend, sizes, 1, 0, 7);
  Shards split = split_masters(*backend, plain);
  CheckpointMeta meta;
  meta.step = 3;
  meta.world_size = 1;
  CheckpointStore store(dir.path(), 0, 1);
  store.save(meta, split.shards, *backend);
  // Into FP32 masters: the values the split shards were made from.
  Shards fp32_target = make_shards(*backend, sizes, 1, 0, 50);
  store.load(store.list()[0], fp32_target.shards, *backend);
  // Into split masters: the same values after joining, and the copy is their split's high half.
  Shards split_target = split_masters(*backend, make_shards(*backend, sizes, 1, 0, 60));
  store.load(store.list()[0], split_target.shards, *backend);
  for (size_t g = 0; g < sizes.size(); ++g) {
    const std::vector<float> expected = test::download(*backend, plain.shards[g].master);
    EXPECT_EQ(test::download(*backend, fp32_target.shards[g].master), expected) << g;
    std::vector<float> joined(expected.size());
    download_master(*backend, split_target.shards[g], joined.data());
    EXPECT_EQ(joined, expected) << g;
    std::vector<uint16_t> high(expected.size());
    backend->copy_to_host(split_target.shards[g].compute_copy, high.data());
    for (size_t i = 0; i < high.size(); ++i) EXPECT_EQ(high[i], numerics::split_master(expected[i]).high) << i;
    EXPECT_EQ(test::download(*backend, split_target.shards[g].m), test::download(*backend, plain.shards[g].m)) << g;
  }
}

TEST(Checkpoint, DamageIsDetectedAndTheOlderOneIsUsed) {
  test::TempDir dir;
  std::unique_ptr<Backend> backend = create_backend("cpu");
  CheckpointStore store(dir.path(), 0, 1);
  Shards shards = make_shards(*backend, {256}, 1, 0, 1);
  CheckpointMeta meta;
  meta.step = 1;
  store.save(meta, shards.shards, *backend);
  meta.step = 2;
  store.save(meta, shards.shards, *backend);
  std::string newest = store.list()[0];
  ASSERT_NE(newest.find("step_00000002"), std::string::npos);
  {
    std::fstream file(newest + "/rank_00000.bin", std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(8);
    file.put('\x7f');
  }
  try {
    store.load(newest, shards.shards, *backend);
    FAIL() << "damage not detected";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::checkpoint);
    EXPECT_NE(error.full_message().find("checksum mismatch"), std::string::npos) << error.full_message();
    EXPECT_NE(error.full_message().find("rank_00000.bin"), std::string::npos);
  }
  CheckpointMeta loaded;
  std::string used = store.load_latest(shards.shards, *backend, &loaded);
  EXPECT_NE(used.find("step_00000001"), std::string::npos);
  EXPECT_EQ(loaded.step, 1);

  // A truncated file is reported with its name and the missing byte range.
  std::filesystem::resize_file(newest + "/rank_00000.bin", 100);
  try {
    store.load(newest, shards.shards, *backend);
    FAIL() << "truncation not detected";
  } catch (const Error& error) {
    EXPECT_NE(error.full_message().find("truncated"), std::string::npos) << error.full_message();
  }
}

TEST(Checkpoint, UnfinishedTemporaryIsIgnoredAndPruneKeepsTheNewest) {
  test::TempDir dir;
  std::unique_ptr<Backend> backend = create_backend("cpu");
  CheckpointStore store(dir.path(), 0, 1);
  Shards shards = make_shards(*backend, {64}, 1, 0, 1);
  CheckpointMeta meta;
  for (int64_t step : {1, 2, 3, 4}) {
    meta.step = step;
    store.save(meta, shards.shards, *backend);
  }
  // What a run killed during its save leaves behind: a temporary without the rename.
  std::filesystem::create_directories(store.directory() + "/step_00000005.tmp");
  std::ofstream(store.directory() + "/step_00000005.tmp/rank_00000.bin") << "partial";
  EXPECT_NE(store.list()[0].find("step_00000004"), std::string::npos);
  store.prune(2);
  std::vector<std::string> left = store.list();
  ASSERT_EQ(left.size(), 2u);
  EXPECT_NE(left[0].find("step_00000004"), std::string::npos);
  EXPECT_NE(left[1].find("step_00000003"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(store.directory() + "/step_00000005.tmp"));
}

}  // namespace
}  // namespace mxtrain
