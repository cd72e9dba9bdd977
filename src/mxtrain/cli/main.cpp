// mxtrain's entry point: parse the subcommand, run it, and turn any mxtrain::Error into one
// message with its fix and a non-zero exit — never a stack dump.
#include <cstdio>
#include <exception>

#include "mxtrain/cli/commands.hpp"
#include "mxtrain/core/error.hpp"

int main(int argc, char** argv) {
  try {
    return mxtrain::cli::run(argc, argv);
  } catch (const mxtrain::Error& error) {
    std::fprintf(stderr, "mxtrain: %s\n", error.full_message().c_str());
    return error.kind() == mxtrain::ErrorKind::out_of_memory ? 3 : 2;
  } catch (const std::exception& error) {
    std::fprintf(stderr, "mxtrain: unexpected error: %s\n", error.what());
    return 1;
  }
}
