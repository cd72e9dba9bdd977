// The order in which training samples are visited: a Fisher–Yates shuffle of all sample indices
// per epoch, driven by our own xoshiro256** seeded from (seed, epoch) through splitmix64, so the
// order is the same on every platform and compiler. The position (epoch, index within the epoch's
// order) is global — the same on every rank — and is all a checkpoint needs to continue exactly.
//
// Data parallelism: every rank computes the same global order. One global micro-step takes the
// next G = global_batch_rows samples; rank r of W keeps rows r, r + W, r + 2W, ... of them. So the
// union of all ranks' rows of a step, interleaved back, is exactly the batch a single rank with
// the same G would get, and N ranks train exactly like 1. A step that runs past the end of an
// epoch continues into the next epoch's order.
#pragma once
#include <cstdint>
#include <vector>

#include <nlohmann/json.hpp>

namespace mxtrain::data {

// Vigna's splitmix64: a seed expander (and the reference mixer for xoshiro's state).
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t state) : state_(state) {}
  uint64_t next();

 private:
  uint64_t state_;
};

// Blackman & Vigna's xoshiro256**, state filled from splitmix64(seed).
class Xoshiro256StarStar {
 public:
  explicit Xoshiro256StarStar(uint64_t seed);
  uint64_t next();
  // Uniform in [0, bound), unbiased (Lemire's multiply-and-reject); bound > 0.
  uint64_t below(uint64_t bound);

 private:
  uint64_t state_[4];
};

// A permutation of [0, sample_count): the order of `epoch` for `seed`.
std::vector<uint32_t> shuffled_order(int64_t sample_count, uint64_t seed, int64_t epoch);

struct SamplerPosition {
  int64_t epoch = 0;
  int64_t index = 0;  // samples of this epoch's order already taken
  bool operator==(const SamplerPosition&) const = default;
};

class Sampler {
 public:
  Sampler(int64_t sample_count, uint64_t seed, int rank = 0, int world_size = 1);

  // This rank's rows of the next global micro-step of global_batch_rows samples, in row order;
  // global_batch_rows must be a multiple of the world size. Advances the global position.
  std::vector<int64_t> next_batch(int64_t global_batch_rows);

  SamplerPosition position() const { return position_; }
  void restore(const SamplerPosition& position);

  // {"epoch": E, "index": I, "seed": S, "sample_count": N} for checkpoints.
  nlohmann::json state() const;
  // Continues exactly where state() was taken. Throws Error(checkpoint) when the state is
  // malformed or was taken over a different sample count or seed (other data, other run).
  void restore_state(const nlohmann::json& state);

  int64_t sample_count() const { return sample_count_; }
  uint64_t seed() const { return seed_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }

 private:
  int64_t take_global_sample();

  int64_t sample_count_;
  uint64_t seed_;
  int rank_;
  int world_size_;
  SamplerPosition position_;
  std::vector<uint32_t> order_;  // of order_epoch_
  int64_t order_epoch_ = -1;
};

}  // namespace mxtrain::data
