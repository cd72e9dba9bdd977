// Tokenizers turn text into token ids and back: the byte-level one (vocab 256, id = byte value,
// lossless on any input), Hugging Face byte-level BPE (bpe_tokenizer.hpp: GPT-2, Llama 3) and
// sentencepiece (sentencepiece_tokenizer.hpp: Llama 2, TinyLlama), behind one small interface
// that prepare, the shards and the loader use.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
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
  // The beginning- and end-of-sequence tokens, where the tokenizer has them. encode() adds
  // neither: where documents meet, prepare puts the end-of-document token (EOS) itself.
  virtual std::optional<int32_t> bos_id() const { return std::nullopt; }
  virtual std::optional<int32_t> eos_id() const { return std::nullopt; }
};

// Bytes are tokens: lossless, no vocabulary file, vocab 256.
class ByteTokenizer final : public Tokenizer {
 public:
  std::string name() const override { return "byte"; }
  int64_t vocab_size() const override { return 256; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> tokens) const override;
};

// The tokenizer file a model directory holds: its tokenizer.json (the file Hugging Face's fast
// tokenizers load), else its tokenizer.model; the tokenizer.model first when the tokenizer.json is
// that sentencepiece model converted (Llama 2, Mistral, TinyLlama: mxtrain reads the sentencepiece
// original exactly, not the conversion). Empty when it has neither or is no directory.
std::string tokenizer_file_in(const std::string& dir);
// The built-in names make_tokenizer accepts ("byte").
std::vector<std::string> tokenizer_names();
// `name` is "byte", a Hugging Face tokenizer.json (byte-level BPE), a sentencepiece .model file,
// or a directory holding one of the two (a Hugging Face model directory). Throws Error(config)
// saying what is accepted when it is none of them, Error(data) when the file is damaged.
std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name);

// Decoded text made safe for a log line: control bytes other than newline and tab become \xNN.
std::string printable_text(std::string_view text);

}  // namespace mxtrain::data
