#include <CLI/CLI.hpp>
#include <cstdio>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/build_info.hpp"
#include "mxtrain/cli/commands.hpp"

namespace mxtrain::cli {

void add_version_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand("version", "print the version, commit and the backends of this build");
  command->callback([] {
    std::printf("mxtrain %s (commit %s)\n", MXTRAIN_VERSION, MXTRAIN_GIT_COMMIT);
    std::string backends;
    for (const std::string& name : backend_names()) {
      backends += (backends.empty() ? "" : ", ") + name;
      if (!backend_available(name)) backends += " (no device)";
    }
    std::printf("backends: %s\n", backends.c_str());
  });
}

}  // namespace mxtrain::cli
