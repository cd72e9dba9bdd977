// One error type for every user-facing failure. It carries what happened and the fix
// (llm.c's "---> HINT:"), so the CLI prints both and exits non-zero without a stack dump.
#pragma once
#include <stdexcept>
#include <string>

namespace mxtrain {

enum class ErrorKind { config, data, checkpoint, out_of_memory, numerics, system, unsupported, internal };

const char* error_kind_name(ErrorKind kind);

class Error : public std::runtime_error {
 public:
  Error(ErrorKind kind, std::string what, std::string advice = {});
  ErrorKind kind() const { return kind_; }
  const std::string& advice() const { return advice_; }
  // "what\n  fix: advice" — the text the CLI prints.
  std::string full_message() const;

 private:
  ErrorKind kind_;
  std::string advice_;
};

// A JSON parser's message without the library's "[json.exception.parse_error.101] " tag: what a user
// reads ("parse error at line 2, column 1: syntax error ..."), as one printable ASCII line (the
// bytes it quotes from a damaged file escaped as \xNN, the whole cut at 240 characters).
std::string json_parser_message(const std::exception& error);

// printf-style formatting into a std::string (GCC 12 has no <format>).
std::string strf(const char* format, ...) __attribute__((format(printf, 1, 2)));

[[noreturn]] void throw_internal(const char* file, int line, const char* condition, const std::string& detail);

}  // namespace mxtrain

// Always-on invariant check for conditions that are bugs, not user errors.
#define MXTRAIN_ASSERT(cond, ...)                                                               \
  do {                                                                                          \
    if (!(cond)) ::mxtrain::throw_internal(__FILE__, __LINE__, #cond, ::mxtrain::strf("" __VA_ARGS__)); \
  } while (0)

// User-facing check: throws Error(kind, what, advice).
#define MXTRAIN_REQUIRE(cond, kind, what, advice)                                                \
  do {                                                                                          \
    if (!(cond)) throw ::mxtrain::Error(::mxtrain::ErrorKind::kind, (what), (advice));            \
  } while (0)
