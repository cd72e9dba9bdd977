#include "mxtrain/core/host_memory.hpp"

#include <fstream>
#include <sstream>

namespace mxtrain {

uint64_t parse_mem_available(const std::string& meminfo) {
  std::istringstream in(meminfo);
  std::string name, unit;
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    unsigned long long value = 0;
    if (!(fields >> name >> value)) continue;
    if (name != "MemAvailable:") continue;
    fields >> unit;
    constexpr unsigned long long kLimit = ~0ull / 1024;
    if (unit == "kB") return value > kLimit ? ~uint64_t{0} : value * 1024;
    return value;
  }
  return 0;
}

uint64_t host_available_bytes() {
  std::ifstream in("/proc/meminfo");
  if (!in) return 0;
  std::stringstream text;
  text << in.rdbuf();
  return parse_mem_available(text.str());
}

}  // namespace mxtrain
