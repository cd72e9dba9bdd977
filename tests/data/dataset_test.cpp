// Shard globs (sorted, cwd then the fallback base, a clear error on no match) and the sample
// windows: window i of a shard is tokens [i·seq, i·seq + seq + 1), never crossing a shard.
#include <gtest/gtest.h>

#include <filesystem>
#include <numeric>
#include <vector>

#include "data/data_test_helpers.hpp"
#include "mxtrain/data/dataset.hpp"
#include "mxtrain/data/shard.hpp"
#include "support/test_support.hpp"

namespace mxtrain::data {
namespace {

std::vector<int32_t> iota_tokens(int64_t count, int32_t first) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((first + i) % 256);
  return tokens;
}

// Runs `body` with the current directory set to `directory`, restoring it afterwards.
template <typename Body>
void in_directory(const std::string& directory, Body&& body) {
  std::filesystem::path saved = std::filesystem::current_path();
  std::filesystem::current_path(directory);
  try {
    body();
  } catch (...) {
    std::filesystem::current_path(saved);
    throw;
  }
  std::filesystem::current_path(saved);
}

TEST(ShardGlob, SortedByNameAndOnlyFiles) {
  test::TempDir dir;
  for (const char* name : {"train_000010.bin", "train_000002.bin", "train_000001.bin", "val_000000.bin"})
    write_shard(dir.file(name), std::vector<int32_t>{1}, 256);
  std::filesystem::create_directory(dir.file("train_999999.bin"));  // a directory is not a shard
  std::vector<std::string> paths = resolve_shard_glob(dir.path() + "/train_*.bin");
  EXPECT_EQ(paths, (std::vector<std::string>{dir.file("train_000001.bin"), dir.file("train_000002.bin"),
                                             dir.file("train_000010.bin")}));
}

TEST(ShardGlob, RelativePatternTriesCurrentDirectoryThenFallback) {
  test::TempDir cwd, base;
  std::filesystem::create_directories(base.file("data/corpus"));
  write_shard(base.file("data/corpus/train_000000.bin"), std::vector<int32_t>{1}, 256);
  in_directory(cwd.path(), [&] {
    EXPECT_EQ(resolve_shard_glob("data/corpus/train_*.bin", base.path()),
              std::vector<std::string>{base.path() + "/data/corpus/train_000000.bin"});
    // Once the current directory has a match, it wins.
    std::filesystem::create_directories("data/corpus");
    write_shard("data/corpus/train_000005.bin", std::vector<int32_t>{1}, 256);
    EXPECT_EQ(resolve_shard_glob("data/corpus/train_*.bin", base.path()),
              std::vector<std::string>{"data/corpus/train_000005.bin"});
  });
}

TEST(ShardGlob, NoMatchNamesPatternAndAdvice) {
  test::TempDir cwd, base;
  in_directory(cwd.path(), [&] {
    std::string text = data_test::error_text([&] { resolve_shard_glob("data/fortunes/train_*.bin", base.path()); });
    EXPECT_CONTAINS(text, "no token shard matches 'data/fortunes/train_*.bin'");
    EXPECT_CONTAINS(text, base.path());
    EXPECT_CONTAINS(text, "the folder 'data/fortunes' does not exist");
    EXPECT_CONTAINS(text, "fix: make token shards with `mxtrain prepare --output DIR TEXT...`");
    EXPECT_CONTAINS(text, "then set data.train to a glob of them");
  });
  std::string text =
      data_test::error_text([&] { resolve_shard_glob(cwd.path() + "/val_*.bin", base.path(), "data.val"); });
  EXPECT_CONTAINS(text, cwd.path() + "/val_*.bin");
  EXPECT_EQ(text.find("does not exist"), std::string::npos) << text;  // the folder is there; no shard in it
  EXPECT_CONTAINS(text, "then set data.val to a glob of them");
}

TEST(ShardGlob, ADirectoryGetsTheGlobOfItsShards) {
  test::TempDir dir;
  write_shard(dir.file("train_000000.bin"), std::vector<int32_t>{1, 2}, 256);
  write_shard(dir.file("train_000001.bin"), std::vector<int32_t>{1, 2}, 256);
  write_shard(dir.file("val_000000.bin"), std::vector<int32_t>{1, 2}, 256);
  std::string text = data_test::error_text([&] { resolve_shard_glob(dir.path(), ""); });
  EXPECT_CONTAINS(text, "no token shard matches '" + dir.path() + "': it is a directory, and data.train takes a glob "
                        "of shard files — '" + dir.path() + "/train_*.bin' matches 2 shards there");
  EXPECT_CONTAINS(text, "fix: set data.train = '" + dir.path() + "/train_*.bin'");
  text = data_test::error_text([&] { resolve_shard_glob(dir.path(), "", "data.val"); });
  EXPECT_CONTAINS(text, "'" + dir.path() + "/val_*.bin' matches 1 shard there");
  test::TempDir empty;
  text = data_test::error_text([&] { resolve_shard_glob(empty.path(), ""); });
  EXPECT_CONTAINS(text, "it is a directory without train_*.bin shards");
}

TEST(TokenDataset, WindowsInsideShardsWithShiftedTargets) {
  test::TempDir dir;
  write_shard(dir.file("a.bin"), iota_tokens(13, 0), 256);    // seq 4: windows at 0, 4, 8 (tokens 0..12)
  write_shard(dir.file("b.bin"), iota_tokens(4, 100), 256);   // too short for a window: skipped
  write_shard(dir.file("c.bin"), iota_tokens(9, 200), 256);   // windows at 0, 4
  TokenDataset dataset({dir.file("a.bin"), dir.file("b.bin"), dir.file("c.bin")}, 4, 256);
  EXPECT_EQ(windows_in_shard(13, 4), 3);
  EXPECT_EQ(windows_in_shard(12, 4), 2);
  EXPECT_EQ(windows_in_shard(5, 4), 1);
  EXPECT_EQ(windows_in_shard(4, 4), 0);
  ASSERT_EQ(dataset.sample_count(), 5);
  EXPECT_EQ(dataset.token_count(), 26);
  EXPECT_EQ(dataset.describe(), "3 shards, 26 tokens, 5 samples of 4+1 tokens");

  struct Expected {
    int32_t first;
    int64_t shard, window;
  };
  const Expected expected[] = {{0, 0, 0}, {4, 0, 1}, {8, 0, 2}, {200, 2, 0}, {204, 2, 1}};
  for (int64_t sample = 0; sample < 5; ++sample) {
    const Expected& e = expected[sample];
    TokenDataset::Location location = dataset.locate(sample);
    EXPECT_EQ(location.shard, e.shard) << sample;
    EXPECT_EQ(location.window, e.window) << sample;
    std::vector<int32_t> inputs(4), targets(4);
    dataset.read_sample(sample, inputs.data(), targets.data());
    EXPECT_EQ(inputs, (std::vector<int32_t>{e.first, e.first + 1, e.first + 2, e.first + 3})) << sample;
    EXPECT_EQ(targets, (std::vector<int32_t>{e.first + 1, e.first + 2, e.first + 3, e.first + 4})) << sample;
  }
}

TEST(TokenDataset, TooFewTokensForOneWindow) {
  test::TempDir dir;
  write_shard(dir.file("a.bin"), iota_tokens(100, 0), 256);
  std::string text = data_test::error_text([&] { TokenDataset dataset({dir.file("a.bin")}, 100, 256); });
  EXPECT_CONTAINS(text, dir.file("a.bin"));
  EXPECT_CONTAINS(text, "too few tokens for one sample of seq_len + 1 = 101 tokens");
  EXPECT_CONTAINS(text, "lower train.seq_len");
  EXPECT_CONTAINS(text, "add data");
  TokenDataset fits({dir.file("a.bin")}, 99, 256);
  EXPECT_EQ(fits.sample_count(), 1);
}

TEST(TokenDataset, ValidatesEveryTokenAtOpen) {
  test::TempDir dir;
  write_shard(dir.file("a.bin"), iota_tokens(50, 0), 256);
  std::vector<int32_t> tokens = iota_tokens(50, 0);
  tokens[37] = 300;
  write_shard(dir.file("b.bin"), tokens, 512);
  std::string text = data_test::error_text([&] { TokenDataset dataset({dir.file("a.bin"), dir.file("b.bin")}, 8, 256); });
  EXPECT_CONTAINS(text, dir.file("b.bin") + ": token 37 (byte offset 1098) has id 300, not below the model's vocab "
                                            "size 256");
  EXPECT_CONTAINS(text, "model.vocab_size");
  TokenDataset wider({dir.file("a.bin"), dir.file("b.bin")}, 8, 512);
  EXPECT_EQ(wider.sample_count(), 12);
}

}  // namespace
}  // namespace mxtrain::data
