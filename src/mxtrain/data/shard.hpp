// Token shards in llm.c's format: a 1024-byte header of 256 little-endian int32 — [0] magic
// 20240520, [1] version (1: uint16 tokens, 2: uint32 tokens), [2] token count — then the tokens.
// The reader also takes llm.c's current header (magic 20240801, version 7, uint32 tokens).
// The reader maps the file (shards run to GBs) and checks the header and the size before any
// token is touched, so every corruption is reported with the file name and the byte offset.
// The writer streams to NAME.tmp and renames onto NAME after an fsync: a reader never sees half a shard.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace mxtrain::data {

constexpr int32_t kShardMagic = 20240520;
constexpr int64_t kShardHeaderBytes = 1024;  // 256 int32
constexpr int32_t kShardVersionU16 = 1;      // tokens stored as uint16
constexpr int32_t kShardVersionU32 = 2;      // tokens stored as uint32 (vocabularies over 65,535)
// llm.c's current data scripts (Llama 3 tokens) write this magic with version 7: uint32 tokens,
// otherwise the same layout. Read, never written (mxtrain writes magic 20240520).
constexpr int32_t kLlmcShardMagic = 20240801;
constexpr int32_t kLlmcShardVersionU32 = 7;

// Version 1 when every id of the vocabulary fits in uint16, else version 2.
int32_t shard_version_for_vocab(int64_t vocab_size);
// Bytes per stored token of a shard version (2 or 4).
int64_t shard_token_bytes(int32_t version);

// Streams tokens into a new shard through NAME.tmp. Nothing appears at `path` until finish(); a
// writer destroyed before finish() removes its temporary file.
class ShardWriter {
 public:
  ShardWriter(std::string path, int64_t vocab_size);
  ~ShardWriter();
  ShardWriter(const ShardWriter&) = delete;
  ShardWriter& operator=(const ShardWriter&) = delete;

  // Each token must lie in [0, vocab_size); a violation is a bug of the caller's tokenizer.
  void append(std::span<const int32_t> tokens);
  // Completes the temporary file: header, fsync, close (no descriptor stays open). Nothing is
  // at `path` yet; finish() publishes it. Lets a caller complete many shards and publish none
  // of them if a later step fails.
  void seal();
  // seal() if not done, then renames NAME.tmp onto NAME and fsyncs the directory.
  void finish();

  const std::string& path() const { return path_; }
  int64_t token_count() const { return token_count_; }
  int32_t version() const { return version_; }

 private:
  void flush_buffer();

  std::string path_;
  std::string temporary_path_;
  int64_t vocab_size_;
  int32_t version_;
  int descriptor_ = -1;
  int64_t token_count_ = 0;
  int64_t flushed_bytes_ = 0;  // token bytes already in the file, after the header
  bool sealed_ = false;
  bool published_ = false;
  std::vector<unsigned char> buffer_;
};

// One call: write `tokens` as a complete shard at `path`.
void write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size);

// A first token id at or above a vocabulary size, found by ShardReader::find_token_at_or_above.
struct OutOfRangeToken {
  int64_t index = -1;       // token index in the shard
  int64_t byte_offset = 0;  // of that token in the file
  uint32_t value = 0;
  uint32_t max_value = 0;   // largest id in the whole shard
};

// A read-only, memory-mapped shard whose header and size have been checked.
class ShardReader {
 public:
  // Throws Error(data) naming the file and the byte offset for: a file shorter than the header,
  // bad magic (offset 0), unknown version (offset 4), a size that does not match the token count.
  explicit ShardReader(std::string path);
  ~ShardReader();
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;

  const std::string& path() const { return path_; }
  int32_t version() const { return version_; }
  int64_t token_count() const { return token_count_; }
  int64_t file_bytes() const { return file_bytes_; }

  uint32_t token(int64_t index) const;
  // Copies tokens [first, first + count) widened to int32 (after validate_vocab they all fit).
  void read_tokens(int64_t first, int64_t count, int32_t* out) const;
  std::vector<int32_t> read_all() const;

  // One pass over the shard; on a hit, also the largest id (for the advice).
  bool find_token_at_or_above(int64_t vocab_size, OutOfRangeToken* found) const;
  // Throws Error(data) for the first token id >= vocab_size: file, token index, byte offset,
  // value and the model's vocab size; the advice names the vocabulary the shard was made with.
  void validate_vocab(int64_t vocab_size) const;

 private:
  void unmap();

  std::string path_;
  const unsigned char* mapping_ = nullptr;
  int64_t file_bytes_ = 0;
  int32_t version_ = 0;
  int64_t token_count_ = 0;
};

}  // namespace mxtrain::data
