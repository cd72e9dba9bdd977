#include "mxtrain/data/shard.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <optional>
#include <utility>

#include "mxtrain/core/error.hpp"
#include "mxtrain/data/corpus_meta.hpp"

namespace mxtrain::data {

// Tokens are copied between the file and memory as raw bytes.
static_assert(std::endian::native == std::endian::little, "shards are little-endian; this host is not");

namespace {

constexpr size_t kWriteBufferBytes = size_t{1} << 20;
constexpr const char* kRemakeAdvice = "re-run mxtrain prepare to rewrite the shard, or copy it again from its source";

std::string parent_directory(const std::string& path) {
  std::string parent = std::filesystem::path(path).parent_path().string();
  return parent.empty() ? "." : parent;
}

[[noreturn]] void throw_system(const std::string& action, const std::string& path) {
  throw Error(ErrorKind::system, strf("cannot %s %s: %s", action.c_str(), path.c_str(), std::strerror(errno)),
              strf("check that %s exists, is writable and has free space", parent_directory(path).c_str()));
}

void write_all(int descriptor, const void* data, size_t bytes, off_t offset, const std::string& path) {
  const char* cursor = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t written = pwrite(descriptor, cursor, bytes, offset);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) throw_system("write", path);
    cursor += written;
    bytes -= static_cast<size_t>(written);
    offset += written;
  }
}

void fsync_directory(const std::string& path) {
  int descriptor = open(parent_directory(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (descriptor < 0) return;  // the rename happened; a directory we cannot open cannot be synced either
  fsync(descriptor);
  close(descriptor);
}

int32_t read_le_int32(const unsigned char* bytes) {
  uint32_t value = static_cast<uint32_t>(bytes[0]) | static_cast<uint32_t>(bytes[1]) << 8 |
                   static_cast<uint32_t>(bytes[2]) << 16 | static_cast<uint32_t>(bytes[3]) << 24;
  return static_cast<int32_t>(value);
}

template <typename Word>
Word max_of(const Word* tokens, int64_t count) {
  Word largest = 0;
  for (int64_t i = 0; i < count; ++i) largest = std::max(largest, tokens[i]);
  return largest;
}

// Blocks of 64 Ki tokens keep the common case (nothing out of range) one vectorised max per block.
template <typename Word>
bool scan_for_out_of_range(const Word* tokens, int64_t count, uint64_t vocab_size, OutOfRangeToken* found) {
  constexpr int64_t kBlock = int64_t{1} << 16;
  bool hit = false;
  Word largest = 0;
  for (int64_t begin = 0; begin < count; begin += kBlock) {
    int64_t length = std::min(kBlock, count - begin);
    Word block_max = max_of(tokens + begin, length);
    largest = std::max(largest, block_max);
    if (hit || block_max < vocab_size) continue;
    for (int64_t i = begin; i < begin + length; ++i) {
      if (tokens[i] >= vocab_size) {
        found->index = i;
        found->value = tokens[i];
        break;
      }
    }
    hit = true;
  }
  if (hit) found->max_value = largest;
  return hit;
}

}  // namespace

int32_t shard_version_for_vocab(int64_t vocab_size) {
  MXTRAIN_ASSERT(vocab_size > 0, "vocab_size %lld", static_cast<long long>(vocab_size));
  return vocab_size - 1 <= std::numeric_limits<uint16_t>::max() ? kShardVersionU16 : kShardVersionU32;
}

int64_t shard_token_bytes(int32_t version) {
  MXTRAIN_ASSERT(version == kShardVersionU16 || version == kShardVersionU32, "shard version %d", version);
  return version == kShardVersionU16 ? 2 : 4;
}

// ---- writer ------------------------------------------------------------------------------------

ShardWriter::ShardWriter(std::string path, int64_t vocab_size)
    : path_(std::move(path)),
      temporary_path_(path_ + ".tmp"),
      vocab_size_(vocab_size),
      version_(shard_version_for_vocab(vocab_size)) {
  descriptor_ = open(temporary_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (descriptor_ < 0) throw_system("create", temporary_path_);
}

ShardWriter::~ShardWriter() {
  if (descriptor_ >= 0) close(descriptor_);
  if (!published_) unlink(temporary_path_.c_str());
}

void ShardWriter::append(std::span<const int32_t> tokens) {
  MXTRAIN_ASSERT(!sealed_, "append after seal on %s", path_.c_str());
  // The header's token count is an int32.
  MXTRAIN_REQUIRE(token_count_ + static_cast<int64_t>(tokens.size()) <= std::numeric_limits<int32_t>::max(), data,
                  strf("%s: more than 2,147,483,647 tokens in one shard", path_.c_str()),
                  "use a smaller --shard-tokens");
  const size_t token_bytes = static_cast<size_t>(shard_token_bytes(version_));
  for (int32_t token : tokens) {
    MXTRAIN_ASSERT(token >= 0 && token < vocab_size_, "%s: token %d outside the vocabulary [0, %lld)", path_.c_str(),
                   token, static_cast<long long>(vocab_size_));
    if (buffer_.size() + token_bytes > kWriteBufferBytes) flush_buffer();
    if (buffer_.capacity() == 0) buffer_.reserve(kWriteBufferBytes);
    uint32_t value = static_cast<uint32_t>(token);
    size_t at = buffer_.size();
    buffer_.resize(at + token_bytes);
    if (token_bytes == 2) {
      uint16_t narrow = static_cast<uint16_t>(value);
      std::memcpy(buffer_.data() + at, &narrow, 2);
    } else {
      std::memcpy(buffer_.data() + at, &value, 4);
    }
  }
  token_count_ += static_cast<int64_t>(tokens.size());
}

void ShardWriter::flush_buffer() {
  if (buffer_.empty()) return;
  write_all(descriptor_, buffer_.data(), buffer_.size(), static_cast<off_t>(kShardHeaderBytes + flushed_bytes_),
            temporary_path_);
  flushed_bytes_ += static_cast<int64_t>(buffer_.size());
  buffer_.clear();
}

void ShardWriter::seal() {
  MXTRAIN_ASSERT(!sealed_, "seal twice on %s", path_.c_str());
  flush_buffer();
  std::vector<unsigned char>().swap(buffer_);
  int32_t header[kShardHeaderBytes / 4] = {};
  header[0] = kShardMagic;
  header[1] = version_;
  header[2] = static_cast<int32_t>(token_count_);
  write_all(descriptor_, header, sizeof header, 0, temporary_path_);
  if (fsync(descriptor_) != 0) throw_system("fsync", temporary_path_);
  int result = close(descriptor_);
  descriptor_ = -1;
  if (result != 0) throw_system("close", temporary_path_);
  sealed_ = true;
}

void ShardWriter::finish() {
  MXTRAIN_ASSERT(!published_, "finish twice on %s", path_.c_str());
  if (!sealed_) seal();
  if (std::rename(temporary_path_.c_str(), path_.c_str()) != 0) throw_system("rename onto", path_);
  published_ = true;
  fsync_directory(path_);
}

void write_shard(const std::string& path, std::span<const int32_t> tokens, int64_t vocab_size) {
  ShardWriter writer(path, vocab_size);
  writer.append(tokens);
  writer.finish();
}

// ---- reader ------------------------------------------------------------------------------------

ShardReader::ShardReader(std::string path) : path_(std::move(path)) {
  const char* name = path_.c_str();
  int descriptor = open(name, O_RDONLY | O_CLOEXEC);
  if (descriptor < 0) {
    throw Error(ErrorKind::data, strf("cannot open token shard %s: %s", name, std::strerror(errno)),
                "check the path in data.train / data.val, or run scripts/setup.sh, which prepares the corpus");
  }
  struct stat info {};
  if (fstat(descriptor, &info) != 0) {
    int saved = errno;
    close(descriptor);
    throw Error(ErrorKind::data, strf("cannot stat token shard %s: %s", name, std::strerror(saved)),
                "check the file's permissions");
  }
  file_bytes_ = static_cast<int64_t>(info.st_size);
  auto fail = [&](const std::string& what, const std::string& advice) {
    close(descriptor);
    throw Error(ErrorKind::data, what, advice);
  };
  if (file_bytes_ < kShardHeaderBytes) {
    fail(strf("%s: file is %lld bytes, shorter than the %lld-byte shard header (it ends at byte offset %lld)", name,
              static_cast<long long>(file_bytes_), static_cast<long long>(kShardHeaderBytes),
              static_cast<long long>(file_bytes_)),
         kRemakeAdvice);
  }
  unsigned char header[12];
  if (pread(descriptor, header, sizeof header, 0) != static_cast<ssize_t>(sizeof header)) {
    fail(strf("%s: cannot read the shard header at byte offset 0: %s", name, std::strerror(errno)), kRemakeAdvice);
  }
  // mxtrain's and llm.c's GPT-2 shards: magic 20240520, version 1 (uint16) or 2 (uint32); llm.c's
  // current scripts (Llama 3 tokens): magic 20240801, version 7, uint32 tokens — the same layout
  // as version 2.
  const int32_t magic = read_le_int32(header);
  if (magic != kShardMagic && magic != kLlmcShardMagic) {
    fail(strf("%s: bad magic number %d at byte offset 0 (a token shard starts with %d, or %d from llm.c's current "
              "scripts): not a token shard",
              name, magic, kShardMagic, kLlmcShardMagic),
         "point data.train / data.val at .bin shards written by mxtrain prepare (or llm.c), or re-run mxtrain prepare");
  }
  version_ = read_le_int32(header + 4);
  if (magic == kLlmcShardMagic && version_ == kLlmcShardVersionU32) version_ = kShardVersionU32;
  else if (magic != kShardMagic || (version_ != kShardVersionU16 && version_ != kShardVersionU32)) {
    fail(strf("%s: unknown shard version %d at byte offset 4 for magic %d (known: 20240520 with 1 = uint16 tokens or "
              "2 = uint32 tokens; 20240801 with 7 = uint32 tokens)",
              name, version_, magic),
         kRemakeAdvice);
  }
  int32_t count = read_le_int32(header + 8);
  if (count < 0) {
    fail(strf("%s: negative token count %d at byte offset 8", name, count), kRemakeAdvice);
  }
  token_count_ = count;
  const long long needed = static_cast<long long>(token_count_ * shard_token_bytes(version_));
  const long long present = static_cast<long long>(file_bytes_ - kShardHeaderBytes);
  if (present < needed) {
    fail(strf("%s: truncated: the header says %lld tokens, which need %lld bytes from byte offset %lld, but the file "
              "has %lld (it ends at byte offset %lld)",
              name, static_cast<long long>(token_count_), needed, static_cast<long long>(kShardHeaderBytes), present,
              static_cast<long long>(file_bytes_)),
         kRemakeAdvice);
  }
  if (present > needed) {
    fail(strf("%s: %lld unexpected bytes at byte offset %lld: the header says %lld tokens, which need %lld bytes from "
              "byte offset %lld, but the file has %lld",
              name, present - needed, needed + static_cast<long long>(kShardHeaderBytes),
              static_cast<long long>(token_count_), needed, static_cast<long long>(kShardHeaderBytes), present),
         kRemakeAdvice);
  }
  void* mapping = mmap(nullptr, static_cast<size_t>(file_bytes_), PROT_READ, MAP_PRIVATE, descriptor, 0);
  int saved = errno;
  close(descriptor);
  if (mapping == MAP_FAILED) {
    throw Error(ErrorKind::system, strf("cannot map token shard %s (%lld bytes): %s", name,
                                        static_cast<long long>(file_bytes_), std::strerror(saved)),
                "check the address-space limit (ulimit -v) and free memory");
  }
  mapping_ = static_cast<const unsigned char*>(mapping);
}

ShardReader::~ShardReader() { unmap(); }

ShardReader::ShardReader(ShardReader&& other) noexcept
    : path_(std::move(other.path_)),
      mapping_(std::exchange(other.mapping_, nullptr)),
      file_bytes_(std::exchange(other.file_bytes_, 0)),
      version_(other.version_),
      token_count_(std::exchange(other.token_count_, 0)) {}

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    unmap();
    path_ = std::move(other.path_);
    mapping_ = std::exchange(other.mapping_, nullptr);
    file_bytes_ = std::exchange(other.file_bytes_, 0);
    version_ = other.version_;
    token_count_ = std::exchange(other.token_count_, 0);
  }
  return *this;
}

void ShardReader::unmap() {
  if (mapping_) munmap(const_cast<unsigned char*>(mapping_), static_cast<size_t>(file_bytes_));
  mapping_ = nullptr;
}

uint32_t ShardReader::token(int64_t index) const {
  MXTRAIN_ASSERT(index >= 0 && index < token_count_, "token %lld of %lld in %s", static_cast<long long>(index),
                 static_cast<long long>(token_count_), path_.c_str());
  const unsigned char* tokens = mapping_ + kShardHeaderBytes;
  if (version_ == kShardVersionU16) {
    uint16_t value;
    std::memcpy(&value, tokens + 2 * index, 2);
    return value;
  }
  uint32_t value;
  std::memcpy(&value, tokens + 4 * index, 4);
  return value;
}

void ShardReader::read_tokens(int64_t first, int64_t count, int32_t* out) const {
  MXTRAIN_ASSERT(first >= 0 && count >= 0 && first + count <= token_count_, "tokens [%lld, +%lld) of %lld in %s",
                 static_cast<long long>(first), static_cast<long long>(count), static_cast<long long>(token_count_),
                 path_.c_str());
  const unsigned char* tokens = mapping_ + kShardHeaderBytes;
  if (version_ == kShardVersionU16) {
    const auto* words = reinterpret_cast<const uint16_t*>(tokens) + first;  // the mapping is page aligned
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(words[i]);
  } else {
    const auto* words = reinterpret_cast<const uint32_t*>(tokens) + first;
    for (int64_t i = 0; i < count; ++i) out[i] = static_cast<int32_t>(words[i]);
  }
}

std::vector<int32_t> ShardReader::read_all() const {
  std::vector<int32_t> tokens(static_cast<size_t>(token_count_));
  read_tokens(0, token_count_, tokens.data());
  return tokens;
}

bool ShardReader::find_token_at_or_above(int64_t vocab_size, OutOfRangeToken* found) const {
  MXTRAIN_ASSERT(vocab_size > 0, "vocab_size %lld", static_cast<long long>(vocab_size));
  const unsigned char* tokens = mapping_ + kShardHeaderBytes;
  const uint64_t vocab = static_cast<uint64_t>(vocab_size);
  bool hit = version_ == kShardVersionU16
                 ? scan_for_out_of_range(reinterpret_cast<const uint16_t*>(tokens), token_count_, vocab, found)
                 : scan_for_out_of_range(reinterpret_cast<const uint32_t*>(tokens), token_count_, vocab, found);
  if (hit) found->byte_offset = kShardHeaderBytes + found->index * shard_token_bytes(version_);
  return hit;
}

void ShardReader::validate_vocab(int64_t vocab_size) const {
  OutOfRangeToken bad;
  if (!find_token_at_or_above(vocab_size, &bad)) return;
  std::string what = strf("%s: token %lld (byte offset %lld) has id %u, not below the model's vocab size %lld",
                          path_.c_str(), static_cast<long long>(bad.index), static_cast<long long>(bad.byte_offset),
                          bad.value, static_cast<long long>(vocab_size));
  std::string directory = parent_directory(path_);
  std::string advice;
  if (std::optional<CorpusMeta> meta = find_corpus_meta(directory)) {
    advice = strf("these shards were made by the '%s' tokenizer (vocab %lld, per %s/meta.json): set model.vocab_size "
                  "to %lld, or re-run mxtrain prepare with --tokenizer set to the model's tokenizer",
                  meta->tokenizer.c_str(), static_cast<long long>(meta->vocab_size), directory.c_str(),
                  static_cast<long long>(std::max<int64_t>(meta->vocab_size, int64_t{bad.max_value} + 1)));
  } else {
    advice = strf("the shard holds ids up to %u: set model.vocab_size to at least %lld (the vocabulary of the "
                  "tokenizer that made it), or re-run mxtrain prepare with --tokenizer set to the model's tokenizer",
                  bad.max_value, static_cast<long long>(bad.max_value) + 1);
  }
  throw Error(ErrorKind::data, what, advice);
}

}  // namespace mxtrain::data
