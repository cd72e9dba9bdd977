// Tokenizers turn text into token ids and back. A tokenizer is a small interface so that the
// byte-level one (vocab 256, id = byte value, lossless on any input) can be joined by others
// (e.g. GPT-2 BPE) without touching prepare, the shards or the loader.
#pragma once
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mxtrain::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // The name `mxtrain prepare --tokenizer` and meta.json use.
  virtual std::string name() const = 0;
  // Every id encode() produces lies in [0, vocab_size()).
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Inverse of encode(); ids outside the vocabulary decode to U+FFFD.
  virtual std::string decode(std::span<const int32_t> tokens) const = 0;
};

// Bytes are tokens: lossless, no vocabulary file, vocab 256.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> tokens) const override;
};

// The names make_tokenizer accepts.
std::vector<std::string> tokenizer_names();
// Throws Error(config) listing the known names when `name` is not one of them.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name);

// Decoded text made safe for a log line: control bytes other than newline and tab become \xNN.
std::string printable_text(std::string_view text);

}  // namespace mxtrain::data
