// prepare over documents: a .jsonl, a .jsonl.zst and the same documents as text files give the
// same shards byte for byte; bad lines, missing fields, damaged zstd and parquet are errors that
// name the file (and line) before anything is written.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#ifdef MXTRAIN_HAVE_ZSTD
#include <zstd.h>
#endif

#include "data/data_test_helpers.hpp"
#include "mxtrain/data/prepare.hpp"
#include "support/test_support.hpp"

namespace mxtrain::data {
namespace {

namespace fs = std::filesystem;

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<std::string> documents() {
  std::vector<std::string> docs;
  uint32_t state = 17;
  for (int d = 0; d < 40; ++d) {
    std::string text;
    const int length = 200 + (d * 977) % 1500;
    for (int i = 0; i < length; ++i) {
      state = state * 1664525u + 1013904223u;
      const uint32_t pick = (state >> 24) % 30;
      text.push_back(pick < 26 ? static_cast<char>('a' + pick) : pick < 28 ? ' ' : pick == 28 ? '\n' : '"');
    }
    docs.push_back(text);
  }
  docs.push_back("unicode \xC3\xA9\xE2\x82\xAC and a tab\t");
  return docs;
}

PrepareResult prepare(const std::vector<std::string>& inputs, const std::string& out, int threads = 0) {
  PrepareOptions options;
  options.output_dir = out;
  options.input_files = inputs;
  options.val_fraction = 0.25;
  options.threads = threads;
  return prepare_corpus(options);
}

std::string jsonl(const std::vector<std::string>& docs) {
  std::string text;
  for (const std::string& doc : docs) text += nlohmann::json{{"id", 1}, {"text", doc}}.dump() + "\n\n";
  return text;
}

void expect_same_shards(const PrepareResult& a, const PrepareResult& b) {
  ASSERT_EQ(a.train_shards.size(), b.train_shards.size());
  ASSERT_EQ(a.val_shards.size(), b.val_shards.size());
  for (size_t i = 0; i < a.train_shards.size(); ++i)
    EXPECT_EQ(read_bytes(a.train_shards[i].path), read_bytes(b.train_shards[i].path));
  for (size_t i = 0; i < a.val_shards.size(); ++i)
    EXPECT_EQ(read_bytes(a.val_shards[i].path), read_bytes(b.val_shards[i].path));
  EXPECT_EQ(a.documents, b.documents);
}

TEST(PrepareDocuments, JsonlAndTextFilesGiveTheSameShards) {
  test::TempDir dir;
  const std::vector<std::string> docs = documents();
  std::vector<std::string> text_files;
  for (size_t i = 0; i < docs.size(); ++i) {
    text_files.push_back(dir.file("doc" + std::to_string(i) + ".txt"));
    data_test::write_text_file(text_files.back(), docs[i]);
  }
  data_test::write_text_file(dir.file("docs.jsonl"), jsonl(docs));
  const PrepareResult from_text = prepare(text_files, dir.file("text"));
  const PrepareResult from_jsonl = prepare({dir.file("docs.jsonl")}, dir.file("jsonl"), 1);
  EXPECT_EQ(from_text.documents, static_cast<int64_t>(docs.size()));
  expect_same_shards(from_text, from_jsonl);
  // One document a line, whichever file it is in.
  const std::vector<std::string> first(docs.begin(), docs.begin() + 10), rest(docs.begin() + 10, docs.end());
  data_test::write_text_file(dir.file("a.jsonl"), jsonl(first));
  data_test::write_text_file(dir.file("b.jsonl"), jsonl(rest));
  expect_same_shards(from_text, prepare({dir.file("a.jsonl"), dir.file("b.jsonl")}, dir.file("split")));
}

#ifdef MXTRAIN_HAVE_ZSTD
std::string zstd_compress(const std::string& text) {
  std::string out(ZSTD_compressBound(text.size()), '\0');
  const size_t size = ZSTD_compress(out.data(), out.size(), text.data(), text.size(), 3);
  EXPECT_FALSE(ZSTD_isError(size));
  out.resize(size);
  return out;
}

TEST(PrepareDocuments, JsonlZstGivesTheSameShardsAsJsonl) {
  test::TempDir dir;
  const std::string text = jsonl(documents());
  data_test::write_text_file(dir.file("docs.jsonl"), text);
  data_test::write_text_file(dir.file("docs.jsonl.zst"), zstd_compress(text));
  expect_same_shards(prepare({dir.file("docs.jsonl")}, dir.file("plain")),
                     prepare({dir.file("docs.jsonl.zst")}, dir.file("zst")));
  // A truncated stream is an error naming the file, and nothing is written.
  const std::string compressed = zstd_compress(text);
  data_test::write_text_file(dir.file("cut.jsonl.zst"), compressed.substr(0, compressed.size() / 2));
  const std::string message =
      data_test::error_text([&] { prepare({dir.file("cut.jsonl.zst")}, dir.file("cut")); });
  EXPECT_CONTAINS(message, dir.file("cut.jsonl.zst"));
  EXPECT_FALSE(fs::exists(dir.file("cut") + "/meta.json"));
}
#endif

TEST(PrepareDocuments, BadLinesNameTheFileAndLine) {
  test::TempDir dir;
  data_test::write_text_file(dir.file("bad.jsonl"), "{\"text\": \"fine\"}\n\n[1, 2]\n");
  EXPECT_CONTAINS(data_test::error_text([&] { prepare({dir.file("bad.jsonl")}, dir.file("o1")); }),
                  dir.file("bad.jsonl") + " line 3 is not a JSON object");
  data_test::write_text_file(dir.file("field.jsonl"), "{\"content\": \"x\"}\n");
  const std::string missing = data_test::error_text([&] { prepare({dir.file("field.jsonl")}, dir.file("o2")); });
  EXPECT_CONTAINS(missing, "line 1 has no field \"text\"; its string fields: \"content\"");
  EXPECT_CONTAINS(missing, "name the field that holds the text (here content): mxtrain prepare --field NAME");
  EXPECT_CONTAINS(missing, "text-field hyperparameter");
  data_test::write_text_file(dir.file("type.jsonl"), "{\"text\": 5, \"id\": \"a\", \"body\": \"b\"}\n");
  const std::string type = data_test::error_text([&] { prepare({dir.file("type.jsonl")}, dir.file("o3")); });
  EXPECT_CONTAINS(type, "field \"text\" is not a string; its string fields: \"body\", \"id\"");
  EXPECT_EQ(type.find("(here"), std::string::npos) << type;  // two candidates: no guess
  data_test::write_text_file(dir.file("none.jsonl"), "{\"n\": 1}\n");
  EXPECT_CONTAINS(data_test::error_text([&] { prepare({dir.file("none.jsonl")}, dir.file("o5")); }),
                  "has no field \"text\"; it has no string field");
  data_test::write_text_file(dir.file("data.parquet"), "PAR1");
  const std::string parquet = data_test::error_text([&] { prepare({dir.file("data.parquet")}, dir.file("o4")); });
  EXPECT_CONTAINS(parquet, "scripts/parquet_to_jsonl.py");
  EXPECT_FALSE(fs::exists(dir.file("o4")));
}

}  // namespace
}  // namespace mxtrain::data
