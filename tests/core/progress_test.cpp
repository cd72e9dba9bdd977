// Progress lines: the text with its ETA, and quiet_for, which keeps quick work (a small
// checkpoint write) silent while long work still reports.
#include <gtest/gtest.h>

#include <thread>

#include "mxtrain/core/progress.hpp"

namespace mxtrain {
namespace {

TEST(Progress, TextGivesTheFractionTheRateAndAnEta) {
  const Progress progress("tune", 4, "trials");
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  const std::string text = progress.text(1);
  EXPECT_EQ(text.rfind("tune:  25% 1 trials / 4 trials, ", 0), 0u) << text;
  EXPECT_NE(text.find("trials/s, ETA "), std::string::npos) << text;
}

TEST(Progress, QuietWorkPrintsNothingAndLongWorkPrintsItsFinalLine) {
  testing::internal::CaptureStderr();
  Progress quick("checkpoint step 3", 1e6, "bytes", 0.0);
  quick.quiet_for(60);
  quick.update(5e5);
  quick.finish();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");

  testing::internal::CaptureStderr();
  Progress slow("checkpoint step 6", 1e6, "bytes", 0.0);
  slow.quiet_for(0.01);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  slow.update(5e5);
  slow.finish();
  const std::string printed = testing::internal::GetCapturedStderr();
  EXPECT_NE(printed.find("checkpoint step 6:  50% 500 kB / 1.0 MB"), std::string::npos) << printed;
  EXPECT_NE(printed.find("checkpoint step 6: 100% 1.0 MB / 1.0 MB"), std::string::npos) << printed;
  EXPECT_NE(printed.find(", took "), std::string::npos) << printed;
}

}  // namespace
}  // namespace mxtrain
