// Digit grouping, as messages and the config reference print numbers.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>

#include "mxtrain/core/log.hpp"

namespace mxtrain {
namespace {

TEST(WithCommas, GroupsTheIntegerPartAndKeepsTheDecimals) {
  EXPECT_EQ(log::with_commas(43021), "43,021");
  EXPECT_EQ(log::with_commas(999), "999");
  EXPECT_EQ(log::with_commas(-1234.5, 1), "-1,234.5");
  EXPECT_EQ(log::with_commas(0.25, 2), "0.25");
}

TEST(WithCommas, IntegersAreExactOverAllOfInt64) {
  EXPECT_EQ(log::integer_with_commas(0), "0");
  EXPECT_EQ(log::integer_with_commas(1000), "1,000");
  EXPECT_EQ(log::integer_with_commas(-1234567), "-1,234,567");
  // A double would print 2^53 + 1 and INT64_MAX rounded.
  EXPECT_EQ(log::integer_with_commas((int64_t{1} << 53) + 1), "9,007,199,254,740,993");
  EXPECT_EQ(log::integer_with_commas(std::numeric_limits<int64_t>::max()), "9,223,372,036,854,775,807");
  EXPECT_EQ(log::integer_with_commas(std::numeric_limits<int64_t>::min()), "-9,223,372,036,854,775,808");
}

}  // namespace
}  // namespace mxtrain
