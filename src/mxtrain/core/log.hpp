// The logger: the one piece of global mutable state. Lines from rank 0 only unless all_ranks
// is set; every line carries the "[rank R]" prefix so interleaved multi-rank output stays readable.
#pragma once
#include <cstdint>
#include <string>

namespace mxtrain::log {

enum class Level { debug = 0, info = 1, warn = 2, error = 3 };

void set_rank(int rank);
int rank();
void set_all_ranks(bool all_ranks);
void set_level(Level level);
// "debug", "info", "warn" (or "warning"), "error"; false for anything else.
bool parse_level(const std::string& text, Level* level);

// Prints "[rank R] text" to stderr (warn/error) or stdout (info/debug).
void write(Level level, const std::string& text);
inline void info(const std::string& text) { write(Level::info, text); }
inline void warn(const std::string& text) { write(Level::warn, text); }
inline void error(const std::string& text) { write(Level::error, text); }
inline void debug(const std::string& text) { write(Level::debug, text); }

// Group digits with commas: 43021 -> "43,021".
std::string with_commas(double value, int decimals = 0);
// The same for an integer, exact over all of int64_t (a double rounds above 2^53).
std::string integer_with_commas(int64_t value);

}  // namespace mxtrain::log
