#include "mxtrain/data/tokenizer.hpp"

#include "mxtrain/core/error.hpp"

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

std::unique_ptr<Tokenizer> make_tokenizer(const std::string& name) {
  if (name == "byte") return std::make_unique<ByteTokenizer>();
  std::string known;
  for (const std::string& candidate : tokenizer_names()) known += (known.empty() ? "" : ", ") + candidate;
  throw Error(ErrorKind::config, strf("unknown tokenizer '%s'", name.c_str()), "use one of: " + known);
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
