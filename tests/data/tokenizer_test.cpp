// The byte tokenizer is the identity on bytes; unknown tokenizer names are a config error.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

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

// Qwen2's normalizer: each segment between added tokens is put in Unicode NFC before it is
// split, so a decomposed accent encodes as the composed one; bytes that are not UTF-8 pass
// through. Other normalizers, and added tokens matched in normalized text, are refused by name.
// (tests/data/tokenizer_reference.py checks the ids against PyPI tokenizers'.)
TEST(Tokenizer, AnNfcNormalizerComposesTheTextFirst) {
#ifndef MXTRAIN_HAVE_UTF8PROC
  GTEST_SKIP() << "built without utf8proc";
#else
  test::TempDir dir;
  std::ifstream in(test::source_dir() + "/tests/fuzz/corpus/tokenizer/bpe300.json");
  const nlohmann::json plain = nlohmann::json::parse(in);
  auto write = [&](const nlohmann::json& normalizer, bool normalized_added = false) {
    nlohmann::json file = plain;
    file["normalizer"] = normalizer;
    if (normalized_added) file["added_tokens"][0]["normalized"] = true;
    data_test::write_text_file(dir.file("tokenizer.json"), file.dump());
    return dir.file("tokenizer.json");
  };
  const std::string composed = "Caf\xC3\xA9 \xC3\x85", decomposed = "Cafe\xCC\x81 A\xCC\x8A";
  {
    BpeTokenizer without(write(nullptr));
    EXPECT_NE(without.encode(composed), without.encode(decomposed));  // the normalizer is what makes them equal
  }
  for (const nlohmann::json& normalizer :
       {nlohmann::json{{"type", "NFC"}},
        nlohmann::json{{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFC"}}}}}}) {
    BpeTokenizer nfc(write(normalizer));
    EXPECT_EQ(nfc.encode(decomposed), nfc.encode(composed)) << normalizer.dump();
    EXPECT_EQ(nfc.decode(nfc.encode(decomposed)), composed);
    // The Angstrom sign's canonical form is the letter; a stray byte stays, the text around it
    // is still composed; an added token is cut out first, the mark after it composes with nothing.
    EXPECT_EQ(nfc.decode(nfc.encode("\xE2\x84\xAB")), "\xC3\x85");
    const std::string stray = "e\xCC\x81\xFF" + decomposed;
    EXPECT_EQ(nfc.decode(nfc.encode(stray)), "\xC3\xA9\xFF" + composed);
    const std::vector<int32_t> ids = nfc.encode("a<|endoftext|>\xCC\x81");
    ASSERT_GE(ids.size(), 2u);
    EXPECT_EQ(ids[1], 0);
    EXPECT_EQ(nfc.decode(ids), "a<|endoftext|>\xCC\x81");
  }
  std::string text = data_test::error_text([&] { BpeTokenizer tokenizer(write({{"type", "Lowercase"}})); });
  EXPECT_CONTAINS(text, "normalizer 'Lowercase' is set (of the normalizers, NFC is reproduced)");
  text = data_test::error_text([&] {
    BpeTokenizer tokenizer(write({{"type", "Sequence"}, {"normalizers", {{{"type", "NFC"}}, {{"type", "NFKC"}}}}}));
  });
  EXPECT_CONTAINS(text, "normalizer 'NFKC'");
  text = data_test::error_text([&] { BpeTokenizer tokenizer(write({{"type", "NFC"}}, true)); });
  EXPECT_CONTAINS(text, "added token '<|endoftext|>' is normalized = true under a normalizer");
#endif
}

TEST(Tokenizer, PrintableTextEscapesControlBytes) {
  EXPECT_EQ(printable_text(std::string("a\nb\tc\x01\x7f", 7)), "a\nb\tc\\x01\\x7f");
}

}  // namespace
}  // namespace mxtrain::data
