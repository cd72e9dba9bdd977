// Helpers shared by the data tests: catching an mxtrain::Error's full text, and editing bytes
// of a file in place to forge corrupt shards.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <string>

#include "mxtrain/core/error.hpp"

// Checks that `part` occurs in `text`, printing the whole text when it does not.
#define EXPECT_CONTAINS(text, part)                                              \
  EXPECT_NE(std::string(text).find(part), std::string::npos) << "missing \"" << (part) \
                                                              << "\" in:\n" << (text)

namespace mxtrain::data_test {

// The full message (what + fix) of the Error that `action` throws; a test failure if none.
template <typename Action>
std::string error_text(Action&& action, ErrorKind expected_kind = ErrorKind::data) {
  try {
    action();
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), expected_kind) << error.full_message();
    return error.full_message();
  }
  ADD_FAILURE() << "expected an mxtrain::Error";
  return {};
}

inline void overwrite_int32(const std::string& path, int64_t offset, int32_t value) {
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  ASSERT_TRUE(file.good()) << path;
  file.seekp(offset);
  file.write(reinterpret_cast<const char*>(&value), sizeof value);
  ASSERT_TRUE(file.good()) << path;
}

inline void write_text_file(const std::string& path, const std::string& contents) {
  std::ofstream file(path, std::ios::binary);
  file << contents;
  ASSERT_TRUE(file.good()) << path;
}

inline std::string read_text_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
}

}  // namespace mxtrain::data_test
