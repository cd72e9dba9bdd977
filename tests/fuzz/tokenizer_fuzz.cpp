// tokenizer.json (data/bpe_tokenizer): an accepted tokenizer must encode text to ids below its
// vocabulary size and decode them back to the same text.
#include "fuzz_support.hpp"
#include "mxtrain/data/bpe_tokenizer.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxtrain;
  const std::string path = fuzz::write_input("tokenizer.json", data, size);
  return fuzz::run_one([&] {
    data::BpeTokenizer tokenizer(path);
    const std::string text = "Hello, world! It's 2026: caf\xc3\xa9 \xe2\x82\xac 42\n\tend";
    const std::vector<int32_t> ids = tokenizer.encode(text);
    for (int32_t id : ids) fuzz::require(id >= 0 && id < tokenizer.vocab_size(), "token id outside the vocabulary");
    fuzz::require(tokenizer.decode(ids) == text, "decode(encode(text)) != text");
  });
}
