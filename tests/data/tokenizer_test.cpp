// The byte tokenizer is the identity on bytes; unknown tokenizer names are a config error.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data/data_test_helpers.hpp"
#include "mxtrain/data/tokenizer.hpp"

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

TEST(Tokenizer, PrintableTextEscapesControlBytes) {
  EXPECT_EQ(printable_text(std::string("a\nb\tc\x01\x7f", 7)), "a\nb\tc\\x01\\x7f");
}

}  // namespace
}  // namespace mxtrain::data
