// The byte tokenizer is the identity on bytes; unknown tokenizer names are a config error.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "data/data_test_helpers.hpp"
#include "mxtrain/data/bpe_tokenizer.hpp"
#include "mxtrain/data/tokenizer.hpp"
#include "support/test_support.hpp"

namespace mxtrain::data {
namespace {

TEST(ByteTokenizer, EveryByteIsItsOwnTokenAndDecodeInverts) {
  ByteTokenizer tokenizer;
  EXPECT_EQ(tokenizer.name(), "byte");
  EXPECT_EQ(tokenizer.vocab_size(), 256);
  std::string all_bytes;
  for (int value = 0; value < 256; ++value) all_bytes.push_back(static_cast<char>(value));
  std::vector<int32_t> tokens = tokenizer.encode(all_bytes);
  ASSERT_EQ(tokens.size(), 256u);
  for (int value = 0; value < 256; ++value) EXPECT_EQ(tokens[static_cast<size_t>(value)], value);
  EXPECT_EQ(tokenizer.decode(tokens), all_bytes);
  EXPECT_EQ(tokenizer.encode("Hé"), (std::vector<int32_t>{72, 0xC3, 0xA9}));
  EXPECT_EQ(tokenizer.decode(std::vector<int32_t>{72, 300, 105}), "H\xEF\xBF\xBDi");
}

TEST(Tokenizer, FactoryKnowsByteAndRejectsOthers) {
  std::unique_ptr<Tokenizer> tokenizer = make_tokenizer("byte");
  EXPECT_EQ(tokenizer->vocab_size(), 256);
  EXPECT_EQ(tokenizer_names(), std::vector<std::string>{"byte"});
  std::string text = data_test::error_text([] { make_tokenizer("gpt2"); }, ErrorKind::config);
  EXPECT_CONTAINS(text, "unknown tokenizer 'gpt2'");
  EXPECT_CONTAINS(text, "use byte, a tokenizer.json (Hugging Face byte-level BPE), a sentencepiece .model file");
  // A path that is not there is said to be missing, not unknown.
  for (const char* missing : {"/nonexistent/tokenizer.json", "models/missing", "tok.model"}) {
    text = data_test::error_text([&] { make_tokenizer(missing); }, ErrorKind::config);
    EXPECT_CONTAINS(text, std::string("tokenizer '") + missing + "' does not exist");
  }
}

// A model directory's tokenizer is its tokenizer.json, else its tokenizer.model; make_tokenizer,
// generate and the SageMaker job all ask tokenizer_file_in.
TEST(Tokenizer, AModelDirectoryOffersItsTokenizerJsonFirst) {
  namespace fs = std::filesystem;
  test::TempDir dir;
  EXPECT_EQ(tokenizer_file_in(dir.path()), "");
  EXPECT_EQ(tokenizer_file_in(dir.file("missing")), "");
  std::string text = data_test::error_text([&] { make_tokenizer(dir.path()); }, ErrorKind::config);
  EXPECT_CONTAINS(text, "holds neither tokenizer.json nor tokenizer.model");
  data_test::write_text_file(dir.file("tokenizer.model"), "not a sentencepiece model");
  EXPECT_EQ(tokenizer_file_in(dir.path()), dir.file("tokenizer.model"));
  fs::copy_file(test::source_dir() + "/tests/fuzz/corpus/tokenizer/bpe300.json", dir.file("tokenizer.json"));
  EXPECT_EQ(tokenizer_file_in(dir.path()), dir.file("tokenizer.json"));
  EXPECT_EQ(tokenizer_file_in(dir.file("tokenizer.json")), "");  // a file is no model directory
#if MXTRAIN_HAVE_PCRE2
  EXPECT_EQ(make_tokenizer(dir.path())->vocab_size(), make_tokenizer(dir.file("tokenizer.json"))->vocab_size());
#endif
  // A sentencepiece model converted to tokenizer.json (Llama 2's layout: BPE with byte fallback,
  // or a Metaspace pre-tokenizer) gives way to the tokenizer.model beside it; alone, it is refused
  // naming what to give instead.
  for (const char* converted :
       {R"({"model": {"type": "BPE", "byte_fallback": true, "vocab": {}, "merges": []}})",
        R"({"pre_tokenizer": {"type": "Metaspace", "replacement": "\u2581"}, "model": {"type": "BPE", "vocab": {}}})",
        R"({"normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend"}]},
            "decoder": {"type": "Sequence", "decoders": [{"type": "ByteFallback"}]}, "model": {"type": "BPE"}})",
        R"({"model": {"type": "Unigram", "vocab": []}})"}) {
    data_test::write_text_file(dir.file("tokenizer.json"), converted);
    EXPECT_TRUE(is_converted_sentencepiece(dir.file("tokenizer.json"))) << converted;
    EXPECT_EQ(tokenizer_file_in(dir.path()), dir.file("tokenizer.model")) << converted;
    text = data_test::error_text([&] { BpeTokenizer tokenizer(dir.file("tokenizer.json")); });
    EXPECT_CONTAINS(text, "is a sentencepiece tokenizer converted to tokenizer.json");
    EXPECT_CONTAINS(text, "give the sentencepiece model beside it, " + dir.file("tokenizer.model"));
  }
  fs::remove(dir.file("tokenizer.model"));
  EXPECT_EQ(tokenizer_file_in(dir.path()), dir.file("tokenizer.json"));
  text = data_test::error_text([&] { make_tokenizer(dir.path()); });
  EXPECT_CONTAINS(text, "give the model's sentencepiece tokenizer.model");
  data_test::write_text_file(dir.file("tokenizer.json"), "{\"model\": ");  // damaged: not taken for converted
  EXPECT_FALSE(is_converted_sentencepiece(dir.file("tokenizer.json")));
  EXPECT_FALSE(is_converted_sentencepiece(dir.file("missing.json")));
  EXPECT_FALSE(is_converted_sentencepiece(test::source_dir() + "/tests/fuzz/corpus/tokenizer/bpe300.json"));
}

TEST(Tokenizer, PrintableTextEscapesControlBytes) {
  EXPECT_EQ(printable_text(std::string("a\nb\tc\x01\x7f", 7)), "a\nb\tc\\x01\\x7f");
}

}  // namespace
}  // namespace mxtrain::data
