// A sentencepiece `tokenizer.model` (Llama 2, TinyLlama, Mistral), through the sentencepiece
// library itself (Debian's libsentencepiece-dev): its normalisation, byte fallback and merge
// rules are the library's, so ids equal the Python package's. encode() adds no BOS/EOS.
#pragma once
#include <memory>
#include <string>

#include "mxtrain/data/tokenizer.hpp"

namespace mxtrain::data {

class SentencepieceTokenizer final : public Tokenizer {
 public:
  // Loads `path`; throws Error(data) when the library cannot read it, Error(unsupported) when
  // mxtrain was built without the library.
  explicit SentencepieceTokenizer(const std::string& path);
  ~SentencepieceTokenizer() override;

  std::string name() const override { return path_; }
  int64_t vocab_size() const override;
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> tokens) const override;
  std::optional<int32_t> bos_id() const override;
  std::optional<int32_t> eos_id() const override;

 private:
  struct Processor;
  std::string path_;
  std::unique_ptr<Processor> processor_;
};

}  // namespace mxtrain::data
