#include "mxtrain/data/sentencepiece_tokenizer.hpp"

#include "mxtrain/core/error.hpp"

#ifdef MXTRAIN_HAVE_SENTENCEPIECE
#include <sentencepiece_processor.h>
#endif

namespace mxtrain::data {

#ifdef MXTRAIN_HAVE_SENTENCEPIECE
struct SentencepieceTokenizer::Processor {
  sentencepiece::SentencePieceProcessor library;
};

SentencepieceTokenizer::SentencepieceTokenizer(const std::string& path)
    : path_(path), processor_(std::make_unique<Processor>()) {
  const auto status = processor_->library.Load(path);
  if (!status.ok())
    throw Error(ErrorKind::data, "tokenizer " + path + ": sentencepiece cannot load it: " + status.ToString(),
                "the file is damaged or not a sentencepiece model; copy it again from the model's directory");
}

SentencepieceTokenizer::~SentencepieceTokenizer() = default;

int64_t SentencepieceTokenizer::vocab_size() const { return processor_->library.GetPieceSize(); }

std::vector<int32_t> SentencepieceTokenizer::encode(std::string_view text) const {
  std::vector<int> ids;
  const auto status = processor_->library.Encode(text, &ids);
  if (!status.ok()) throw Error(ErrorKind::data, "sentencepiece cannot encode a text: " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencepieceTokenizer::decode(std::span<const int32_t> tokens) const {
  std::vector<int> ids;
  ids.reserve(tokens.size());
  const int64_t size = vocab_size();
  std::string text;
  auto flush = [&] {
    std::string piece;
    if (!ids.empty() && processor_->library.Decode(ids, &piece).ok()) text += piece;
    ids.clear();
  };
  for (int32_t token : tokens) {
    if (token < 0 || token >= size) {  // the library would refuse the whole call
      flush();
      text += "\xEF\xBF\xBD";
      continue;
    }
    ids.push_back(token);
  }
  flush();
  return text;
}

std::optional<int32_t> SentencepieceTokenizer::bos_id() const {
  const int id = processor_->library.bos_id();
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}

std::optional<int32_t> SentencepieceTokenizer::eos_id() const {
  const int id = processor_->library.eos_id();
  return id >= 0 ? std::optional<int32_t>(id) : std::nullopt;
}
#else
struct SentencepieceTokenizer::Processor {};

SentencepieceTokenizer::SentencepieceTokenizer(const std::string& path) : path_(path) {
  throw Error(ErrorKind::unsupported, "tokenizer " + path + " needs the sentencepiece library, and this mxtrain "
              "was built without it", "install libsentencepiece-dev (scripts/setup.sh does) and rebuild");
}
SentencepieceTokenizer::~SentencepieceTokenizer() = default;
int64_t SentencepieceTokenizer::vocab_size() const { return 0; }
std::vector<int32_t> SentencepieceTokenizer::encode(std::string_view) const { return {}; }
std::string SentencepieceTokenizer::decode(std::span<const int32_t>) const { return {}; }
std::optional<int32_t> SentencepieceTokenizer::bos_id() const { return std::nullopt; }
std::optional<int32_t> SentencepieceTokenizer::eos_id() const { return std::nullopt; }
#endif

}  // namespace mxtrain::data
