// MXTRAIN_LOG_LEVEL is applied: warn hides the info lines (the step lines), keeps the result;
// a value that is no level is an error that lists the levels.
#include <gtest/gtest.h>

#include <string>

#include "support/test_support.hpp"

namespace mxtrain {
namespace {

TEST(LogLevel, WarnHidesInfoLinesAndABadLevelIsAnError) {
  test::TempDir dir;
  const std::string corpus = test::make_test_corpus(dir.file("corpus"));
  const std::string train = test::binary_path() + " train --steps 2 -b 2 -s 32 -d cpu --set data.train=" + corpus +
                            "/train_*.bin --set data.val= -o ";
  std::string output;
  ASSERT_EQ(test::run_command(train + dir.file("a"), &output), 0) << output;
  EXPECT_NE(output.find("step 2/2 | loss"), std::string::npos) << output;
  ASSERT_EQ(test::run_command("MXTRAIN_LOG_LEVEL=warn " + train + dir.file("b"), &output), 0) << output;
  EXPECT_EQ(output.find("step 2/2 | loss"), std::string::npos) << output;
  EXPECT_NE(test::run_command("MXTRAIN_LOG_LEVEL=loud " + train + dir.file("c"), &output), 0);
  EXPECT_NE(output.find("MXTRAIN_LOG_LEVEL=loud is not a log level"), std::string::npos) << output;
  EXPECT_NE(output.find("debug, info, warn or error"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
