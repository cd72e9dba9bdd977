// A dataset is a sorted list of shards cut into samples. Sample windows never cross a shard:
// window i of a shard covers tokens [i·seq_len, i·seq_len + seq_len + 1), so consecutive windows
// share one token (the last target of one is the first input of the next) and a shard of N tokens
// holds (N - 1) / seq_len of them. Every token is checked against the vocabulary once, at open.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mxtrain/data/shard.hpp"

namespace mxtrain::data {

// The files a shard glob names, sorted by name. A relative pattern is tried against the current
// directory first, then against `fallback_base_dir` (the trainer passes the source tree) when
// given. No match: Error(data) naming the pattern and where it looked; the advice names
// `config_key` as the setting to change.
std::vector<std::string> resolve_shard_glob(const std::string& pattern, const std::string& fallback_base_dir = {},
                                            const std::string& config_key = "data.train");

class TokenDataset {
 public:
  // Maps every shard, validates every token against vocab_size, and throws Error(data) when no
  // shard holds even one window of seq_len + 1 tokens.
  TokenDataset(std::vector<std::string> shard_paths, int64_t seq_len, int64_t vocab_size);

  int64_t seq_len() const { return seq_len_; }
  int64_t vocab_size() const { return vocab_size_; }
  int64_t sample_count() const { return sample_offsets_.back(); }
  int64_t token_count() const { return token_count_; }
  int64_t shard_count() const { return static_cast<int64_t>(shards_.size()); }
  const ShardReader& shard(int64_t index) const { return shards_[static_cast<size_t>(index)]; }

  // Which shard and which window of it a global sample index names.
  struct Location {
    int64_t shard = 0;
    int64_t window = 0;
  };
  Location locate(int64_t sample_index) const;

  // inputs[0..seq_len) = window tokens [0, seq_len), targets[0..seq_len) = tokens [1, seq_len + 1).
  void read_sample(int64_t sample_index, int32_t* inputs, int32_t* targets) const;

  // "3 shards, 2,301,234 tokens, 8,988 samples of 256+1 tokens"
  std::string describe() const;

 private:
  std::vector<ShardReader> shards_;
  std::vector<int64_t> sample_offsets_;  // [shards + 1]: first global sample index of each shard
  int64_t seq_len_;
  int64_t vocab_size_;
  int64_t token_count_ = 0;
};

// Windows of seq_len + 1 tokens in a shard of token_count tokens.
int64_t windows_in_shard(int64_t token_count, int64_t seq_len);

}  // namespace mxtrain::data
