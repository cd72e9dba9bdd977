// Range checks of numeric flags. CLI11's PositiveNumber and NonNegativeNumber accept any double
// and say "Value 0 not in range 0.000000 to 1.79e308"; these name the value and the accepted
// integers ("--world-size: 0 is not an integer from 1 to 65,536"), and have an upper bound.
#pragma once
#include <CLI/CLI.hpp>
#include <cstdint>

namespace mxtrain::cli {

CLI::Validator integer_range(int64_t minimum, int64_t maximum);

// Largest rank and GPU counts a flag accepts (far beyond any job: a bound, not a limit).
constexpr int64_t kMaxRanks = 65536;

}  // namespace mxtrain::cli
