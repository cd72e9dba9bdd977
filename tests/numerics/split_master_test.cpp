// The split master (an f32 weight as its bf16 high half and the 16 bits below): joining the
// halves gives back the f32 bits for every non-NaN value, and the high half is the bf16 value
// torch's round-to-nearest-even cast gives, except at the one tie per even bf16 value that no
// 16-bit low half can tell apart from the other (checked against core/dtype's cast).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "mxtrain/core/dtype.hpp"
#include "mxtrain/numerics/split_master.hpp"

namespace mxtrain::numerics {
namespace {

// The f32 value's bits through the split and back; and the high half against RNE.
void check(uint32_t bits) {
  const float value = bits_to_float(bits);
  const SplitMaster halves = split_master(value);
  if (is_nan(value)) {
    EXPECT_TRUE(std::isnan(bits_to_float(static_cast<uint32_t>(halves.high) << 16))) << std::hex << bits;
    EXPECT_TRUE(std::isnan(join_master(halves.high, halves.low))) << std::hex << bits;
    return;
  }
  ASSERT_EQ(float_to_bits(join_master(halves.high, halves.low)), bits) << std::hex << bits;
  const uint16_t nearest_even = float_to_bf16(value);
  const uint32_t low = bits & 0xffffu, top = bits >> 16;
  if (low == 0x8000u && top % 2 == 0) {
    EXPECT_EQ(halves.high, nearest_even + 1) << std::hex << bits << ": the tie goes away from zero";
  } else {
    EXPECT_EQ(halves.high, nearest_even) << std::hex << bits;
  }
}

TEST(SplitMaster, EveryHighHalfWithItsBoundaryLowHalves) {
  for (uint32_t top = 0; top <= 0xffffu; ++top)
    for (uint32_t low : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xfffeu, 0xffffu}) check((top << 16) | low);
}

TEST(SplitMaster, ASpreadOfAllBitPatterns) {
  // Every 65,537th pattern (coprime to 2^16: all low halves, all high halves visited).
  for (uint64_t bits = 0; bits <= 0xffffffffull; bits += 65537) check(static_cast<uint32_t>(bits));
}

TEST(SplitMaster, SpecialValues) {
  const float inf = std::numeric_limits<float>::infinity();
  for (float value : {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::max(), -std::numeric_limits<float>::max(),
                      std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(), 1.0f, -1.0f})
    check(float_to_bits(value));
  // The largest finite value rounds to infinity, as torch's cast does, and still joins exactly.
  EXPECT_EQ(split_master(std::numeric_limits<float>::max()).high, 0x7f80u);
  // A signalling NaN whose payload is in the low half only becomes the quiet NaN.
  EXPECT_EQ(split_master(bits_to_float(0x7f800001u)).high, 0x7fc0u);
  EXPECT_EQ(split_master(bits_to_float(0xffff0000u)).high, 0xffc0u);
}

}  // namespace
}  // namespace mxtrain::numerics
