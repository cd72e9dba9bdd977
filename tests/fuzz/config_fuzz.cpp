// The config parser: TOML text and --set assignments. The input is TOML, then optionally a line
// "---" and one KEY=VALUE assignment per line (as --set takes them). An accepted config must
// print as TOML that loads back to the same config.
#include <sstream>

#include "fuzz_support.hpp"
#include "mxtrain/config/loader.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxtrain;
  const std::string input(reinterpret_cast<const char*>(data), size);
  return fuzz::run_one([&] {
    ConfigSources sources;
    sources.read_environment = false;
    const size_t split = input.find("\n---\n");
    sources.toml_text = input.substr(0, split);
    if (split != std::string::npos) {
      std::istringstream lines(input.substr(split + 5));
      for (std::string line; std::getline(lines, line);)
        if (!line.empty()) sources.overrides.push_back(parse_assignment(line));
    }
    if (sources.toml_text.empty()) sources.toml_text = "\n";
    RunConfig config = load_config(sources);
    config.model.parameter_count();
    ConfigSources again;
    again.read_environment = false;
    again.toml_text = config_to_toml(config);
    RunConfig reloaded = load_config(again);
    fuzz::require(config_differences(config, reloaded).empty(), "config_to_toml does not load back to the same config");
  });
}
