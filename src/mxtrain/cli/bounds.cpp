#include "mxtrain/cli/bounds.hpp"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "mxtrain/core/log.hpp"

namespace mxtrain::cli {

CLI::Validator integer_range(int64_t minimum, int64_t maximum) {
  // (log::with_commas takes a double: exact for every bound the commands use, all below 2^53.)
  const std::string range = log::with_commas(static_cast<double>(minimum)) + " to " +
                            log::with_commas(static_cast<double>(maximum));
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
