// Loader batches: rows are the sampler's windows, resumable, rank-sharded like the sampler; the
// validation reader walks windows in order and starts over at every evaluation.
#include <gtest/gtest.h>

#include <vector>

#include "mxtrain/data/loader.hpp"
#include "mxtrain/data/shard.hpp"
#include "support/test_support.hpp"

namespace mxtrain::data {
namespace {

// A shard whose token at position p is p % 251, so every window's first token says where it starts.
std::shared_ptr<const TokenDataset> make_dataset(const test::TempDir& dir, int64_t tokens, int64_t seq_len) {
  std::vector<int32_t> values(static_cast<size_t>(tokens));
  for (int64_t i = 0; i < tokens; ++i) values[static_cast<size_t>(i)] = static_cast<int32_t>(i % 251);
  write_shard(dir.file("train_000000.bin"), values, 256);
  return open_dataset("test", dir.file("train_*.bin"), "", "data.train", seq_len, 256);
}

std::vector<int32_t> window_inputs(int64_t window, int64_t seq_len) {
  std::vector<int32_t> tokens;
  for (int64_t i = 0; i < seq_len; ++i) tokens.push_back(static_cast<int32_t>((window * seq_len + i) % 251));
  return tokens;
}

TEST(TrainLoader, BatchRowsAreTheSamplersWindows) {
  test::TempDir dir;
  auto dataset = make_dataset(dir, 8 * 30 + 1, 8);  // 30 windows
  TrainLoader loader(dataset, 4, 77);
  Sampler sampler(30, 77);
  for (int step = 0; step < 10; ++step) {
    Batch batch = loader.next();
    ASSERT_EQ(batch.batch, 4);
    ASSERT_EQ(batch.seq, 8);
    ASSERT_EQ(batch.tokens.size(), 32u);
    ASSERT_EQ(batch.targets.size(), 32u);
    std::vector<int64_t> rows = sampler.next_batch(4);
    for (int64_t row = 0; row < 4; ++row) {
      std::vector<int32_t> expected = window_inputs(rows[static_cast<size_t>(row)], 8);
      EXPECT_EQ(std::vector<int32_t>(batch.tokens.begin() + row * 8, batch.tokens.begin() + row * 8 + 8), expected);
      for (int64_t i = 0; i < 7; ++i) EXPECT_EQ(batch.targets[row * 8 + i], batch.tokens[row * 8 + i + 1]);
      EXPECT_EQ(batch.targets[row * 8 + 7], (rows[static_cast<size_t>(row)] * 8 + 8) % 251);
    }
  }
}

TEST(TrainLoader, RestoredLoaderContinuesIdentically) {
  test::TempDir dir;
  auto dataset = make_dataset(dir, 6 * 25 + 1, 6);
  TrainLoader original(dataset, 3, 5);
  for (int i = 0; i < 7; ++i) original.next();
  nlohmann::json state = original.state();
  TrainLoader resumed(dataset, 3, 5);
  resumed.restore_state(state);
  for (int i = 0; i < 20; ++i) {
    Batch a = original.next(), b = resumed.next();
    ASSERT_EQ(a.tokens, b.tokens) << i;
    ASSERT_EQ(a.targets, b.targets) << i;
  }
}

TEST(TrainLoader, TwoRanksTogetherLoadTheSingleRankBatch) {
  test::TempDir dir;
  auto dataset = make_dataset(dir, 5 * 21 + 1, 5);
  TrainLoader single(dataset, 4, 9);
  TrainLoader rank0(dataset, 2, 9, 0, 2), rank1(dataset, 2, 9, 1, 2);
  for (int step = 0; step < 12; ++step) {
    Batch whole = single.next(), even = rank0.next(), odd = rank1.next();
    for (int64_t row = 0; row < 4; ++row) {
      const Batch& part = row % 2 == 0 ? even : odd;
      int64_t local = row / 2;
      EXPECT_EQ(std::vector<int32_t>(part.tokens.begin() + local * 5, part.tokens.begin() + local * 5 + 5),
                std::vector<int32_t>(whole.tokens.begin() + row * 5, whole.tokens.begin() + row * 5 + 5));
    }
  }
}

TEST(ValidationReader, InOrderAndRestartsEachEvaluation) {
  test::TempDir dir;
  auto dataset = make_dataset(dir, 4 * 10 + 1, 4);  // 10 windows
  ValidationReader reader(dataset, 2);
  for (int evaluation = 0; evaluation < 2; ++evaluation) {
    ASSERT_EQ(reader.start(3), 3);
    for (int64_t step = 0; step < 3; ++step) {
      std::optional<Batch> batch = reader.next();
      ASSERT_TRUE(batch.has_value());
      std::vector<int32_t> expected = window_inputs(2 * step, 4);
      std::vector<int32_t> second = window_inputs(2 * step + 1, 4);
      expected.insert(expected.end(), second.begin(), second.end());
      EXPECT_EQ(batch->tokens, expected) << "evaluation " << evaluation << " step " << step;
    }
    EXPECT_FALSE(reader.next().has_value());
  }
  // A restart in the middle of an evaluation also goes back to the first window.
  reader.start(3);
  reader.next();
  reader.start(1);
  std::vector<int32_t> first = window_inputs(0, 4);
  std::vector<int32_t> second = window_inputs(1, 4);
  first.insert(first.end(), second.begin(), second.end());
  EXPECT_EQ(reader.next()->tokens, first);
}

TEST(ValidationReader, CapsAtTheWindowsThereAreAndShardsOverRanks) {
  test::TempDir dir;
  auto dataset = make_dataset(dir, 4 * 10 + 1, 4);  // 10 windows
  ValidationReader rank0(dataset, 2, 0, 2), rank1(dataset, 2, 1, 2);
  EXPECT_EQ(rank0.start(100), 2);  // 10 windows / 4 per global step
  EXPECT_EQ(rank1.start(100), 2);
  for (int64_t step = 0; step < 2; ++step) {
    Batch even = *rank0.next(), odd = *rank1.next();
    for (int64_t local = 0; local < 2; ++local) {
      EXPECT_EQ(std::vector<int32_t>(even.tokens.begin() + local * 4, even.tokens.begin() + local * 4 + 4),
                window_inputs(step * 4 + 2 * local, 4));
      EXPECT_EQ(std::vector<int32_t>(odd.tokens.begin() + local * 4, odd.tokens.begin() + local * 4 + 4),
                window_inputs(step * 4 + 2 * local + 1, 4));
    }
  }
  EXPECT_FALSE(rank0.next().has_value());

  ValidationReader wide(dataset, 16);  // more rows than windows: one batch that wraps around
  EXPECT_EQ(wide.start(5), 1);
  Batch batch = *wide.next();
  EXPECT_EQ(std::vector<int32_t>(batch.tokens.begin() + 10 * 4, batch.tokens.begin() + 11 * 4), window_inputs(0, 4));
}

}  // namespace
}  // namespace mxtrain::data
