#include "mxtrain/cli/bounds.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>

namespace mxtrain::cli {
namespace {

std::string grouped(int64_t value) {
  std::string digits = std::to_string(value < 0 ? -value : value), text;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) text += ',';
    text += digits[i];
  }
  return value < 0 ? "-" + text : text;
}

}  // namespace

CLI::Validator integer_range(int64_t minimum, int64_t maximum) {
  const std::string range = grouped(minimum) + " to " + grouped(maximum);
  return CLI::Validator(
      [minimum, maximum, range](std::string& text) -> std::string {
        errno = 0;
        char* end = nullptr;
        const long long value = std::strtoll(text.c_str(), &end, 10);
        if (text.empty() || *end != '\0' || errno != 0 || value < minimum || value > maximum)
          return "'" + text + "' is not an integer from " + range;
        return {};
      },
      "INT " + range);
}

}  // namespace mxtrain::cli
