#include "mxtrain/core/error.hpp"

#include <cstdarg>
#include <cstdio>
#include <vector>

namespace mxtrain {

std::string json_parser_message(const std::exception& error) {
  std::string what = error.what();
  const size_t tag_end = what.find("] ");
  if (what.rfind("[json.exception", 0) == 0 && tag_end != std::string::npos) what.erase(0, tag_end + 2);
  // The parser quotes what it last read from the file: a damaged file's bytes (control characters,
  // broken UTF-8, a long string) are shown as \xNN escapes and cut short, so the message stays one
  // printable line.
  constexpr size_t kMaxChars = 240;
  std::string text;
  for (const char c : what) {
    if (text.size() >= kMaxChars) return text + "...";
    const auto byte = static_cast<unsigned char>(c);
    text += byte >= 0x20 && byte < 0x7f ? std::string(1, c) : strf("\\x%02x", byte);
  }
  return text;
}

const char* error_kind_name(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::config: return "config error";
    case ErrorKind::data: return "data error";
    case ErrorKind::checkpoint: return "checkpoint error";
    case ErrorKind::out_of_memory: return "out of memory";
    case ErrorKind::numerics: return "numerics error";
    case ErrorKind::system: return "system error";
    case ErrorKind::unsupported: return "unsupported";
    case ErrorKind::internal: return "internal error";
  }
  return "error";
}

Error::Error(ErrorKind kind, std::string what, std::string advice)
    : std::runtime_error(std::move(what)), kind_(kind), advice_(std::move(advice)) {}

std::string Error::full_message() const {
  std::string text = std::string(error_kind_name(kind_)) + ": " + what();
  if (!advice_.empty()) text += "\n  fix: " + advice_;
  return text;
}

std::string strf(const char* format, ...) {
  va_list args;
  va_start(args, format);
  va_list copy;
  va_copy(copy, args);
  int length = std::vsnprintf(nullptr, 0, format, copy);
  va_end(copy);
  std::string text(length > 0 ? static_cast<size_t>(length) : 0, '\0');
  if (length > 0) std::vsnprintf(text.data(), text.size() + 1, format, args);
  va_end(args);
  return text;
}

void throw_internal(const char* file, int line, const char* condition, const std::string& detail) {
  std::string what = strf("%s:%d: check failed: %s", file, line, condition);
  if (!detail.empty()) what += " (" + detail + ")";
  throw Error(ErrorKind::internal, what, "this is a bug in mxtrain; please report it with the command line");
}

}  // namespace mxtrain
