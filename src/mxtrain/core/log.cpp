#include "mxtrain/core/log.hpp"

#include <atomic>
#include <cmath>
#include <cstdio>
#include <mutex>

namespace mxtrain::log {
namespace {
std::atomic<int> g_rank{0};
std::atomic<bool> g_all_ranks{false};
std::atomic<int> g_level{static_cast<int>(Level::info)};
std::mutex g_mutex;
}  // namespace

void set_rank(int rank) { g_rank = rank; }
int rank() { return g_rank; }
void set_all_ranks(bool all_ranks) { g_all_ranks = all_ranks; }
void set_level(Level level) { g_level = static_cast<int>(level); }

bool parse_level(const std::string& text, Level* level) {
  if (text == "debug") *level = Level::debug;
  else if (text == "info") *level = Level::info;
  else if (text == "warn" || text == "warning") *level = Level::warn;
  else if (text == "error") *level = Level::error;
  else return false;
  return true;
}

void write(Level level, const std::string& text) {
  if (static_cast<int>(level) < g_level) return;
  // Warnings and errors come from every rank: a failure on rank 3 must not be swallowed.
  if (level < Level::warn && g_rank != 0 && !g_all_ranks) return;
  std::lock_guard<std::mutex> lock(g_mutex);
  FILE* stream = level >= Level::warn ? stderr : stdout;
  const char* tag = level == Level::warn ? "warning: " : (level == Level::error ? "error: " : "");
  std::fprintf(stream, "[rank %d] %s%s\n", g_rank.load(), tag, text.c_str());
  std::fflush(stream);
}

namespace {

std::string group_digits(const std::string& digits) {
  std::string grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

}  // namespace

std::string with_commas(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, std::fabs(value));
  std::string digits(buffer);
  size_t dot = digits.find('.');
  std::string fraction = dot == std::string::npos ? "" : digits.substr(dot);
  return (value < 0 ? "-" : "") + group_digits(digits.substr(0, dot)) + fraction;
}

std::string integer_with_commas(int64_t value) {
  // The magnitude as unsigned, so that INT64_MIN has one too.
  const uint64_t magnitude = value < 0 ? uint64_t{0} - static_cast<uint64_t>(value) : static_cast<uint64_t>(value);
  return (value < 0 ? "-" : "") + group_digits(std::to_string(magnitude));
}

}  // namespace mxtrain::log
