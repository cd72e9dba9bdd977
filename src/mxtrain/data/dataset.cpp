#include "mxtrain/data/dataset.hpp"

#include <glob.h>

#include <algorithm>
#include <filesystem>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain::data {
namespace {

std::vector<std::string> glob_files(const std::string& pattern) {
  glob_t matches{};
  int result = glob(pattern.c_str(), GLOB_NOSORT, nullptr, &matches);
  std::vector<std::string> paths;
  if (result == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      std::error_code error;
      if (std::filesystem::is_regular_file(matches.gl_pathv[i], error)) paths.emplace_back(matches.gl_pathv[i]);
    }
  }
  globfree(&matches);
  // Byte order, not the locale's collation: the same list on every machine.
  std::sort(paths.begin(), paths.end());
  return paths;
}

// What the user likely got wrong, for the no-match message: a directory where a glob of files
// belongs (with the glob that would match its shards), or a folder that does not exist. Sets
// *glob to that glob when it matches shards.
std::string why_no_match(const std::string& pattern, const std::string& config_key, std::string* glob_found) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path path(pattern);
  if (fs::is_directory(path, error)) {
    const std::string prefix = config_key == "data.val" ? "val_" : "train_";
    const std::string glob = (path / (prefix + "*.bin")).string();
    const size_t shards = glob_files(glob).size();
    if (shards > 0) {
      *glob_found = glob;
      return strf(": it is a directory, and %s takes a glob of shard files — '%s' matches %zu shard%s there",
                  config_key.c_str(), glob.c_str(), shards, shards == 1 ? "" : "s");
    }
    return strf(": it is a directory without %s*.bin shards, and %s takes a glob of shard files", prefix.c_str(),
                config_key.c_str());
  }
  const fs::path folder = path.parent_path();
  if (!folder.empty() && folder.string().find_first_of("*?[") == std::string::npos && !fs::exists(folder, error))
    return strf(": the folder '%s' does not exist", folder.string().c_str());
  return "";
}

}  // namespace

std::vector<std::string> resolve_shard_glob(const std::string& pattern, const std::string& fallback_base_dir,
                                            const std::string& config_key) {
  MXTRAIN_REQUIRE(!pattern.empty(), config, strf("%s is empty", config_key.c_str()),
                  strf("set %s to a glob of token shards, e.g. data/fortunes/train_*.bin", config_key.c_str()));
  std::vector<std::string> paths = glob_files(pattern);
  if (!paths.empty()) return paths;
  std::string looked = std::filesystem::path(pattern).is_absolute()
                           ? std::string()
                           : " in " + std::filesystem::current_path().string();
  if (std::filesystem::path(pattern).is_relative() && !fallback_base_dir.empty()) {
    std::string fallback = (std::filesystem::path(fallback_base_dir) / pattern).string();
    paths = glob_files(fallback);
    if (!paths.empty()) return paths;
    looked += " or in " + fallback_base_dir;
  }
  std::string glob_found;
  const std::string why = why_no_match(pattern, config_key, &glob_found);
  const std::string fix =
      !glob_found.empty()
          ? strf("set %s = '%s'", config_key.c_str(), glob_found.c_str())
          : strf("make token shards with `mxtrain prepare --output DIR TEXT...` (it writes DIR/train_*.bin and "
                 "DIR/val_*.bin; scripts/setup.sh prepares the default corpus), then set %s to a glob of them",
                 config_key.c_str());
  throw Error(ErrorKind::data, strf("no token shard matches '%s'%s%s", pattern.c_str(), looked.c_str(), why.c_str()),
              fix);
}

int64_t windows_in_shard(int64_t token_count, int64_t seq_len) {
  return token_count > seq_len ? (token_count - 1) / seq_len : 0;
}

TokenDataset::TokenDataset(std::vector<std::string> shard_paths, int64_t seq_len, int64_t vocab_size)
    : seq_len_(seq_len), vocab_size_(vocab_size) {
  MXTRAIN_REQUIRE(seq_len > 0, config, strf("train.seq_len is %lld", static_cast<long long>(seq_len)),
                  "set train.seq_len to a positive number of tokens");
  MXTRAIN_REQUIRE(vocab_size > 0, config, strf("model.vocab_size is %lld", static_cast<long long>(vocab_size)),
                  "set model.vocab_size to the tokenizer's vocabulary (256 for the byte tokenizer)");
  MXTRAIN_ASSERT(!shard_paths.empty(), "a dataset needs at least one shard");
  sample_offsets_.push_back(0);
  int64_t largest_shard = 0;
  for (std::string& path : shard_paths) {
    ShardReader shard(std::move(path));
    shard.validate_vocab(vocab_size);
    token_count_ += shard.token_count();
    largest_shard = std::max(largest_shard, shard.token_count());
    sample_offsets_.push_back(sample_offsets_.back() + windows_in_shard(shard.token_count(), seq_len));
    shards_.push_back(std::move(shard));
  }
  if (sample_count() == 0) {
    throw Error(ErrorKind::data,
                strf("%s%s: too few tokens for one sample of seq_len + 1 = %lld tokens (the largest shard holds %lld)",
                     shards_.front().path().c_str(), shards_.size() > 1 ? " and the other shards" : "",
                     static_cast<long long>(seq_len + 1), static_cast<long long>(largest_shard)),
                strf("lower train.seq_len below %lld, or add data (mxtrain prepare with more text)",
                     static_cast<long long>(largest_shard)));
  }
}

TokenDataset::Location TokenDataset::locate(int64_t sample_index) const {
  MXTRAIN_ASSERT(sample_index >= 0 && sample_index < sample_count(), "sample %lld of %lld",
                 static_cast<long long>(sample_index), static_cast<long long>(sample_count()));
  // The last offset <= sample_index; shards without windows share an offset and are skipped.
  auto next = std::upper_bound(sample_offsets_.begin(), sample_offsets_.end(), sample_index);
  int64_t shard = static_cast<int64_t>(next - sample_offsets_.begin()) - 1;
  return {shard, sample_index - sample_offsets_[static_cast<size_t>(shard)]};
}

void TokenDataset::read_sample(int64_t sample_index, int32_t* inputs, int32_t* targets) const {
  Location location = locate(sample_index);
  const ShardReader& reader = shards_[static_cast<size_t>(location.shard)];
  int64_t first = location.window * seq_len_;
  reader.read_tokens(first, seq_len_, inputs);
  reader.read_tokens(first + 1, seq_len_, targets);
}

std::string TokenDataset::describe() const {
  return strf("%lld shard%s, %s tokens, %s samples of %lld+1 tokens", static_cast<long long>(shards_.size()),
              shards_.size() == 1 ? "" : "s", log::with_commas(static_cast<double>(token_count_)).c_str(),
              log::with_commas(static_cast<double>(sample_count())).c_str(), static_cast<long long>(seq_len_));
}

}  // namespace mxtrain::data
