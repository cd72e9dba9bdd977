#include "mxtrain/data/tokenizer.hpp"

#include <filesystem>

#include "mxtrain/core/error.hpp"
#include "mxtrain/data/bpe_tokenizer.hpp"
#include "mxtrain/data/sentencepiece_tokenizer.hpp"

namespace mxtrain::data {

std::vector<int32_t> ByteTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> tokens(text.size());
  for (size_t i = 0; i < text.size(); ++i) tokens[i] = static_cast<unsigned char>(text[i]);
  return tokens;
}

std::string ByteTokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text;
  text.reserve(tokens.size());
  for (int32_t token : tokens) {
    if (token >= 0 && token < 256) {
      text.push_back(static_cast<char>(token));
    } else {
      text += "\xEF\xBF\xBD";  // U+FFFD REPLACEMENT CHARACTER
    }
  }
  return text;
}

std::vector<std::string> tokenizer_names() { return {"byte"}; }

std::string tokenizer_file_in(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code error;
  const fs::path json = fs::path(dir) / "tokenizer.json", model = fs::path(dir) / "tokenizer.model";
  const bool have_json = fs::is_regular_file(json, error), have_model = fs::is_regular_file(model, error);
  // A sentencepiece model converted to tokenizer.json (Llama 2, Mistral, TinyLlama) is read from
  // the tokenizer.model it was converted from.
  if (have_json && !(have_model && is_converted_sentencepiece(json.string()))) return json.string();
  return have_model ? model.string() : std::string();
}

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name) {
  namespace fs = std::filesystem;
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  std::error_code error;
  fs::path path(name);
  if (fs::is_directory(path, error)) {  // a model directory: its tokenizer.json, else tokenizer.model
    const std::string file = tokenizer_file_in(name);
    if (!file.empty()) return make_tokenizer(file);
    throw Error(ErrorKind::config, "directory " + name + " holds neither tokenizer.json nor tokenizer.model",
                "point the tokenizer at the model directory that has one, or at the file itself");
  }
  if (fs::is_regular_file(path, error)) {
    if (path.extension() == ".json") return std::make_unique<BpeTokenizer>(name);
    if (path.extension() == ".model") return std::make_unique<SentencepieceTokenizer>(name);
  }
  if (!fs::exists(path, error) &&
      (name.find('/') != std::string::npos || path.extension() == ".json" || path.extension() == ".model"))
    throw Error(ErrorKind::config, strf("tokenizer '%s' does not exist", name.c_str()),
                "check the path: a tokenizer.json, a sentencepiece .model file or a model directory holding one");
  throw Error(ErrorKind::config, strf("unknown tokenizer '%s'", name.c_str()),
              "use byte, a tokenizer.json (Hugging Face byte-level BPE), a sentencepiece .model file, or a model "
              "directory holding one of them");
}

std::string printable_text(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char character : text) {
    unsigned char byte = static_cast<unsigned char>(character);
    if ((byte < 0x20 && byte != '\n' && byte != '\t') || byte == 0x7f) {
      out += strf("\\x%02x", byte);
    } else {
      out.push_back(character);
    }
  }
  return out;
}

}  // namespace mxtrain::data
