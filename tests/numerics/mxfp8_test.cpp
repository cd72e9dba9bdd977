// MXFP8: the E8M0 scale rules (RCEIL and OCP FLOOR) on hand-worked amax values, the OCP examples
// of docs/numerics-reference.md §2.6, block layout in both directions, the round-trip error bound, and the cuBLAS
// 128×4 swizzled scale layout against the documented offsets.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <set>
#include <vector>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/mxfp8.hpp"
#include "mxtrain/numerics/scale_layout.hpp"

namespace mxtrain::numerics {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

// Deterministic values with a wide dynamic range: sign * mantissa in [1, 2) * 2^[-20, 10].
std::vector<float> wide_range_values(size_t count, uint64_t seed) {
  std::vector<float> values(count);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  for (float& value : values) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    const float mantissa = 1.0f + static_cast<float>(state & 0xffffff) / 16777216.0f;
    const int exponent = static_cast<int>((state >> 24) % 31) - 20;
    value = ((state >> 40) & 1 ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
  }
  return values;
}

TEST(MxScale, RoundUpVersusFloorForE4m3) {
  struct Case {
    float amax;
    uint8_t round_up;
    uint8_t floor;
  };
  const Case cases[] = {
      {448.0f, 127, 127},  // exactly fmax: no scaling either way
      {480.0f, 128, 127},  // FLOOR keeps 2^0 and 480 saturates to 448; RCEIL moves up a binade
      {449.0f, 128, 127},
      {256.0f, 127, 127},
      {1.0f, 119, 119},    // 1/448 → 2^-8 up; floor(log2 1) - 8 = -8
      {1.75f, 119, 119},   // 1.75·2^8 = 448 exactly
      {1.76f, 120, 119},   // FLOOR: 1.76·2^8 = 450.6 saturates
      {0.0f, 0, 0},
      {1e-40f, 0, 0},      // FP32 subnormal
      {kInf, 254, 255},    // RCEIL saturates (cvt.rp.satfinite); FLOOR marks the block NaN
      {kNan, 255, 255},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(mx_scale(c.amax, Fp8Format::e4m3, E8m0Rounding::round_up), c.round_up) << c.amax;
    EXPECT_EQ(mx_scale(c.amax, Fp8Format::e4m3, E8m0Rounding::floor), c.floor) << c.amax;
  }
  EXPECT_EQ(mx_scale(57344.0f, Fp8Format::e5m2, E8m0Rounding::round_up), 127);
  EXPECT_EQ(mx_scale(57345.0f, Fp8Format::e5m2, E8m0Rounding::round_up), 128);
  EXPECT_EQ(mx_scale(65536.0f, Fp8Format::e5m2, E8m0Rounding::floor), 128);  // 2^16 / 2^15
}

TEST(MxScale, OcpFloorExamplesForE2m1) {
  // docs/numerics-reference.md §2.6: amax 3 → X = 2^-1 and 3 / X = 6 exactly; amax 3.0001 → 6.0002 clamps to 6;
  // amax 7 → X = 1 and 7 → 6.
  EXPECT_EQ(mx_scale_floor(3.0f, kE2m1MaxExponent), 126);
  EXPECT_EQ(float_to_e2m1(3.0f * mx_element_multiplier(126)), 0x7);
  EXPECT_EQ(mx_scale_floor(3.0001f, kE2m1MaxExponent), 126);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(3.0001f * mx_element_multiplier(126))), 6.0f);
  EXPECT_EQ(mx_scale_floor(7.0f, kE2m1MaxExponent), 127);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(7.0f * mx_element_multiplier(127))), 6.0f);
  EXPECT_EQ(mx_scale_floor(1e-38f, kE2m1MaxExponent), 0);  // clamped at 2^-127
}

TEST(MxScale, RoundUpIsCeilLog2OfAmaxOverMax) {
  // Where amax / 448 is a normal float, TE's product amax · fl(1/448) never crosses a power of two
  // that the exact quotient does not: the code is ceil(log2(amax / 448)) + 127, computed in double.
  // The block max then never saturates.
  for (uint64_t bits = 0x05000000u; bits <= 0x7f7fffffu; bits += 7919) {
    const float amax = std::bit_cast<float>(static_cast<uint32_t>(bits));
    int exponent = 0;
    const double mantissa = std::frexp(static_cast<double>(amax) / 448.0, &exponent);
    const int expected = std::min((mantissa == 0.5 ? exponent - 1 : exponent) + 127, 254);
    const uint8_t code = mx_scale_round_up(amax, Fp8Format::e4m3);
    ASSERT_EQ(code, expected) << amax;
    if (code < 254) {
      ASSERT_LE(amax * mx_element_multiplier(code), 448.0f) << amax;
    }
  }
}

TEST(MxScale, ElementMultiplier) {
  EXPECT_EQ(mx_element_multiplier(127), 1.0f);
  EXPECT_EQ(mx_element_multiplier(0), std::ldexp(1.0f, 127));
  EXPECT_EQ(mx_element_multiplier(254), std::ldexp(1.0f, -127));
  EXPECT_TRUE(std::isnan(mx_element_multiplier(255)));
}

TEST(Mxfp8, RowwiseBlocksHandWorked) {
  // 32 rows × 64 columns: row 0 holds the interesting blocks, every other row is zero.
  std::vector<float> input(32 * 64, 0.0f);
  for (int i = 0; i < 32; ++i) input[i] = 448.0f * static_cast<float>(i) / 31.0f;  // block (0,0): amax 448
  input[32] = 480.0f;   // block (0,1): amax 480
  input[33] = -3.0f;
  input[34] = std::ldexp(1.0f, -20);
  const Mxfp8Tensor rceil = quantize_mxfp8(input, 32, 64, {});
  ASSERT_EQ(rceil.scale_rows(), 32);
  ASSERT_EQ(rceil.scale_cols(), 2);
  EXPECT_EQ(rceil.scales[0], 127);
  EXPECT_EQ(rceil.scales[1], 128);
  EXPECT_EQ(rceil.data[31], 0x7e);
  EXPECT_EQ(rceil.data[32], float_to_e4m3(240.0f));
  EXPECT_EQ(rceil.data[33], float_to_e4m3(-1.5f));
  EXPECT_EQ(rceil.data[34], 0x00);  // 2^-21 is far below E4M3's 2^-9 after scaling by 2^-1
  for (size_t s = 2; s < rceil.scales.size(); ++s) EXPECT_EQ(rceil.scales[s], 0) << s;  // zero blocks
  const std::vector<float> back = dequantize_mxfp8(rceil);
  EXPECT_EQ(back[32], 480.0f);
  EXPECT_EQ(back[33], -3.0f);
  EXPECT_EQ(back[31], 448.0f);
  for (size_t i = 64; i < back.size(); ++i) ASSERT_EQ(back[i], 0.0f) << i;

  Mxfp8Options floor_options;
  floor_options.rounding = E8m0Rounding::floor;
  const Mxfp8Tensor floor = quantize_mxfp8(input, 32, 64, floor_options);
  EXPECT_EQ(floor.scales[1], 127);
  EXPECT_EQ(floor.data[32], 0x7e);  // 480 saturates to 448 under FLOOR
  EXPECT_EQ(dequantize_mxfp8(floor)[32], 448.0f);
}

TEST(Mxfp8, NonFiniteBlocks) {
  std::vector<float> input(32 * 32, 1.0f);
  input[0] = kNan;   // row 0's block
  input[32] = kInf;  // row 1's block
  const Mxfp8Tensor tensor = quantize_mxfp8(input, 32, 32, {});
  EXPECT_EQ(tensor.scales[0], 255);
  for (int i = 0; i < 32; ++i) EXPECT_EQ(tensor.data[i] & 0x7f, 0x7f) << i;  // the whole block is NaN
  EXPECT_EQ(tensor.scales[1], 254);
  EXPECT_EQ(tensor.data[32], 0x7e);  // inf · 2^-127 saturates
  EXPECT_EQ(tensor.data[33], 0x00);  // 1 · 2^-127 underflows
  const std::vector<float> back = dequantize_mxfp8(tensor);
  for (int i = 0; i < 32; ++i) EXPECT_TRUE(std::isnan(back[i])) << i;
  EXPECT_EQ(back[64], 1.0f);
}

TEST(Mxfp8, ColumnwiseIsRowwiseOfTheTranspose) {
  const int64_t rows = 64, cols = 96;
  const std::vector<float> input = wide_range_values(rows * cols, 3);
  std::vector<float> transposed(input.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) transposed[c * rows + r] = input[r * cols + c];
  }
  for (E8m0Rounding rounding : {E8m0Rounding::round_up, E8m0Rounding::floor}) {
    const Mxfp8Tensor columnwise = quantize_mxfp8(input, rows, cols, {Fp8Format::e4m3, BlockAxis::columnwise, rounding});
    const Mxfp8Tensor rowwise_t = quantize_mxfp8(transposed, cols, rows, {Fp8Format::e4m3, BlockAxis::rowwise, rounding});
    ASSERT_EQ(columnwise.scale_rows(), rows / 32);
    ASSERT_EQ(columnwise.scale_cols(), cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t c = 0; c < cols; ++c) {
        ASSERT_EQ(columnwise.data[r * cols + c], rowwise_t.data[c * rows + r]);
        if (r % 32 == 0) {
          ASSERT_EQ(columnwise.scales[(r / 32) * cols + c], rowwise_t.scales[c * (rows / 32) + r / 32]);
        }
      }
    }
  }
}

TEST(Mxfp8, RoundTripErrorBound) {
  const int64_t rows = 64, cols = 128;
  const std::vector<float> input = wide_range_values(rows * cols, 11);
  for (Fp8Format format : {Fp8Format::e4m3, Fp8Format::e5m2}) {
    for (BlockAxis axis : {BlockAxis::rowwise, BlockAxis::columnwise}) {
      const Mxfp8Tensor tensor = quantize_mxfp8(input, rows, cols, {format, axis, E8m0Rounding::round_up});
      const std::vector<float> back = dequantize_mxfp8(tensor);
      // Half an ulp: 2^-4 (E4M3) or 2^-3 (E5M2) relative for normals, and half the subnormal
      // spacing, 2^-10 or 2^-17, times the block's decode scale.
      const double relative = format == Fp8Format::e4m3 ? 0x1p-4 : 0x1p-3;
      const double absolute = format == Fp8Format::e4m3 ? 0x1p-10 : 0x1p-17;
      for (int64_t r = 0; r < rows; ++r) {
        for (int64_t c = 0; c < cols; ++c) {
          const int64_t scale_index = axis == BlockAxis::rowwise ? r * (cols / 32) + c / 32 : (r / 32) * cols + c;
          const double decode = e8m0_to_float(tensor.scales[scale_index]);
          const double x = input[r * cols + c];
          ASSERT_LE(std::fabs(back[r * cols + c] - x), std::max(std::fabs(x) * relative, absolute * decode)) << r << "," << c;
        }
      }
    }
  }
}

TEST(Mxfp8, RejectsShapesNotDivisibleBy32) {
  std::vector<float> input(48 * 32, 1.0f);
  EXPECT_THROW(quantize_mxfp8(input, 48, 32, {}), Error);
  EXPECT_THROW(quantize_mxfp8(input, 32, 48, {}), Error);
}

TEST(SwizzledScales, DocumentedOffsets) {
  // NVFP4 A of 128×128: 8 scales per row. nvmath's get_block_scale_offset examples.
  EXPECT_EQ(swizzled_scale_offset(5, 2, 8), 82);
  EXPECT_EQ(swizzled_scale_offset(5, 5, 8), 593);
  EXPECT_EQ(swizzled_scale_buffer_size(128, 8), 1024);
  // Within a tile: rows 0, 32, 64, 96 share a 16-byte line, 4 bytes each.
  EXPECT_EQ(swizzled_scale_offset(0, 0, 8), 0);
  EXPECT_EQ(swizzled_scale_offset(0, 1, 8), 1);
  EXPECT_EQ(swizzled_scale_offset(32, 0, 8), 4);
  EXPECT_EQ(swizzled_scale_offset(96, 3, 8), 15);
  EXPECT_EQ(swizzled_scale_offset(1, 0, 8), 16);
  EXPECT_EQ(swizzled_scale_offset(0, 4, 8), 512);   // next tile along K
  EXPECT_EQ(swizzled_scale_offset(128, 0, 8), 1024);  // next tile row
  // Padding: 130 rows and 3 columns take 256 × 4.
  EXPECT_EQ(swizzled_scale_buffer_size(130, 3), 1024);
  EXPECT_EQ(swizzled_scale_buffer_size(1, 1), 512);
}

TEST(SwizzledScales, IsAPermutationWithZeroPadding) {
  const int64_t scale_rows = 130, scale_cols = 6;
  std::vector<uint8_t> scales(scale_rows * scale_cols);
  for (size_t i = 0; i < scales.size(); ++i) scales[i] = static_cast<uint8_t>(1 + i % 255);
  const std::vector<uint8_t> swizzled = swizzle_scales(scales, scale_rows, scale_cols);
  ASSERT_EQ(static_cast<int64_t>(swizzled.size()), swizzled_scale_buffer_size(scale_rows, scale_cols));
  std::set<int64_t> offsets;
  for (int64_t r = 0; r < scale_rows; ++r) {
    for (int64_t c = 0; c < scale_cols; ++c) {
      const int64_t offset = swizzled_scale_offset(r, c, scale_cols);
      offsets.insert(offset);
      ASSERT_EQ(swizzled[offset], scales[r * scale_cols + c]);
    }
  }
  EXPECT_EQ(static_cast<int64_t>(offsets.size()), scale_rows * scale_cols);
  size_t nonzero = 0;
  for (uint8_t byte : swizzled) nonzero += byte != 0;
  EXPECT_EQ(nonzero, scales.size());  // every padding byte is 0
  // Same as the padded-matrix definition: (r/128, c/4) tiles, then (r%32, (r%128)/32, c%4).
  const int64_t padded_cols = 8;
  for (int64_t r = 0; r < 256; ++r) {
    for (int64_t c = 0; c < padded_cols; ++c) {
      const int64_t tile = (r / 128) * (padded_cols / 4) + c / 4;
      ASSERT_EQ(swizzled_scale_offset(r, c, scale_cols), tile * 512 + (r % 32) * 16 + ((r % 128) / 32) * 4 + c % 4);
    }
  }
}

}  // namespace
}  // namespace mxtrain::numerics
