// write_file_atomically: the whole new contents or the old file, never a part; errors name the file.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"
#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace mxtrain {
namespace {

TEST(WriteFileAtomically, WritesAndReplacesWholeContents) {
  test::TempDir dir;
  const fs::path path = dir.file("out.json");
  write_file_atomically(path.string(), "first\n");
  EXPECT_EQ(test::read_file(path), "first\n");
  const std::string large(3 << 20, 'x');
  write_file_atomically(path.string(), large);
  EXPECT_EQ(test::read_file(path), large);
  EXPECT_FALSE(fs::exists(path.string() + ".tmp"));
}

TEST(WriteFileAtomically, AFailedWriteKeepsTheOldFileAndNamesThePath) {
  test::TempDir dir;
  const fs::path path = dir.file("config.toml");
  write_file_atomically(path.string(), "old\n");
  fs::create_directories(path.string() + ".tmp");  // the temporary cannot be opened (a directory)
  try {
    write_file_atomically(path.string(), "new\n", "the advice");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::system);
    EXPECT_NE(std::string(error.what()).find(path.string()), std::string::npos) << error.what();
    EXPECT_EQ(error.advice(), "the advice");
  }
  EXPECT_EQ(test::read_file(path), "old\n");
}

TEST(WriteFileAtomically, AMissingDirectoryIsAnErrorThatNamesTheFile) {
  const std::string path = "/nonexistent-mxtrain-dir/sub/out.txt";
  try {
    write_file_atomically(path, "x");
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace mxtrain
