#include "mxtrain/data/corpus_meta.hpp"

#include <filesystem>
#include <fstream>

#include "mxtrain/core/error.hpp"

namespace mxtrain::data {

nlohmann::json corpus_meta_to_json(const CorpusMeta& meta) {
  nlohmann::json sources = nlohmann::json::array();
  for (const SourceFile& source : meta.sources) sources.push_back({{"path", source.path}, {"bytes", source.bytes}});
  return {
      {"format", "llm.c token shards"},
      {"tokenizer", meta.tokenizer},
      {"vocab_size", meta.vocab_size},
      {"train_tokens", meta.train_tokens},
      {"val_tokens", meta.val_tokens},
      {"val_fraction", meta.val_fraction},
      {"block_tokens", meta.block_tokens},
      {"shard_tokens", meta.shard_tokens},
      {"train_shards", meta.train_shards},
      {"val_shards", meta.val_shards},
      {"sources", sources},
  };
}

CorpusMeta corpus_meta_from_json(const nlohmann::json& json, const std::string& origin) {
  try {
    CorpusMeta meta;
    meta.tokenizer = json.at("tokenizer").get<std::string>();
    meta.vocab_size = json.at("vocab_size").get<int64_t>();
    meta.train_tokens = json.at("train_tokens").get<int64_t>();
    meta.val_tokens = json.at("val_tokens").get<int64_t>();
    meta.val_fraction = json.at("val_fraction").get<double>();
    meta.block_tokens = json.at("block_tokens").get<int64_t>();
    meta.shard_tokens = json.at("shard_tokens").get<int64_t>();
    meta.train_shards = json.at("train_shards").get<std::vector<std::string>>();
    meta.val_shards = json.at("val_shards").get<std::vector<std::string>>();
    for (const nlohmann::json& source : json.at("sources"))
      meta.sources.push_back({source.at("path").get<std::string>(), source.at("bytes").get<int64_t>()});
    return meta;
  } catch (const nlohmann::json::exception& error) {
    throw Error(ErrorKind::data, strf("%s: not a valid corpus description: %s", origin.c_str(), error.what()),
                "re-run mxtrain prepare to rewrite it");
  }
}

std::optional<CorpusMeta> find_corpus_meta(const std::string& directory) {
  std::filesystem::path path = std::filesystem::path(directory.empty() ? "." : directory) / "meta.json";
  std::ifstream stream(path);
  if (!stream) return std::nullopt;
  nlohmann::json json = nlohmann::json::parse(stream, nullptr, /*allow_exceptions=*/false);
  if (json.is_discarded()) return std::nullopt;
  try {
    return corpus_meta_from_json(json, path.string());
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace mxtrain::data
