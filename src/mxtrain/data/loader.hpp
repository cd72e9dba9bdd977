// Micro-batches of host int32 tokens and targets, each row one sample window of the dataset.
// TrainLoader draws rows from the Sampler (shuffled, rank-sharded, resumable); ValidationReader
// walks the validation windows in order, from the first window again at every evaluation, so
// every evaluation measures the same tokens.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/data/dataset.hpp"
#include "mxtrain/data/sampler.hpp"

namespace mxtrain::data {

struct Batch {
  std::vector<int32_t> tokens;   // [batch * seq], row-major
  std::vector<int32_t> targets;  // [batch * seq]: tokens shifted left by one
  int64_t batch = 0;
  int64_t seq = 0;
};

// Resolves `pattern` (see resolve_shard_glob), opens and validates the shards, and logs one line
// "<label> data: <describe()>". `config_key` names the setting in error advice.
std::shared_ptr<const TokenDataset> open_dataset(const std::string& label, const std::string& pattern,
                                                 const std::string& fallback_base_dir, const std::string& config_key,
                                                 int64_t seq_len, int64_t vocab_size);

class TrainLoader {
 public:
  // rows_per_rank: micro-batch rows of this rank; a global micro-step takes rows_per_rank ×
  // world_size samples from the shared order.
  TrainLoader(std::shared_ptr<const TokenDataset> dataset, int64_t rows_per_rank, uint64_t seed, int rank = 0,
              int world_size = 1);

  Batch next();

  // The sampler's state (see Sampler::state); the same on every rank.
  nlohmann::json state() const { return sampler_.state(); }
  void restore_state(const nlohmann::json& state) { sampler_.restore_state(state); }
  const Sampler& sampler() const { return sampler_; }
  const TokenDataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const TokenDataset> dataset_;
  int64_t rows_per_rank_;
  Sampler sampler_;
};

class ValidationReader {
 public:
  ValidationReader(std::shared_ptr<const TokenDataset> dataset, int64_t rows_per_rank, int rank = 0,
                   int world_size = 1);

  // Begins an evaluation at the first window and returns how many batches next() will give:
  // requested_batches, capped so that no window is read twice (the cap is the same on every
  // rank). If the set holds fewer windows than one global batch, one batch that wraps around.
  int64_t start(int64_t requested_batches);
  // The next batch of the evaluation in window order (global step s takes windows
  // [s·G, (s+1)·G), this rank rows r, r + W, ...); nothing once the evaluation is done.
  std::optional<Batch> next();

  const TokenDataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const TokenDataset> dataset_;
  int64_t rows_per_rank_;
  int rank_;
  int world_size_;
  int64_t batches_left_ = 0;
  int64_t next_window_ = 0;  // global index of the next global step's first window
};

}  // namespace mxtrain::data
