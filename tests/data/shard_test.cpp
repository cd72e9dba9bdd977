// Token shards: both versions round-trip, and every corruption is reported with the file name,
// the byte offset and what was found, as documented in shard.hpp.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <vector>

#include "data/data_test_helpers.hpp"
#include "mxtrain/data/corpus_meta.hpp"
#include "mxtrain/data/shard.hpp"
#include "support/test_support.hpp"

namespace mxtrain::data {
namespace {

using data_test::error_text;

std::vector<int32_t> counting_tokens(int64_t count, int64_t modulus, int64_t stride = 7) {
  std::vector<int32_t> tokens(static_cast<size_t>(count));
  for (int64_t i = 0; i < count; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * stride) % modulus);
  return tokens;
}

TEST(Shard, VersionFollowsVocabulary) {
  EXPECT_EQ(shard_version_for_vocab(256), 1);
  EXPECT_EQ(shard_version_for_vocab(65536), 1);  // ids 0..65535 fit in uint16
  EXPECT_EQ(shard_version_for_vocab(65537), 2);
  EXPECT_EQ(shard_version_for_vocab(128256), 2);
}

TEST(Shard, RoundTripUint16) {
  test::TempDir dir;
  std::vector<int32_t> tokens = counting_tokens(3 * 1000 * 1000 + 17, 50257);  // crosses the 1 MiB write buffer
  tokens[5] = 65535;
  write_shard(dir.file("a.bin"), tokens, 65536);
  EXPECT_EQ(std::filesystem::file_size(dir.file("a.bin")), 1024 + 2 * tokens.size());
  ShardReader reader(dir.file("a.bin"));
  EXPECT_EQ(reader.version(), 1);
  EXPECT_EQ(reader.token_count(), static_cast<int64_t>(tokens.size()));
  EXPECT_EQ(reader.read_all(), tokens);
  EXPECT_EQ(reader.token(5), 65535u);
  std::vector<int32_t> middle(10);
  reader.read_tokens(1000, 10, middle.data());
  EXPECT_EQ(middle, std::vector<int32_t>(tokens.begin() + 1000, tokens.begin() + 1010));
  EXPECT_FALSE(std::filesystem::exists(dir.file("a.bin.tmp")));
}

TEST(Shard, RoundTripUint32) {
  test::TempDir dir;
  std::vector<int32_t> tokens = counting_tokens(100003, 128256, 40009);
  tokens[0] = 128255;
  tokens[1] = 65536;
  write_shard(dir.file("b.bin"), tokens, 128256);
  EXPECT_EQ(std::filesystem::file_size(dir.file("b.bin")), 1024 + 4 * tokens.size());
  ShardReader reader(dir.file("b.bin"));
  EXPECT_EQ(reader.version(), 2);
  EXPECT_EQ(reader.read_all(), tokens);
  reader.validate_vocab(128256);  // nothing out of range
}

TEST(Shard, ReadsLlmcVersion7Shards) {
  // llm.c's current scripts: magic 20240801, version 7, uint32 tokens after the 1024-byte header.
  test::TempDir dir;
  std::vector<int32_t> tokens = counting_tokens(5000, 128256, 40009);
  write_shard(dir.file("llmc.bin"), tokens, 128256);
  data_test::overwrite_int32(dir.file("llmc.bin"), 0, 20240801);
  data_test::overwrite_int32(dir.file("llmc.bin"), 4, 7);
  ShardReader reader(dir.file("llmc.bin"));
  EXPECT_EQ(reader.token_count(), 5000);
  EXPECT_EQ(reader.read_all(), tokens);
  // That magic with any other version is refused.
  data_test::overwrite_int32(dir.file("llmc.bin"), 4, 2);
  std::string text = error_text([&] { ShardReader refused(dir.file("llmc.bin")); });
  EXPECT_CONTAINS(text, "unknown shard version 2 at byte offset 4 for magic 20240801");
}

TEST(Shard, HeaderIsLlmcLayout) {
  test::TempDir dir;
  write_shard(dir.file("c.bin"), std::vector<int32_t>{1, 2, 3}, 256);
  std::string bytes = data_test::read_text_file(dir.file("c.bin"));
  ASSERT_EQ(bytes.size(), 1024u + 6u);
  auto int32_at = [&](size_t offset) {
    int32_t value;
    std::memcpy(&value, bytes.data() + offset, 4);
    return value;
  };
  EXPECT_EQ(int32_at(0), 20240520);
  EXPECT_EQ(int32_at(4), 1);
  EXPECT_EQ(int32_at(8), 3);
  for (size_t offset = 12; offset < 1024; offset += 4) ASSERT_EQ(int32_at(offset), 0) << offset;
  EXPECT_EQ(static_cast<unsigned char>(bytes[1024]), 1);
  EXPECT_EQ(static_cast<unsigned char>(bytes[1026]), 2);
}

TEST(Shard, EmptyShardRoundTrips) {
  test::TempDir dir;
  write_shard(dir.file("e.bin"), std::vector<int32_t>{}, 256);
  ShardReader reader(dir.file("e.bin"));
  EXPECT_EQ(reader.token_count(), 0);
}

TEST(ShardWriter, NothingAppearsBeforeFinishAndAbandonedWritesLeaveNothing) {
  test::TempDir dir;
  {
    ShardWriter writer(dir.file("d.bin"), 256);
    writer.append(std::vector<int32_t>{4, 5, 6});
    writer.seal();
    EXPECT_FALSE(std::filesystem::exists(dir.file("d.bin")));
    EXPECT_EQ(std::filesystem::file_size(dir.file("d.bin.tmp")), 1024u + 6u);
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.bin")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.bin.tmp")));

  ShardWriter writer(dir.file("d.bin"), 256);
  writer.append(std::vector<int32_t>{4, 5});
  writer.append(std::vector<int32_t>{6});
  writer.seal();
  writer.finish();
  EXPECT_EQ(ShardReader(dir.file("d.bin")).read_all(), (std::vector<int32_t>{4, 5, 6}));
  EXPECT_FALSE(std::filesystem::exists(dir.file("d.bin.tmp")));
}

TEST(ShardWriter, RewritingReplacesTheOldFile) {
  test::TempDir dir;
  write_shard(dir.file("r.bin"), counting_tokens(1000, 256), 256);
  write_shard(dir.file("r.bin"), std::vector<int32_t>{9, 8}, 256);
  EXPECT_EQ(ShardReader(dir.file("r.bin")).read_all(), (std::vector<int32_t>{9, 8}));
}

TEST(ShardReader, MissingFile) {
  test::TempDir dir;
  std::string text = error_text([&] { ShardReader reader(dir.file("nope.bin")); });
  EXPECT_CONTAINS(text, dir.file("nope.bin"));
  EXPECT_CONTAINS(text, "No such file");
}

TEST(ShardReader, BadMagic) {
  test::TempDir dir;
  write_shard(dir.file("m.bin"), counting_tokens(10, 256), 256);
  data_test::overwrite_int32(dir.file("m.bin"), 0, 12345);
  std::string text = error_text([&] { ShardReader reader(dir.file("m.bin")); });
  EXPECT_CONTAINS(text, dir.file("m.bin") + ": bad magic number 12345 at byte offset 0");
  EXPECT_CONTAINS(text, "20240520");
  EXPECT_CONTAINS(text, "fix: ");
  EXPECT_CONTAINS(text, "mxtrain prepare");
}

TEST(ShardReader, UnknownVersion) {
  test::TempDir dir;
  write_shard(dir.file("v.bin"), counting_tokens(10, 256), 256);
  data_test::overwrite_int32(dir.file("v.bin"), 4, 7);
  std::string text = error_text([&] { ShardReader reader(dir.file("v.bin")); });
  EXPECT_CONTAINS(text, dir.file("v.bin") + ": unknown shard version 7 at byte offset 4");
  EXPECT_CONTAINS(text, "re-run mxtrain prepare");
}

TEST(ShardReader, Truncated) {
  test::TempDir dir;
  write_shard(dir.file("t.bin"), counting_tokens(100, 256), 256);
  std::filesystem::resize_file(dir.file("t.bin"), 1024 + 150);
  std::string text = error_text([&] { ShardReader reader(dir.file("t.bin")); });
  EXPECT_CONTAINS(text, dir.file("t.bin") + ": truncated: the header says 100 tokens, which need 200 bytes from "
                                                  "byte offset 1024, but the file has 150");
  EXPECT_CONTAINS(text, "re-run mxtrain prepare");
}

TEST(ShardReader, TrailingBytes) {
  test::TempDir dir;
  write_shard(dir.file("x.bin"), counting_tokens(100, 256), 256);
  std::filesystem::resize_file(dir.file("x.bin"), 1024 + 203);
  std::string text = error_text([&] { ShardReader reader(dir.file("x.bin")); });
  EXPECT_CONTAINS(text, dir.file("x.bin") + ": 3 unexpected bytes at byte offset 1224");
}

TEST(ShardReader, ShorterThanHeader) {
  test::TempDir dir;
  data_test::write_text_file(dir.file("s.bin"), std::string(500, 'x'));
  std::string text = error_text([&] { ShardReader reader(dir.file("s.bin")); });
  EXPECT_CONTAINS(text, dir.file("s.bin") + ": file is 500 bytes, shorter than the 1024-byte shard header");
  EXPECT_CONTAINS(text, "byte offset 500");
}

TEST(ShardReader, TokenOutOfRangeNamesIndexOffsetValueAndVocab) {
  test::TempDir dir;
  std::vector<int32_t> tokens = counting_tokens(200000, 256);
  tokens[70001] = 700;   // first bad one, in the second scan block
  tokens[150000] = 900;  // largest, later
  write_shard(dir.file("o.bin"), tokens, 1000);
  ShardReader reader(dir.file("o.bin"));
  OutOfRangeToken found;
  ASSERT_TRUE(reader.find_token_at_or_above(256, &found));
  EXPECT_EQ(found.index, 70001);
  EXPECT_EQ(found.byte_offset, 1024 + 2 * 70001);
  EXPECT_EQ(found.value, 700u);
  EXPECT_EQ(found.max_value, 900u);
  EXPECT_FALSE(reader.find_token_at_or_above(901, &found));

  std::string text = error_text([&] { reader.validate_vocab(256); });
  EXPECT_CONTAINS(text, dir.file("o.bin") + ": token 70001 (byte offset 141026) has id 700, not below the "
                                                  "model's vocab size 256");
  EXPECT_CONTAINS(text, "set model.vocab_size to at least 901");
  reader.validate_vocab(901);
}

TEST(ShardReader, TokenOutOfRangeAdviceNamesTheTokenizerFromMeta) {
  test::TempDir dir;
  write_shard(dir.file("train_000000.bin"), std::vector<int32_t>{1, 70000, 3}, 100000);
  CorpusMeta meta;
  meta.tokenizer = "wordpiece";
  meta.vocab_size = 100000;
  data_test::write_text_file(dir.file("meta.json"), corpus_meta_to_json(meta).dump());
  std::string text = error_text([&] { ShardReader(dir.file("train_000000.bin")).validate_vocab(32000); });
  EXPECT_CONTAINS(text, "token 1 (byte offset 1028) has id 70000");
  EXPECT_CONTAINS(text, "'wordpiece' tokenizer (vocab 100000");
  EXPECT_CONTAINS(text, "set model.vocab_size to 100000");
}

}  // namespace
}  // namespace mxtrain::data
