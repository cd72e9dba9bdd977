// The sampler: golden values for the generators (splitmix64 from its published sequence,
// xoshiro256** and the shuffle from an independent Python implementation, so the order is the
// same on every platform), permutation properties, exact resume, and rank sharding: the rows of
// W ranks, interleaved, are the rows one rank gets.
#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

#include "data/data_test_helpers.hpp"
#include "mxtrain/data/sampler.hpp"

namespace mxtrain::data {
namespace {

TEST(Random, SplitMix64MatchesPublishedSequence) {
  SplitMix64 generator(1234567);
  const uint64_t expected[] = {6457827717110365317ull, 3203168211198807973ull, 9817491932198370423ull,
                               4593380528125082431ull, 16408922859458223821ull};
  for (uint64_t value : expected) EXPECT_EQ(generator.next(), value);
}

TEST(Random, Xoshiro256StarStarMatchesReference) {
  // Python reference (Vigna's algorithm, state from splitmix64(42)).
  Xoshiro256StarStar generator(42);
  const uint64_t expected[] = {1546998764402558742ull, 6990951692964543102ull, 12544586762248559009ull,
                               17057574109182124193ull};
  for (uint64_t value : expected) EXPECT_EQ(generator.next(), value);
}

TEST(Random, BelowStaysInRangeAndCoversIt) {
  Xoshiro256StarStar generator(5);
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) {
    uint64_t value = generator.below(7);
    ASSERT_LT(value, 7u);
    counts[value] += 1;
  }
  for (int count : counts) EXPECT_NEAR(count, 10000, 600);  // ~6 standard deviations
}

TEST(ShuffledOrder, MatchesReferenceImplementation) {
  EXPECT_EQ(shuffled_order(10, 7, 0), (std::vector<uint32_t>{4, 2, 6, 7, 0, 9, 8, 1, 5, 3}));
  EXPECT_EQ(shuffled_order(10, 7, 1), (std::vector<uint32_t>{3, 9, 6, 5, 1, 7, 4, 2, 0, 8}));
}

TEST(ShuffledOrder, IsAPermutationThatDependsOnSeedAndEpoch) {
  std::vector<uint32_t> order = shuffled_order(1000, 11, 0);
  std::vector<uint32_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (uint32_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(order, shuffled_order(1000, 11, 0));
  EXPECT_NE(order, shuffled_order(1000, 11, 1));
  EXPECT_NE(order, shuffled_order(1000, 12, 0));
  EXPECT_EQ(shuffled_order(1, 11, 3), std::vector<uint32_t>{0});
}

// Samples a single-rank sampler yields over `steps` steps of `rows`.
std::vector<int64_t> draw(Sampler& sampler, int64_t steps, int64_t rows) {
  std::vector<int64_t> all;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<int64_t> batch = sampler.next_batch(rows);
    EXPECT_EQ(static_cast<int64_t>(batch.size()), rows / sampler.world_size());
    all.insert(all.end(), batch.begin(), batch.end());
  }
  return all;
}

TEST(Sampler, VisitsEverySampleOncePerEpochAndEpochsDiffer) {
  const int64_t samples = 96;
  Sampler sampler(samples, 2024);
  std::vector<int64_t> epoch0 = draw(sampler, 12, 8);
  EXPECT_EQ(sampler.position(), (SamplerPosition{0, 96}));
  std::vector<int64_t> epoch1 = draw(sampler, 12, 8);
  EXPECT_EQ(sampler.position(), (SamplerPosition{1, 96}));
  for (const std::vector<int64_t>* epoch : {&epoch0, &epoch1}) {
    std::vector<int64_t> sorted = *epoch;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < samples; ++i) ASSERT_EQ(sorted[static_cast<size_t>(i)], i);
  }
  EXPECT_NE(epoch0, epoch1);
  std::vector<uint32_t> order0 = shuffled_order(samples, 2024, 0);
  EXPECT_EQ(epoch0, std::vector<int64_t>(order0.begin(), order0.end()));
}

TEST(Sampler, ReproducibleAndSeedDependent) {
  Sampler a(500, 1), b(500, 1), c(500, 2);
  std::vector<int64_t> from_a = draw(a, 30, 16);
  EXPECT_EQ(from_a, draw(b, 30, 16));
  EXPECT_NE(from_a, draw(c, 30, 16));
}

TEST(Sampler, EpochRolloverMidBatchContinuesIntoNextShuffle) {
  Sampler sampler(10, 7);
  sampler.next_batch(4);
  sampler.next_batch(4);
  std::vector<int64_t> spanning = sampler.next_batch(4);  // samples 8, 9 of epoch 0, then 0, 1 of epoch 1
  std::vector<uint32_t> epoch0 = shuffled_order(10, 7, 0), epoch1 = shuffled_order(10, 7, 1);
  EXPECT_EQ(spanning, (std::vector<int64_t>{epoch0[8], epoch0[9], epoch1[0], epoch1[1]}));
  EXPECT_EQ(sampler.position(), (SamplerPosition{1, 2}));
}

TEST(Sampler, BatchLargerThanAnEpochWrapsSeveralTimes) {
  Sampler sampler(3, 9);
  std::vector<int64_t> batch = sampler.next_batch(8);
  std::vector<int64_t> expected;
  for (int64_t epoch = 0; epoch < 3; ++epoch)
    for (uint32_t sample : shuffled_order(3, 9, epoch)) expected.push_back(sample);
  expected.resize(8);
  EXPECT_EQ(batch, expected);
  EXPECT_EQ(sampler.position(), (SamplerPosition{2, 2}));
}

TEST(Sampler, SaveAndRestoreMidEpochContinuesIdentically) {
  Sampler original(123, 99);
  draw(original, 7, 6);  // 42 samples into epoch 0
  nlohmann::json saved = original.state();
  EXPECT_EQ(saved["epoch"], 0);
  EXPECT_EQ(saved["index"], 42);
  EXPECT_EQ(saved["seed"], 99u);
  EXPECT_EQ(saved["sample_count"], 123);
  std::vector<int64_t> continued = draw(original, 40, 6);  // crosses into epochs 1 and 2

  Sampler resumed(123, 99);
  resumed.restore_state(nlohmann::json::parse(saved.dump()));  // through text, as in a checkpoint
  EXPECT_EQ(draw(resumed, 40, 6), continued);
  EXPECT_EQ(resumed.position(), original.position());
}

TEST(Sampler, RestoreRejectsOtherDataOrSeed) {
  Sampler original(100, 5);
  original.next_batch(4);
  Sampler other_data(101, 5);
  std::string text = data_test::error_text([&] { other_data.restore_state(original.state()); }, ErrorKind::checkpoint);
  EXPECT_CONTAINS(text, "100 samples");
  EXPECT_CONTAINS(text, "101");
  Sampler other_seed(100, 6);
  text = data_test::error_text([&] { other_seed.restore_state(original.state()); }, ErrorKind::checkpoint);
  EXPECT_CONTAINS(text, "seed is 5");
  text = data_test::error_text([&] { other_seed.restore_state(nlohmann::json{{"epoch", 1}}); }, ErrorKind::checkpoint);
  EXPECT_CONTAINS(text, "malformed sampler state");
}

// W ranks, each taking its rows of every global step, interleaved back into global row order.
std::vector<std::vector<int64_t>> sharded_steps(int world_size, int64_t sample_count, uint64_t seed, int64_t steps,
                                                int64_t global_rows) {
  std::vector<Sampler> ranks;
  for (int rank = 0; rank < world_size; ++rank) ranks.emplace_back(sample_count, seed, rank, world_size);
  std::vector<std::vector<int64_t>> result;
  for (int64_t step = 0; step < steps; ++step) {
    std::vector<int64_t> global(static_cast<size_t>(global_rows), -1);
    for (int rank = 0; rank < world_size; ++rank) {
      std::vector<int64_t> rows = ranks[static_cast<size_t>(rank)].next_batch(global_rows);
      EXPECT_EQ(static_cast<int64_t>(rows.size()), global_rows / world_size);
      for (size_t i = 0; i < rows.size(); ++i) global[static_cast<size_t>(rank) + i * world_size] = rows[i];
    }
    result.push_back(global);
  }
  for (const Sampler& rank : ranks) EXPECT_EQ(rank.position(), ranks[0].position());
  return result;
}

TEST(Sampler, RankShardsUnionEqualsSingleRankBatch) {
  const int64_t samples = 37, seed = 31337, steps = 25, global_rows = 8;  // 200 rows: five epochs
  std::vector<std::vector<int64_t>> single = sharded_steps(1, samples, seed, steps, global_rows);
  EXPECT_EQ(sharded_steps(2, samples, seed, steps, global_rows), single);
  EXPECT_EQ(sharded_steps(4, samples, seed, steps, global_rows), single);
  EXPECT_EQ(sharded_steps(8, samples, seed, steps, global_rows), single);
}

TEST(Sampler, RankGetsRowsRStrideW) {
  Sampler single(50, 3);
  std::vector<int64_t> global = single.next_batch(12);
  Sampler rank1(50, 3, 1, 4);
  EXPECT_EQ(rank1.next_batch(12), (std::vector<int64_t>{global[1], global[5], global[9]}));
}

TEST(Sampler, GlobalBatchMustSplitEvenlyOverRanks) {
  Sampler sampler(50, 3, 0, 4);
  std::string text = data_test::error_text([&] { sampler.next_batch(6); }, ErrorKind::config);
  EXPECT_CONTAINS(text, "6 rows cannot be split evenly over 4 ranks");
}

TEST(Sampler, ResumeWithADifferentWorldSizeKeepsTheGlobalOrder) {
  Sampler single(40, 8);
  single.next_batch(8);
  nlohmann::json saved = single.state();
  std::vector<int64_t> next_global = single.next_batch(8);
  Sampler rank0(40, 8, 0, 2), rank1(40, 8, 1, 2);
  rank0.restore_state(saved);
  rank1.restore_state(saved);
  std::vector<int64_t> even = rank0.next_batch(8), odd = rank1.next_batch(8);
  for (size_t i = 0; i < 4; ++i) {
    EXPECT_EQ(even[i], next_global[2 * i]);
    EXPECT_EQ(odd[i], next_global[2 * i + 1]);
  }
}

}  // namespace
}  // namespace mxtrain::data
