#include "mxtrain/data/prepare.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <exception>

#include <omp.h>
#include <memory>
#include <regex>
#include <set>
#include <span>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/core/progress.hpp"
#include "mxtrain/data/documents.hpp"
#include "mxtrain/data/shard.hpp"
#include "mxtrain/data/tokenizer.hpp"

namespace mxtrain::data {
namespace {

namespace fs = std::filesystem;

std::string shard_name(const std::string& prefix, size_t index) {
  return strf("%s_%06zu.bin", prefix.c_str(), index);
}

// A run of shards DIR/PREFIX_000000.bin, ... of at most shard_tokens tokens each. Every shard
// stays a sealed temporary file until finish(), so a failure leaves the directory as it was.
class ShardSequence {
 public:
  ShardSequence(std::string directory, std::string prefix, int64_t shard_tokens, int64_t vocab_size)
      : directory_(std::move(directory)), prefix_(std::move(prefix)), shard_tokens_(shard_tokens),
        vocab_size_(vocab_size) {}

  void append(std::span<const int32_t> tokens) {
    while (!tokens.empty()) {
      if (writers_.empty() || writers_.back()->token_count() == shard_tokens_) {
        if (!writers_.empty()) writers_.back()->seal();
        std::string path = (fs::path(directory_) / shard_name(prefix_, writers_.size())).string();
        writers_.push_back(std::make_unique<ShardWriter>(path, vocab_size_));
      }
      size_t room = static_cast<size_t>(shard_tokens_ - writers_.back()->token_count());
      size_t take = std::min(room, tokens.size());
      writers_.back()->append(tokens.first(take));
      tokens = tokens.subspan(take);
      token_count_ += static_cast<int64_t>(take);
    }
  }

  std::vector<WrittenShard> finish() {
    std::vector<WrittenShard> written;
    for (const std::unique_ptr<ShardWriter>& writer : writers_) {
      writer->finish();
      written.push_back({writer->path(), writer->token_count()});
    }
    writers_.clear();
    return written;
  }

  int64_t token_count() const { return token_count_; }

 private:
  std::string directory_;
  std::string prefix_;
  int64_t shard_tokens_;
  int64_t vocab_size_;
  int64_t token_count_ = 0;
  std::vector<std::unique_ptr<ShardWriter>> writers_;
};

// Cuts the token stream into blocks and sends every k-th one to validation.
class SplitRouter {
 public:
  SplitRouter(int64_t period, ShardSequence& train, ShardSequence& val) : period_(period), train_(train), val_(val) {}

  void route(std::span<const int32_t> tokens) {
    while (!tokens.empty()) {
      int64_t block = stream_position_ / kSplitBlockTokens;
      int64_t left_in_block = (block + 1) * kSplitBlockTokens - stream_position_;
      size_t take = std::min(static_cast<size_t>(left_in_block), tokens.size());
      ((block + 1) % period_ == 0 ? val_ : train_).append(tokens.first(take));
      tokens = tokens.subspan(take);
      stream_position_ += static_cast<int64_t>(take);
    }
  }

  int64_t stream_tokens() const { return stream_position_; }

 private:
  int64_t period_;
  ShardSequence& train_;
  ShardSequence& val_;
  int64_t stream_position_ = 0;
};

[[noreturn]] void throw_unreadable(const std::string& path, const std::string& reason) {
  throw Error(ErrorKind::data, strf("cannot read input file %s: %s", path.c_str(), reason.c_str()),
              "check the path and permissions; mxtrain prepare takes readable text files");
}

// Fails before anything is written when any input cannot be read.
std::vector<SourceFile> check_inputs(const std::vector<std::string>& paths) {
  std::vector<SourceFile> sources;
  for (const std::string& path : paths) {
    std::error_code error;
    fs::file_status status = fs::status(path, error);
    if (error || !fs::exists(status)) throw_unreadable(path, "no such file");
    if (!fs::is_regular_file(status)) throw_unreadable(path, "not a regular file");
    document_format(path);  // .parquet and stray .zst are refused here, before anything is written
    std::ifstream stream(path, std::ios::binary);
    if (!stream) throw_unreadable(path, std::strerror(errno));
    sources.push_back({path, static_cast<int64_t>(fs::file_size(path, error))});
  }
  return sources;
}

// Shards named like ours (and their temporaries) that this run did not write.
std::vector<std::string> remove_stale_shards(const std::string& directory, const std::set<std::string>& written) {
  static const std::regex kShardName(R"((train|val)_[0-9]{6}\.bin(\.tmp)?)");
  std::vector<std::string> removed;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory)) {
    std::string name = entry.path().filename().string();
    if (!entry.is_regular_file() || !std::regex_match(name, kShardName) || written.count(name)) continue;
    std::error_code error;
    if (fs::remove(entry.path(), error)) removed.push_back(entry.path().string());
  }
  std::sort(removed.begin(), removed.end());
  return removed;
}

// Each document's tokens, computed on `threads` threads (0: all cores), in the documents' order.
std::vector<std::vector<int32_t>> encode_all(const Tokenizer& tokenizer, const std::vector<std::string>& documents,
                                             int threads) {
  std::vector<std::vector<int32_t>> tokens(documents.size());
  std::exception_ptr failure;
  const int count = static_cast<int>(documents.size());
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads > 0 ? threads : omp_get_max_threads())
  for (int i = 0; i < count; ++i) {
    try {
      tokens[static_cast<size_t>(i)] = tokenizer.encode(documents[static_cast<size_t>(i)]);
    } catch (...) {
#pragma omp critical
      if (!failure) failure = std::current_exception();
    }
  }
  if (failure) std::rethrow_exception(failure);
  return tokens;
}

void check_options(const PrepareOptions& options) {
  MXTRAIN_REQUIRE(!options.output_dir.empty(), config, "no output directory given",
                  "pass --output DIR, e.g. --output data/mycorpus");
  MXTRAIN_REQUIRE(!options.input_files.empty(), config, "no input files given",
                  "pass one or more text, .jsonl or .jsonl.zst files after the options");
  MXTRAIN_REQUIRE(!options.field.empty(), config, "--field is empty", "name the JSON field that holds the text");
  MXTRAIN_REQUIRE(options.threads >= 0 && options.threads <= 4096, config,
                  strf("--threads %d is outside [0, 4096]", options.threads), "use 0 (every core) or a core count");
  MXTRAIN_REQUIRE(options.shard_tokens > 0 && options.shard_tokens <= std::numeric_limits<int32_t>::max(), config,
                  strf("--shard-tokens %lld is outside [1, 2147483647] (a shard header counts tokens in an int32)",
                       static_cast<long long>(options.shard_tokens)),
                  "use --shard-tokens 100000000 (the default) or another value in range");
  validation_block_period(options.val_fraction);
}

}  // namespace

int64_t validation_block_period(double val_fraction) {
  MXTRAIN_REQUIRE(std::isfinite(val_fraction) && val_fraction > 0 && val_fraction <= 0.5, config,
                  strf("--val-fraction %g is outside (0, 0.5]", val_fraction),
                  "use a fraction such as 0.05 (every 20th block of 4096 tokens goes to validation)");
  return std::llround(1.0 / val_fraction);
}

PrepareResult prepare_corpus(const PrepareOptions& options) {
  check_options(options);
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer(options.tokenizer);
  const int64_t period = validation_block_period(options.val_fraction);
  std::vector<SourceFile> sources = check_inputs(options.input_files);

  std::error_code error;
  fs::create_directories(options.output_dir, error);
  if (error || !fs::is_directory(options.output_dir)) {
    throw Error(ErrorKind::system,
                strf("cannot create output directory %s: %s", options.output_dir.c_str(),
                     error ? error.message().c_str() : "a file of that name exists"),
                "choose another --output or fix the permissions of its parent");
  }

  const int64_t vocab_size = tokenizer->vocab_size();
  ShardSequence train(options.output_dir, "train", options.shard_tokens, vocab_size);
  ShardSequence val(options.output_dir, "val", options.shard_tokens, vocab_size);
  SplitRouter router(period, train, val);
  // Between documents: the end-of-document token where the tokenizer has one (EOS), else the
  // tokens of a newline (the byte tokenizer: files joined by newlines, as before).
  const std::optional<int32_t> eos = tokenizer->eos_id();
  const std::vector<int32_t> separator = eos ? std::vector<int32_t>{*eos} : tokenizer->encode("\n");
  uint64_t total_bytes = 0;
  for (const SourceFile& source : sources) total_bytes += static_cast<uint64_t>(source.bytes);
  Progress progress("prepare", static_cast<double>(total_bytes));
  int64_t documents = 0;
  uint64_t finished_bytes = 0;
  for (const SourceFile& source : sources) {
    DocumentReader reader(source.path, options.field);
    // Documents in batches of about 64 MB, each batch tokenized on every core and routed in
    // order (a tokenizer may merge across any cut inside a document, never across documents).
    bool more = true;
    while (more) {
      std::vector<std::string> batch;
      size_t batch_bytes = 0;
      while (batch_bytes < (64u << 20) && batch.size() < 65536) {
        std::optional<std::string> document = reader.next();
        if (!document) {
          more = false;
          break;
        }
        batch_bytes += document->size();
        batch.push_back(std::move(*document));
      }
      for (std::vector<int32_t>& tokens : encode_all(*tokenizer, batch, options.threads)) {
        if (documents++ > 0) router.route(separator);
        router.route(tokens);
      }
      progress.update(static_cast<double>(finished_bytes + reader.bytes_read()));
    }
    finished_bytes += static_cast<uint64_t>(source.bytes);
  }
  progress.finish();
  if (val.token_count() == 0) {
    throw Error(ErrorKind::data,
                strf("the corpus has %s tokens, too few for a validation block: with --val-fraction %g, 1 block "
                     "in %lld (of %lld tokens) goes to validation, so it needs more than %s tokens",
                     log::with_commas(static_cast<double>(router.stream_tokens())).c_str(), options.val_fraction,
                     static_cast<long long>(period), static_cast<long long>(kSplitBlockTokens),
                     log::with_commas(static_cast<double>((period - 1) * kSplitBlockTokens)).c_str()),
                "add text, or raise --val-fraction (0.5 needs just over 4096 tokens)");
  }

  PrepareResult result;
  result.train_shards = train.finish();
  result.val_shards = val.finish();
  CorpusMeta& meta = result.meta;
  meta.tokenizer = tokenizer->name();
  meta.vocab_size = vocab_size;
  meta.train_tokens = train.token_count();
  meta.val_tokens = val.token_count();
  meta.val_fraction = options.val_fraction;
  meta.block_tokens = kSplitBlockTokens;
  meta.shard_tokens = options.shard_tokens;
  meta.sources = std::move(sources);
  std::set<std::string> written;
  for (const WrittenShard& shard : result.train_shards) {
    meta.train_shards.push_back(fs::path(shard.path).filename().string());
    written.insert(meta.train_shards.back());
  }
  for (const WrittenShard& shard : result.val_shards) {
    meta.val_shards.push_back(fs::path(shard.path).filename().string());
    written.insert(meta.val_shards.back());
  }
  result.documents = documents;
  result.meta_path = (fs::path(options.output_dir) / "meta.json").string();
  write_file_atomically(result.meta_path, corpus_meta_to_json(meta).dump(2) + "\n");
  result.removed_stale = remove_stale_shards(options.output_dir, written);
  return result;
}

}  // namespace mxtrain::data
