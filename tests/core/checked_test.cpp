// Size arithmetic on user numbers reports overflow (core/checked.hpp) instead of wrapping, and
// the host's available memory is read from /proc/meminfo (core/host_memory.hpp).
#include <gtest/gtest.h>

#include <limits>

#include "mxtrain/core/checked.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/host_memory.hpp"
#include "mxtrain/core/tensor.hpp"

namespace mxtrain {
namespace {

constexpr int64_t kMax = std::numeric_limits<int64_t>::max();

TEST(Checked, ExactResultsWhereTheyFit) {
  EXPECT_EQ(checked_mul(int64_t{1} << 31, int64_t{1} << 31, "x"), int64_t{1} << 62);
  EXPECT_EQ(checked_add(kMax - 1, 1, "x"), kMax);
  EXPECT_EQ(checked_product({3, 5, 7, 11}, "x"), 1155);
  EXPECT_EQ(checked_mul(-4, 5, "x"), -20);
}

TEST(Checked, OverflowIsAConfigErrorNamingWhatOverflowed) {
  try {
    checked_mul(int64_t{1} << 32, int64_t{1} << 32, "the parameter count");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::config);
    EXPECT_NE(std::string(error.what()).find("the parameter count overflows"), std::string::npos) << error.what();
    EXPECT_NE(error.advice().find("model.hidden"), std::string::npos);
  }
  EXPECT_THROW(checked_add(kMax, 1, "x"), Error);
  EXPECT_THROW(checked_product({int64_t{1} << 40, int64_t{1} << 20, 8}, "x"), Error);
}

TEST(Checked, ShapeElementCountIsBounded) {
  EXPECT_EQ((Shape{1 << 20, 1 << 20, 1 << 16}).numel(), int64_t{1} << 56);
  // 2^57 elements: their bytes at 32 bits each would not fit in 64 bits.
  EXPECT_THROW((Shape{1 << 20, 1 << 20, 1 << 17}).numel(), Error);
  // A product that wraps int64 (2^64 would be 0): reported, not wrapped.
  EXPECT_THROW((Shape{int64_t{1} << 32, int64_t{1} << 32}).numel(), Error);
}

TEST(HostMemory, ParsesMemAvailable) {
  EXPECT_EQ(parse_mem_available("MemTotal:       16384 kB\nMemFree:  1 kB\nMemAvailable:    2048 kB\n"),
            uint64_t{2048} * 1024);
  EXPECT_EQ(parse_mem_available("MemTotal: 16384 kB\n"), 0u);
  EXPECT_EQ(parse_mem_available(""), 0u);
  // This machine has a /proc/meminfo with the line (Linux 3.14 and later).
  EXPECT_GT(host_available_bytes(), 0u);
}

}  // namespace
}  // namespace mxtrain
