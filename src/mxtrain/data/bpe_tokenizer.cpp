#include "mxtrain/data/bpe_tokenizer.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"

#ifdef MXTRAIN_HAVE_PCRE2
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#endif
#ifdef MXTRAIN_HAVE_UTF8PROC
#include <utf8proc.h>
#endif

namespace mxtrain::data {

namespace {

// GPT-2's pre-tokenizer pattern: what ByteLevel(use_regex = true) splits with.
constexpr const char* kGpt2Pattern = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

[[noreturn]] void bad_tokenizer(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::data, "tokenizer " + path + ": " + what,
              "mxtrain reads byte-level BPE tokenizer.json files (GPT-2, Llama 3, Qwen2) and sentencepiece .model files");
}

std::string utf8(uint32_t code_point) {
  std::string out;
  if (code_point < 0x80) {
    out.push_back(static_cast<char>(code_point));
  } else if (code_point < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (code_point >> 6)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xE0 | (code_point >> 12)));
    out.push_back(static_cast<char>(0x80 | ((code_point >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (code_point & 0x3F)));
  }
  return out;
}

// Byte length of the UTF-8 sequence starting with `lead` (1 for a stray continuation byte).
size_t utf8_length(unsigned char lead) {
  if (lead >= 0xF0) return 4;
  if (lead >= 0xE0) return 3;
  if (lead >= 0xC0) return 2;
  return 1;
}

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

bool flag(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it != object.end() && it->is_boolean() && it->get<bool>();
}

bool null_or_empty(const nlohmann::json& object, const char* key) {
  const auto it = object.find(key);
  return it == object.end() || it->is_null() || (it->is_string() && it->get<std::string>().empty());
}

std::string type_of(const nlohmann::json& object) {
  const auto it = object.find("type");
  return it != object.end() && it->is_string() ? it->get<std::string>() : "";
}

// A token name in tokenizer_config.json: a string, or an object with "content".
std::optional<std::string> config_token(const nlohmann::json& config, const char* key) {
  const auto it = config.find(key);
  if (it == config.end()) return std::nullopt;
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string())
    return (*it)["content"].get<std::string>();
  return std::nullopt;
}

// A sentencepiece model written as tokenizer.json: see is_converted_sentencepiece.
bool sentencepiece_style(const nlohmann::json& file) {
  if (!file.is_object()) return false;
  const auto model = file.find("model");
  if (model != file.end() && model->is_object() && (flag(*model, "byte_fallback") || type_of(*model) == "Unigram"))
    return true;
  for (const char* part : {"pre_tokenizer", "normalizer", "decoder"}) {
    const auto it = file.find(part);
    if (it == file.end() || !it->is_object()) continue;
    if (type_of(*it) == "Metaspace") return true;
    for (const char* list : {"pretokenizers", "normalizers", "decoders"}) {
      const auto steps = it->find(list);
      if (steps == it->end() || !steps->is_array()) continue;
      for (const nlohmann::json& step : *steps)
        if (step.is_object() && (type_of(step) == "Metaspace" || type_of(step) == "ByteFallback")) return true;
    }
  }
  return false;
}

// The refusal of a converted sentencepiece tokenizer names the file that works instead.
[[noreturn]] void converted_sentencepiece(const std::string& path) {
  const std::filesystem::path beside = std::filesystem::path(path).parent_path() / "tokenizer.model";
  std::error_code error;
  throw Error(ErrorKind::data,
              "tokenizer " + path + " is a sentencepiece tokenizer converted to tokenizer.json (byte fallback or "
                                    "Metaspace), not a byte-level BPE",
              std::filesystem::is_regular_file(beside, error)
                  ? "give the sentencepiece model beside it, " + beside.string() +
                        ", or the model directory (which then reads tokenizer.model)"
                  : "give the model's sentencepiece tokenizer.model (Llama 2, Mistral and TinyLlama repositories "
                    "ship one beside tokenizer.json)");
}

}  // namespace

bool is_converted_sentencepiece(const std::string& path) {
  std::ifstream stream(path, std::ios::binary);
  if (!stream) return false;
  return sentencepiece_style(nlohmann::json::parse(stream, nullptr, /*allow_exceptions=*/false));
}

#ifdef MXTRAIN_HAVE_PCRE2
struct BpeTokenizer::Regex {
  pcre2_code* code = nullptr;
  Regex(const std::string& pattern, const std::string& path) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                         PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
    if (!code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      bad_tokenizer(path, strf("the pre-tokenizer pattern does not compile at offset %zu: %s", static_cast<size_t>(offset),
                               reinterpret_cast<const char*>(message)));
    }
    pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // falls back to the interpreter where JIT is unavailable
  }
  ~Regex() { pcre2_code_free(code); }
  // Splits `text` into its matches and the gaps between them, in order ("Isolated").
  std::vector<std::string_view> split(std::string_view text) const {
    std::vector<std::string_view> pieces;
    pcre2_match_data* match = pcre2_match_data_create_from_pattern(code, nullptr);
    size_t gap_start = 0, at = 0;
    while (at < text.size()) {
      const int found = pcre2_match(code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), at, 0, match, nullptr);
      if (found < 0) break;
      const PCRE2_SIZE* range = pcre2_get_ovector_pointer(match);
      const size_t begin = range[0], end = range[1];
      if (end == begin) {  // an empty match: move on by one character
        at = begin + utf8_length(static_cast<unsigned char>(text[begin]));
        continue;
      }
      if (begin > gap_start) pieces.push_back(text.substr(gap_start, begin - gap_start));
      pieces.push_back(text.substr(begin, end - begin));
      gap_start = at = end;
    }
    if (gap_start < text.size()) pieces.push_back(text.substr(gap_start));
    pcre2_match_data_free(match);
    return pieces;
  }
};
#else
struct BpeTokenizer::Regex {
  Regex(const std::string&, const std::string& path) {
    throw Error(ErrorKind::unsupported, "tokenizer " + path + " needs PCRE2, and this mxtrain was built without it",
                "install libpcre2-dev (scripts/setup.sh does) and rebuild");
  }
  std::vector<std::string_view> split(std::string_view text) const { return {text}; }
};
#endif

BpeTokenizer::~BpeTokenizer() = default;

BpeTokenizer::BpeTokenizer(const std::string& path) : path_(path) {
  // GPT-2's byte-to-unicode table: printable bytes stand for themselves, the rest for 256 + n.
  int next = 0;
  for (int byte = 0; byte < 256; ++byte) {
    const bool printable = (byte >= '!' && byte <= '~') || (byte >= 0xA1 && byte <= 0xAC) || (byte >= 0xAE);
    byte_to_char_[byte] = utf8(printable ? static_cast<uint32_t>(byte) : static_cast<uint32_t>(256 + next++));
    char_to_byte_[byte_to_char_[byte]] = static_cast<uint8_t>(byte);
  }

  std::ifstream stream(path, std::ios::binary);
  if (!stream) bad_tokenizer(path, "cannot be opened");
  nlohmann::json file;
  try {
    file = nlohmann::json::parse(stream);
  } catch (const nlohmann::json::parse_error& error) {
    bad_tokenizer(path, "is not valid JSON (" + json_parser_message(error) +
                            "): the file is damaged or was cut short; copy it again from the model's repository");
  }
  if (!file.is_object()) bad_tokenizer(path, "is not a JSON object");
  if (sentencepiece_style(file)) converted_sentencepiece(path);
  const auto model_it = file.find("model");
  if (model_it == file.end() || !model_it->is_object()) bad_tokenizer(path, "has no model object");
  const nlohmann::json& model = *model_it;
  if (type_of(model) != "BPE") bad_tokenizer(path, "model.type is '" + type_of(model) + "', not BPE");
  if (!null_or_empty(model, "dropout")) bad_tokenizer(path, "model.dropout is set (BPE dropout is not reproduced)");
  if (flag(model, "byte_fallback")) bad_tokenizer(path, "model.byte_fallback is true (not a byte-level BPE)");
  if (!null_or_empty(model, "continuing_subword_prefix") || !null_or_empty(model, "end_of_word_suffix"))
    bad_tokenizer(path, "model.continuing_subword_prefix / end_of_word_suffix are set (not a byte-level BPE)");
  ignore_merges_ = flag(model, "ignore_merges");

  // Vocabulary and added tokens.
  const auto vocab_it = model.find("vocab");
  if (vocab_it == model.end() || !vocab_it->is_object()) bad_tokenizer(path, "model.vocab is not an object");
  int64_t max_id = -1;
  // Ids index a table of vocabulary size: bounded as model.vocab_size is, so a stray huge id is a
  // message, not a table of billions of entries.
  constexpr int64_t kMaxIds = int64_t{1} << 24;
  auto add_id = [&](const std::string& text, const nlohmann::json& id, const char* where) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= kMaxIds)
      bad_tokenizer(path, std::string(where) + " '" + text + "' has an id that is not an integer from 0 to 16,777,215 "
                                                             "(the largest vocabulary mxtrain takes)");
    const int32_t value = static_cast<int32_t>(id.get<int64_t>());
    max_id = std::max<int64_t>(max_id, value);
    return value;
  };
  for (auto item = vocab_it->begin(); item != vocab_it->end(); ++item)
    vocab_[item.key()] = add_id(item.key(), item.value(), "model.vocab entry");
  const auto added_it = file.find("added_tokens");
  std::vector<std::string> normalized_added;  // added tokens matched in normalized text
  if (added_it != file.end() && !added_it->is_null()) {
    if (!added_it->is_array()) bad_tokenizer(path, "added_tokens is not an array");
    for (const nlohmann::json& token : *added_it) {
      if (!token.is_object() || !token.contains("content") || !token["content"].is_string() || !token.contains("id"))
        bad_tokenizer(path, "an added_tokens entry has no content or id");
      const std::string content = token["content"].get<std::string>();
      if (content.empty()) bad_tokenizer(path, "an added token is empty");
      if (flag(token, "single_word") || flag(token, "lstrip") || flag(token, "rstrip"))
        bad_tokenizer(path, "added token '" + content + "' sets single_word, lstrip or rstrip (not reproduced)");
      added_.push_back({content, add_id(content, token["id"], "added token")});
      if (flag(token, "normalized")) normalized_added.push_back(content);
    }
    std::stable_sort(added_.begin(), added_.end(),
                     [](const AddedToken& a, const AddedToken& b) { return a.content.size() > b.content.size(); });
    for (const AddedToken& token : added_) added_first_byte_[static_cast<unsigned char>(token.content[0])] = true;
  }
  if (max_id < 0) bad_tokenizer(path, "has an empty vocabulary");
  vocab_size_ = max_id + 1;
  tokens_.assign(static_cast<size_t>(vocab_size_), "");
  special_.assign(static_cast<size_t>(vocab_size_), false);
  // One text per id: two texts sharing an id would decode one as the other (silently different
  // training data). An added token may repeat its own vocabulary entry, as most files do.
  std::vector<bool> taken(static_cast<size_t>(vocab_size_), false);
  for (const auto& [text, id] : vocab_) {
    if (taken[static_cast<size_t>(id)])
      bad_tokenizer(path, "model.vocab gives id " + std::to_string(id) + " to both '" + tokens_[static_cast<size_t>(id)] +
                              "' and '" + text + "'");
    taken[static_cast<size_t>(id)] = true;
    tokens_[static_cast<size_t>(id)] = text;
  }
  for (const AddedToken& token : added_) {
    if (taken[static_cast<size_t>(token.id)] && tokens_[static_cast<size_t>(token.id)] != token.content)
      bad_tokenizer(path, "added token '" + token.content + "' has id " + std::to_string(token.id) + ", which is '" +
                              tokens_[static_cast<size_t>(token.id)] + "' already");
    taken[static_cast<size_t>(token.id)] = true;
    tokens_[static_cast<size_t>(token.id)] = token.content;
    special_[static_cast<size_t>(token.id)] = true;
  }

  // Merges: "left right" strings (older files) or [left, right] pairs (newer ones), by rank.
  const auto merges_it = model.find("merges");
  if (merges_it == model.end() || !merges_it->is_array()) bad_tokenizer(path, "model.merges is not an array");
  int32_t rank = 0;
  for (const nlohmann::json& merge : *merges_it) {
    std::string left, right;
    if (merge.is_string()) {
      const std::string text = merge.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        bad_tokenizer(path, "merge '" + text + "' is not two symbols separated by one space");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (merge.is_array() && merge.size() == 2 && merge[0].is_string() && merge[1].is_string()) {
      left = merge[0].get<std::string>();
      right = merge[1].get<std::string>();
    } else {
      bad_tokenizer(path, strf("merge %d is neither \"a b\" nor [\"a\", \"b\"]", rank));
    }
    const auto l = vocab_.find(left), r = vocab_.find(right), m = vocab_.find(left + right);
    if (l == vocab_.end() || r == vocab_.end() || m == vocab_.end())
      bad_tokenizer(path, "merge '" + left + " " + right + "' names a symbol that is not in the vocabulary");
    merges_.emplace(pair_key(l->second, r->second), std::make_pair(rank, m->second));
    ++rank;
  }

  // Normalizer, pre-tokenizer, decoder: only what byte-level BPE tokenizers use. The normalizer
  // may be none or Unicode NFC (Qwen2's), alone or as a Sequence of NFC steps.
  const auto normalizer = file.find("normalizer");
  if (normalizer != file.end() && !normalizer->is_null()) {
    std::vector<nlohmann::json> normalizers;
    if (type_of(*normalizer) == "Sequence" && normalizer->contains("normalizers") &&
        (*normalizer)["normalizers"].is_array())
      for (const nlohmann::json& step : (*normalizer)["normalizers"]) normalizers.push_back(step);
    else
      normalizers.push_back(*normalizer);
    for (const nlohmann::json& step : normalizers)
      if (type_of(step) != "NFC")
        bad_tokenizer(path, "normalizer '" + type_of(step) + "' is set (of the normalizers, NFC is reproduced)");
    nfc_ = !normalizers.empty();
#ifndef MXTRAIN_HAVE_UTF8PROC
    if (nfc_)
      throw Error(ErrorKind::unsupported,
                  "tokenizer " + path + " normalizes its text to Unicode NFC, and this mxtrain was built without utf8proc",
                  "install libutf8proc-dev (scripts/setup.sh does) and rebuild");
#endif
    // transformers matches an added token with normalized = true in the normalized text; mxtrain
    // cuts every added token out of the text as written (special tokens are not normalized).
    for (const std::string& content : normalized_added)
      if (nfc_)
        bad_tokenizer(path, "added token '" + content + "' is normalized = true under a normalizer (not reproduced)");
  }
  const auto pre = file.find("pre_tokenizer");
  if (pre == file.end() || !pre->is_object()) bad_tokenizer(path, "has no pre_tokenizer (byte-level BPE needs ByteLevel)");
  std::vector<nlohmann::json> steps;
  if (type_of(*pre) == "Sequence" && pre->contains("pretokenizers") && (*pre)["pretokenizers"].is_array())
    for (const nlohmann::json& step : (*pre)["pretokenizers"]) steps.push_back(step);
  else
    steps.push_back(*pre);
  bool byte_level = false;
  for (const nlohmann::json& step : steps) {
    const std::string type = type_of(step);
    if (type == "ByteLevel") {
      if (flag(step, "add_prefix_space")) bad_tokenizer(path, "pre_tokenizer ByteLevel.add_prefix_space is true (not reproduced)");
      if (!step.contains("use_regex") || flag(step, "use_regex")) splits_.push_back(std::make_unique<Regex>(kGpt2Pattern, path));
      byte_level = true;
    } else if (type == "Split") {
      const auto pattern = step.find("pattern");
      if (pattern == step.end() || !pattern->is_object() || !pattern->contains("Regex") || !(*pattern)["Regex"].is_string())
        bad_tokenizer(path, "pre_tokenizer Split has no Regex pattern");
      if (!step.contains("behavior") || step["behavior"] != "Isolated" || flag(step, "invert"))
        bad_tokenizer(path, "pre_tokenizer Split is not behavior Isolated without invert (not reproduced)");
      splits_.push_back(std::make_unique<Regex>((*pattern)["Regex"].get<std::string>(), path));
    } else {
      bad_tokenizer(path, "pre_tokenizer '" + type + "' is not reproduced (ByteLevel and Split are)");
    }
  }
  if (!byte_level) bad_tokenizer(path, "the pre_tokenizer has no ByteLevel step");
  const auto decoder = file.find("decoder");
  if (decoder != file.end() && !decoder->is_null() && type_of(*decoder) != "ByteLevel")
    bad_tokenizer(path, "decoder '" + type_of(*decoder) + "' is not ByteLevel");

  // BOS and EOS: tokenizer_config.json beside the file names them; else the usual names.
  auto id_of = [&](const std::string& content) -> std::optional<int32_t> {
    for (const AddedToken& token : added_)
      if (token.content == content) return token.id;
    const auto it = vocab_.find(content);
    return it == vocab_.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  const std::filesystem::path config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  std::ifstream config_stream(config_path);
  const nlohmann::json config = config_stream ? nlohmann::json::parse(config_stream, nullptr, false) : nlohmann::json();
  if (config.is_object()) {
    if (auto name = config_token(config, "bos_token")) bos_ = id_of(*name);
    if (auto name = config_token(config, "eos_token")) eos_ = id_of(*name);
  }
  if (!eos_)
    for (const char* name : {"<|endoftext|>", "<|end_of_text|>", "</s>"})
      if ((eos_ = id_of(name))) break;
  if (!bos_)
    for (const char* name : {"<|begin_of_text|>", "<s>"})
      if ((bos_ = id_of(name))) break;
}

void BpeTokenizer::encode_piece(std::string_view piece, std::vector<int32_t>& out) const {
  std::string mapped;
  for (char c : piece) mapped += byte_to_char_[static_cast<unsigned char>(c)];
  if (ignore_merges_) {
    const auto whole = vocab_.find(mapped);
    if (whole != vocab_.end()) {
      out.push_back(whole->second);
      return;
    }
  }
  std::vector<int32_t> symbols;
  symbols.reserve(piece.size());
  for (char c : piece) {
    const auto it = vocab_.find(byte_to_char_[static_cast<unsigned char>(c)]);
    if (it == vocab_.end())
      throw Error(ErrorKind::data, strf("tokenizer %s has no token for the byte 0x%02x", path_.c_str(),
                                        static_cast<unsigned char>(c)),
                  "a byte-level BPE vocabulary holds all 256 bytes; the file is incomplete");
    symbols.push_back(it->second);
  }
  // Lowest rank first, leftmost among equal ranks.
  while (symbols.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), merged = -1;
    size_t best = 0;
    for (size_t i = 0; i + 1 < symbols.size(); ++i) {
      const auto it = merges_.find(pair_key(symbols[i], symbols[i + 1]));
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        merged = it->second.second;
        best = i;
      }
    }
    if (merged < 0) break;
    symbols[best] = merged;
    symbols.erase(symbols.begin() + static_cast<std::ptrdiff_t>(best) + 1);
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
}

#ifdef MXTRAIN_HAVE_UTF8PROC
namespace {

// Unicode NFC of `text` (utf8proc, composing canonically as `tokenizers`' NFC normalizer does).
// Bytes that are not UTF-8 stay as they are (the byte-level model encodes any byte); each valid
// stretch between them is normalized.
std::string nfc(std::string_view text) {
  std::string out;
  auto normalize = [&out](std::string_view valid) {
    if (valid.empty()) return;
    utf8proc_uint8_t* mapped = nullptr;
    const utf8proc_ssize_t length =
        utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(valid.data()), static_cast<utf8proc_ssize_t>(valid.size()),
                     &mapped, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    if (length < 0)
      throw Error(ErrorKind::internal, std::string("utf8proc could not normalize text: ") + utf8proc_errmsg(length),
                  "this is a bug");
    out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(length));
    std::free(mapped);
  };
  size_t start = 0, at = 0;
  while (at < text.size()) {
    utf8proc_int32_t code_point = 0;
    const utf8proc_ssize_t length =
        utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + at),
                         static_cast<utf8proc_ssize_t>(text.size() - at), &code_point);
    if (length > 0) {
      at += static_cast<size_t>(length);
      continue;
    }
    normalize(text.substr(start, at - start));
    out.push_back(text[at]);  // not UTF-8: kept
    start = ++at;
  }
  normalize(text.substr(start));
  return out;
}

}  // namespace
#endif

void BpeTokenizer::encode_segment(std::string_view raw, std::vector<int32_t>& out) const {
  std::string_view text = raw;
#ifdef MXTRAIN_HAVE_UTF8PROC
  // NFC leaves ASCII as it is: most text skips the call.
  std::string normalized;
  if (nfc_ && std::any_of(raw.begin(), raw.end(), [](char c) { return static_cast<unsigned char>(c) >= 0x80; })) {
    normalized = nfc(raw);
    text = normalized;
  }
#endif
  std::vector<std::string_view> pieces{text};
  for (const std::unique_ptr<Regex>& regex : splits_) {
    std::vector<std::string_view> next;
    for (std::string_view piece : pieces)
      for (std::string_view part : regex->split(piece)) next.push_back(part);
    pieces = std::move(next);
  }
  for (std::string_view piece : pieces) encode_piece(piece, out);
}

std::vector<int32_t> BpeTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  size_t start = 0, at = 0;
  while (at < text.size()) {
    const AddedToken* found = nullptr;
    if (!added_first_byte_[static_cast<unsigned char>(text[at])]) {
      ++at;
      continue;
    }
    for (const AddedToken& token : added_)  // longest first: leftmost-longest
      if (text.compare(at, token.content.size(), token.content) == 0) {
        found = &token;
        break;
      }
    if (!found) {
      ++at;
      continue;
    }
    if (at > start) encode_segment(text.substr(start, at - start), ids);
    ids.push_back(found->id);
    at += found->content.size();
    start = at;
  }
  if (start < text.size()) encode_segment(text.substr(start), ids);
  return ids;
}

std::string BpeTokenizer::decode(std::span<const int32_t> tokens) const {
  std::string text;
  for (int32_t id : tokens) {
    if (id < 0 || id >= vocab_size_ || tokens_[static_cast<size_t>(id)].empty()) {
      text += "\xEF\xBF\xBD";
      continue;
    }
    const std::string& token = tokens_[static_cast<size_t>(id)];
    if (special_[static_cast<size_t>(id)]) {
      text += token;
      continue;
    }
    for (size_t i = 0; i < token.size();) {
      const size_t length = std::min(utf8_length(static_cast<unsigned char>(token[i])), token.size() - i);
      const auto byte = char_to_byte_.find(token.substr(i, length));
      if (byte != char_to_byte_.end())
        text.push_back(static_cast<char>(byte->second));
      else
        text.append(token, i, length);
      i += length;
    }
  }
  return text;
}

}  // namespace mxtrain::data
