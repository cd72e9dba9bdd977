// A tokenizer.json's ids are one text each and bounded (found by the tokenizer fuzz target,
// tests/fuzz): two texts sharing an id decoded one as the other, and a stray huge id sized a
// table of that many entries.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/data/bpe_tokenizer.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

// The committed fuzz seed: a 300-token byte-level BPE trained by Hugging Face tokenizers.
nlohmann::json seed_tokenizer() {
  return nlohmann::json::parse(test::read_file(test::source_dir() + "/tests/fuzz/corpus/tokenizer/bpe300.json"));
}

std::string load_error(const std::string& text) {
  test::TempDir dir;
  std::ofstream(dir.file("tokenizer.json")) << text;
  try {
    data::BpeTokenizer loaded(dir.file("tokenizer.json"));
  } catch (const Error& error) {
    return error.full_message();
  }
  return "";
}

std::string load_error(const nlohmann::json& tokenizer) { return load_error(tokenizer.dump()); }

TEST(TokenizerIds, SeedLoads) {
#if !MXTRAIN_HAVE_PCRE2
  GTEST_SKIP() << "built without PCRE2";
#endif
  EXPECT_EQ(load_error(seed_tokenizer()), "");
}

TEST(TokenizerIds, TwoTextsWithOneIdAreRefused) {
#if !MXTRAIN_HAVE_PCRE2
  GTEST_SKIP() << "built without PCRE2";
#endif
  nlohmann::json tokenizer = seed_tokenizer();
  tokenizer["model"]["vocab"]["!"] = tokenizer["model"]["vocab"]["\""];
  EXPECT_NE(load_error(tokenizer).find("model.vocab gives id 2 to both"), std::string::npos) << load_error(tokenizer);
  tokenizer = seed_tokenizer();
  tokenizer["added_tokens"][0]["id"] = 5;  // "<|endoftext|>" onto the id of "%"
  EXPECT_NE(load_error(tokenizer).find("added token '<|endoftext|>' has id 5, which is '%' already"), std::string::npos)
      << load_error(tokenizer);
}

TEST(TokenizerIds, IdsBeyondTheLargestVocabularyAreRefused) {
#if !MXTRAIN_HAVE_PCRE2
  GTEST_SKIP() << "built without PCRE2";
#endif
  nlohmann::json tokenizer = seed_tokenizer();
  tokenizer["model"]["vocab"]["zzz"] = 20000000;
  EXPECT_NE(load_error(tokenizer).find("not an integer from 0 to 16,777,215"), std::string::npos) << load_error(tokenizer);
}

// A file cut short (a download that stopped) is named as such, with the parser's line and column.
TEST(TokenizerIds, ATruncatedFileSaysWhereItEnds) {
#if !MXTRAIN_HAVE_PCRE2
  GTEST_SKIP() << "built without PCRE2";
#endif
  const std::string text = seed_tokenizer().dump(1);
  const std::string message = load_error(text.substr(0, text.size() / 2));
  EXPECT_NE(message.find("is not valid JSON (parse error at line "), std::string::npos) << message;
  EXPECT_NE(message.find("cut short"), std::string::npos) << message;
  EXPECT_EQ(message.find("[json.exception"), std::string::npos) << message;
}

}  // namespace
}  // namespace mxtrain
