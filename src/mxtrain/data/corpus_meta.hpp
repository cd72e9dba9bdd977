// DIR/meta.json, written by `mxtrain prepare` beside the shards: which tokenizer made them and
// from what. Readers use it to say which vocabulary a shard needs when a token is out of range.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace mxtrain::data {

struct SourceFile {
  std::string path;
  int64_t bytes = 0;
};

struct CorpusMeta {
  std::string tokenizer;
  int64_t vocab_size = 0;
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
  double val_fraction = 0;
  int64_t block_tokens = 0;   // the train/validation split's block size
  int64_t shard_tokens = 0;   // most tokens per shard file
  std::vector<std::string> train_shards;  // file names inside the directory
  std::vector<std::string> val_shards;
  std::vector<SourceFile> sources;
};

nlohmann::json corpus_meta_to_json(const CorpusMeta& meta);
// Throws Error(data) naming `origin` when a field is missing or has the wrong type.
CorpusMeta corpus_meta_from_json(const nlohmann::json& json, const std::string& origin);

// The meta.json of a directory, or nothing when there is none or it cannot be parsed.
std::optional<CorpusMeta> find_corpus_meta(const std::string& directory);

}  // namespace mxtrain::data
