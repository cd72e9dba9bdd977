// A Hugging Face `tokenizer.json` with a byte-level BPE model, as GPT-2, Llama 3 and Qwen2 use:
// added (special) tokens are cut out of the text first; each remaining segment is normalized to
// Unicode NFC where the file says so (Qwen2; utf8proc) and split by the
// pre-tokenizer's regex (PCRE2: the patterns need Unicode classes and look-ahead), every piece's
// bytes are mapped to printable characters (GPT-2's byte-to-unicode table) and merged by rank
// (lowest rank first, leftmost first among equals, as `tokenizers` does), and the merged symbols
// are looked up in the vocabulary. Decoding maps the characters back to bytes, so
// decode(encode(text)) == text for any text (its NFC form under an NFC normalizer).
//
// What the file may say is checked when it is loaded; anything this code does not reproduce
// exactly (a normalizer other than NFC, another model type, BPE dropout, byte fallback, ...) is refused with
// the field's name rather than approximated.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "mxtrain/data/tokenizer.hpp"

namespace mxtrain::data {

class BpeTokenizer final : public Tokenizer {
 public:
  // Loads and checks `path` (a tokenizer.json); throws Error(data) naming the field.
  explicit BpeTokenizer(const std::string& path);
  ~BpeTokenizer() override;

  std::string name() const override { return path_; }
  int64_t vocab_size() const override { return vocab_size_; }
  std::vector<int32_t> encode(std::string_view text) const override;
  std::string decode(std::span<const int32_t> tokens) const override;
  std::optional<int32_t> bos_id() const override { return bos_; }
  std::optional<int32_t> eos_id() const override { return eos_; }

 private:
  struct Regex;
  struct AddedToken {
    std::string content;
    int32_t id;
  };
  // Appends the ids of one segment that holds no added token.
  void encode_segment(std::string_view text, std::vector<int32_t>& out) const;
  // Appends the ids of one pre-tokenized piece (raw bytes).
  void encode_piece(std::string_view piece, std::vector<int32_t>& out) const;

  std::string path_;
  int64_t vocab_size_ = 0;
  std::unordered_map<std::string, int32_t> vocab_;      // mapped-character string -> id
  std::vector<std::string> tokens_;                      // id -> mapped-character string ("" if unused)
  std::vector<bool> special_;                            // id -> an added token, decoded verbatim
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // (left id, right id) -> (rank, merged id)
  std::vector<AddedToken> added_;                        // longest content first
  bool added_first_byte_[256] = {};                      // a byte some added token starts with
  std::vector<std::unique_ptr<Regex>> splits_;           // applied in order, each isolating its matches
  bool ignore_merges_ = false;                           // a piece that is a whole vocabulary entry stays whole
  bool nfc_ = false;                                     // each segment is normalized to Unicode NFC first
  std::string byte_to_char_[256];                        // GPT-2's printable stand-in of each byte (UTF-8)
  std::unordered_map<std::string, uint8_t> char_to_byte_;
  std::optional<int32_t> bos_, eos_;
};

// Whether the tokenizer.json at `path` is a sentencepiece model converted to Hugging Face's
// format (Llama 2, Mistral, TinyLlama, Gemma: a BPE with byte fallback, or a Unigram model, or a
// Metaspace pre-tokenizer): those this class refuses, and the tokenizer.model that such a model
// directory also holds is the same tokenizer in sentencepiece's own format. False when the file
// cannot be read or parsed (loading it then says what is wrong).
bool is_converted_sentencepiece(const std::string& path);

}  // namespace mxtrain::data
