#include "mxtrain/data/sampler.hpp"

#include <limits>
#include <utility>

#include "mxtrain/core/error.hpp"

namespace mxtrain::data {
namespace {

uint64_t rotate_left(uint64_t value, int bits) { return (value << bits) | (value >> (64 - bits)); }

// One splitmix64 output for a given state: a strong 64-bit mixer.
uint64_t mix64(uint64_t value) { return SplitMix64(value).next(); }

}  // namespace

uint64_t SplitMix64::next() {
  uint64_t z = (state_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

Xoshiro256StarStar::Xoshiro256StarStar(uint64_t seed) {
  SplitMix64 expander(seed);
  for (uint64_t& word : state_) word = expander.next();
}

uint64_t Xoshiro256StarStar::next() {
  const uint64_t result = rotate_left(state_[1] * 5, 7) * 9;
  const uint64_t shifted = state_[1] << 17;
  state_[2] ^= state_[0];
  state_[3] ^= state_[1];
  state_[1] ^= state_[2];
  state_[0] ^= state_[3];
  state_[2] ^= shifted;
  state_[3] = rotate_left(state_[3], 45);
  return result;
}

uint64_t Xoshiro256StarStar::below(uint64_t bound) {
  MXTRAIN_ASSERT(bound > 0, "below(0)");
  unsigned __int128 product = static_cast<unsigned __int128>(next()) * bound;
  uint64_t low = static_cast<uint64_t>(product);
  if (low < bound) {
    const uint64_t threshold = (0 - bound) % bound;  // 2^64 mod bound
    while (low < threshold) {
      product = static_cast<unsigned __int128>(next()) * bound;
      low = static_cast<uint64_t>(product);
    }
  }
  return static_cast<uint64_t>(product >> 64);
}

std::vector<uint32_t> shuffled_order(int64_t sample_count, uint64_t seed, int64_t epoch) {
  MXTRAIN_ASSERT(sample_count > 0 && sample_count <= std::numeric_limits<uint32_t>::max(), "sample_count %lld",
                 static_cast<long long>(sample_count));
  // Distinct (seed, epoch) pairs give unrelated streams: the epoch is mixed before it meets the seed.
  Xoshiro256StarStar generator(mix64(seed) ^ mix64(static_cast<uint64_t>(epoch) + 0x632be59bd9b4e019ull));
  std::vector<uint32_t> order(static_cast<size_t>(sample_count));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<uint32_t>(i);
  for (size_t i = order.size() - 1; i > 0; --i) {
    size_t j = static_cast<size_t>(generator.below(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

Sampler::Sampler(int64_t sample_count, uint64_t seed, int rank, int world_size)
    : sample_count_(sample_count), seed_(seed), rank_(rank), world_size_(world_size) {
  MXTRAIN_ASSERT(sample_count > 0, "a sampler needs samples");
  MXTRAIN_ASSERT(world_size > 0 && rank >= 0 && rank < world_size, "rank %d of %d", rank, world_size);
  // The order is kept as uint32 to halve its memory; 2^32 windows is past 8T tokens at seq 2048.
  MXTRAIN_REQUIRE(sample_count <= std::numeric_limits<uint32_t>::max(), data,
                  strf("%lld samples in one epoch, more than the sampler's limit of 4,294,967,295",
                       static_cast<long long>(sample_count)),
                  "raise train.seq_len or train on a subset of the shards per run");
}

int64_t Sampler::take_global_sample() {
  if (position_.index == sample_count_) {
    position_.epoch += 1;
    position_.index = 0;
  }
  if (order_epoch_ != position_.epoch) {
    order_ = shuffled_order(sample_count_, seed_, position_.epoch);
    order_epoch_ = position_.epoch;
  }
  return order_[static_cast<size_t>(position_.index++)];
}

std::vector<int64_t> Sampler::next_batch(int64_t global_batch_rows) {
  MXTRAIN_REQUIRE(global_batch_rows > 0 && global_batch_rows % world_size_ == 0, config,
                  strf("a global micro-batch of %lld rows cannot be split evenly over %d ranks",
                       static_cast<long long>(global_batch_rows), world_size_),
                  "make the global batch a multiple of the number of ranks (each rank takes the same rows)");
  std::vector<int64_t> rows;
  rows.reserve(static_cast<size_t>(global_batch_rows / world_size_));
  for (int64_t row = 0; row < global_batch_rows; ++row) {
    int64_t sample = take_global_sample();
    if (row % world_size_ == rank_) rows.push_back(sample);
  }
  return rows;
}

void Sampler::restore(const SamplerPosition& position) {
  MXTRAIN_REQUIRE(position.epoch >= 0 && position.index >= 0 && position.index <= sample_count_, checkpoint,
                  strf("sampler position (epoch %lld, index %lld) is outside an epoch of %lld samples",
                       static_cast<long long>(position.epoch), static_cast<long long>(position.index),
                       static_cast<long long>(sample_count_)),
                  "resume with the data the checkpoint was trained on, or start a new run");
  position_ = position;
}

nlohmann::json Sampler::state() const {
  return {{"epoch", position_.epoch}, {"index", position_.index}, {"seed", seed_}, {"sample_count", sample_count_}};
}

void Sampler::restore_state(const nlohmann::json& state) {
  SamplerPosition position;
  uint64_t seed = 0;
  int64_t sample_count = 0;
  try {
    position.epoch = state.at("epoch").get<int64_t>();
    position.index = state.at("index").get<int64_t>();
    seed = state.at("seed").get<uint64_t>();
    sample_count = state.at("sample_count").get<int64_t>();
  } catch (const nlohmann::json::exception& error) {
    throw Error(ErrorKind::checkpoint, strf("malformed sampler state %s: %s", state.dump().c_str(), error.what()),
                "the checkpoint is damaged: resume from an earlier one");
  }
  MXTRAIN_REQUIRE(sample_count == sample_count_, checkpoint,
                  strf("the checkpoint's sampler covered %lld samples, this run's data has %lld",
                       static_cast<long long>(sample_count), static_cast<long long>(sample_count_)),
                  "resume with the same data.train and train.seq_len as the checkpoint, or start a new run");
  MXTRAIN_REQUIRE(seed == seed_, checkpoint,
                  strf("the checkpoint's sampler seed is %llu, this run's is %llu",
                       static_cast<unsigned long long>(seed), static_cast<unsigned long long>(seed_)),
                  "resume with the checkpoint's seed, or start a new run");
  restore(position);
}

}  // namespace mxtrain::data
