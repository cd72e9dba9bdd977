// Shared by the libFuzzer targets: the parsers under test read files, so each input is written to
// a file in a directory private to the process, and only mxtrain::Error (a user-facing message)
// may leave a parser; any other exception, a crash or a sanitizer report is a finding.
#pragma once
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>

#include "mxtrain/core/error.hpp"

namespace mxtrain::fuzz {

inline const std::string& work_dir() {
  static const std::string dir = [] {
    std::string path = std::filesystem::temp_directory_path().string() + "/mxtrain_fuzz_" + std::to_string(getpid());
    std::filesystem::create_directories(path);
    return path;
  }();
  return dir;
}

inline std::string write_input(const std::string& name, const uint8_t* data, size_t size) {
  const std::string path = work_dir() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

// Runs body; an mxtrain::Error is the expected answer to bad input, anything else aborts.
template <typename Body>
int run_one(Body&& body) {
  try {
    body();
  } catch (const Error& error) {
    if (error.kind() == ErrorKind::internal) {
      std::fprintf(stderr, "internal error from input: %s\n", error.what());
      std::abort();
    }
  } catch (const std::exception& error) {
    std::fprintf(stderr, "exception other than mxtrain::Error: %s\n", error.what());
    std::abort();
  }
  return 0;
}

// Aborts with a message when a property that must hold for every accepted input does not.
inline void require(bool condition, const char* what) {
  if (!condition) {
    std::fprintf(stderr, "property violated: %s\n", what);
    std::abort();
  }
}

}  // namespace mxtrain::fuzz
