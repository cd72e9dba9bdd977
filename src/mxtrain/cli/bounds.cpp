#include "mxtrain/cli/bounds.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "mxtrain/core/log.hpp"

namespace mxtrain::cli {

CLI::Validator integer_range(int64_t minimum, int64_t maximum) {
  const std::string range = log::integer_with_commas(minimum) + " to " + log::integer_with_commas(maximum);
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
