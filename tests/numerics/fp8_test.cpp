// The scalar casts against hand-worked values from the format definitions and against a
// brute-force oracle: the nearest representable value (ties to the even code) found by search
// over a value table built here from the format definition, not from the code under test.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mxtrain/numerics/fp8.hpp"
#include "mxtrain/numerics/philox.hpp"

namespace mxtrain::numerics {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();

float pow2(int exponent) { return std::ldexp(1.0f, exponent); }

// A sign-magnitude minifloat described from first principles.
struct FormatTable {
  int mantissa_bits;
  int bias;
  uint32_t max_code;  // largest finite magnitude code
  uint8_t sign_bit;
  std::vector<double> values;  // values[code] for codes 0..max_code

  FormatTable(int mantissa, int exponent_bias, uint32_t largest, uint8_t sign)
      : mantissa_bits(mantissa), bias(exponent_bias), max_code(largest), sign_bit(sign) {
    for (uint32_t code = 0; code <= max_code; ++code) {
      const int exponent = static_cast<int>(code >> mantissa_bits);
      const int mantissa_field = static_cast<int>(code & ((1u << mantissa_bits) - 1));
      const double fraction = static_cast<double>(mantissa_field) / static_cast<double>(1 << mantissa_bits);
      values.push_back(exponent == 0 ? std::ldexp(fraction, 1 - bias) : std::ldexp(1.0 + fraction, exponent - bias));
    }
  }

  // Round to nearest, ties to the even code, saturating: the nearest finite value wins, so anything
  // above the maximum goes to the maximum.
  uint8_t nearest(float value) const {
    const double magnitude = std::fabs(static_cast<double>(value));
    const uint8_t sign = std::signbit(value) ? sign_bit : 0;
    if (std::isinf(value)) return sign | static_cast<uint8_t>(max_code);
    const auto upper = std::lower_bound(values.begin(), values.end(), magnitude);
    if (upper == values.end()) return sign | static_cast<uint8_t>(max_code);
    const uint32_t hi = static_cast<uint32_t>(upper - values.begin());
    if (*upper == magnitude || hi == 0) return sign | static_cast<uint8_t>(hi);
    const uint32_t lo = hi - 1;
    const double below = magnitude - values[lo], above = values[hi] - magnitude;
    uint32_t code = below < above ? lo : (above < below ? hi : ((lo & 1u) == 0 ? lo : hi));
    return sign | static_cast<uint8_t>(code);
  }
};

const FormatTable& e4m3_table() {
  static const FormatTable table(3, 7, 0x7e, 0x80);
  return table;
}
const FormatTable& e5m2_table() {
  static const FormatTable table(2, 15, 0x7b, 0x80);
  return table;
}
const FormatTable& e2m1_table() {
  static const FormatTable table(1, 1, 0x7, 0x8);
  return table;
}

// Inputs that probe every rounding decision: a strided sweep of all positive floats, and for each
// pair of neighbouring representable values the values, their midpoint and the floats around it.
std::vector<float> probe_inputs(const FormatTable& table) {
  std::vector<float> inputs;
  for (uint64_t bits = 0; bits < 0x7f800000u; bits += 4099) inputs.push_back(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  for (size_t code = 0; code < table.values.size(); ++code) {
    const float value = static_cast<float>(table.values[code]);
    inputs.push_back(value);
    inputs.push_back(std::nextafter(value, kInf));
    inputs.push_back(std::nextafter(value, 0.0f));
    const double next = code + 1 < table.values.size() ? table.values[code + 1] : table.values[code] * 1.25;
    const float midpoint = static_cast<float>((table.values[code] + next) / 2);
    inputs.push_back(midpoint);
    inputs.push_back(std::nextafter(midpoint, kInf));
    inputs.push_back(std::nextafter(midpoint, 0.0f));
  }
  inputs.push_back(std::numeric_limits<float>::max());
  inputs.push_back(std::numeric_limits<float>::denorm_min());
  const size_t positive = inputs.size();
  for (size_t i = 0; i < positive; ++i) inputs.push_back(-inputs[i]);
  return inputs;
}

// ---- E4M3 --------------------------------------------------------------------------------------------

TEST(Fp8E4m3, HandWorkedValues) {
  EXPECT_EQ(float_to_e4m3(0.0f), 0x00);
  EXPECT_EQ(float_to_e4m3(-0.0f), 0x80);
  EXPECT_EQ(float_to_e4m3(1.0f), 0x38);
  EXPECT_EQ(float_to_e4m3(-2.0f), 0xc0);
  EXPECT_EQ(float_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(pow2(-6)), 0x08);              // smallest normal
  EXPECT_EQ(float_to_e4m3(pow2(-9)), 0x01);              // smallest subnormal
  EXPECT_EQ(float_to_e4m3(7 * pow2(-9)), 0x07);          // largest subnormal
  EXPECT_EQ(float_to_e4m3(-3 * pow2(-9)), 0x83);
}

TEST(Fp8E4m3, TiesGoToEven) {
  EXPECT_EQ(float_to_e4m3(pow2(-10)), 0x00);        // half the smallest subnormal: to 0 (even)
  EXPECT_EQ(float_to_e4m3(std::nextafter(pow2(-10), 1.0f)), 0x01);
  EXPECT_EQ(float_to_e4m3(3 * pow2(-10)), 0x02);    // 1.5 quanta: to 2
  EXPECT_EQ(float_to_e4m3(7.5f * pow2(-9)), 0x08);  // between largest subnormal and smallest normal
  EXPECT_EQ(float_to_e4m3(1.0625f), 0x38);          // between 1 and 1.125: to 1
  EXPECT_EQ(float_to_e4m3(1.1875f), 0x3a);          // between 1.125 and 1.25: to 1.25
  EXPECT_EQ(float_to_e4m3(17.0f), 0x58);            // between 16 and 18: to 16
  EXPECT_EQ(float_to_e4m3(19.0f), 0x5a);            // between 18 and 20: to 20
  EXPECT_EQ(float_to_e4m3(432.0f), 0x7e);           // between 416 and 448: to 448
  EXPECT_EQ(float_to_e4m3(std::nextafter(432.0f, 0.0f)), 0x7d);
}

TEST(Fp8E4m3, SaturatesFiniteOverflowAndInfinity) {
  EXPECT_EQ(float_to_e4m3(449.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(480.0f), 0x7e);
  EXPECT_EQ(float_to_e4m3(1e30f), 0x7e);
  EXPECT_EQ(float_to_e4m3(-1e30f), 0xfe);
  EXPECT_EQ(float_to_e4m3(kInf), 0x7e);
  EXPECT_EQ(float_to_e4m3(-kInf), 0xfe);
  EXPECT_EQ(float_to_e4m3(std::numeric_limits<float>::max()), 0x7e);
}

TEST(Fp8E4m3, NanStaysNan) {
  EXPECT_EQ(float_to_e4m3(kNan), 0x7f);
  EXPECT_EQ(float_to_e4m3(-kNan), 0xff);
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7f)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xff)));
}

TEST(Fp8E4m3, DecodesEveryCodeAsTheFormatDefines) {
  const FormatTable& table = e4m3_table();
  for (uint32_t code = 0; code <= table.max_code; ++code) {
    EXPECT_EQ(e4m3_to_float(static_cast<uint8_t>(code)), static_cast<float>(table.values[code])) << code;
    EXPECT_EQ(e4m3_to_float(static_cast<uint8_t>(code | 0x80)), -static_cast<float>(table.values[code])) << code;
  }
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x01), pow2(-9));
  EXPECT_EQ(e4m3_to_float(0x7e), 448.0f);
}

TEST(Fp8E4m3, EveryCodeRoundTrips) {
  for (int code = 0; code < 256; ++code) {
    if ((code & 0x7f) == 0x7f) continue;  // NaN
    EXPECT_EQ(float_to_e4m3(e4m3_to_float(static_cast<uint8_t>(code))), code) << code;
  }
}

TEST(Fp8E4m3, MatchesBruteForceNearestValue) {
  const FormatTable& table = e4m3_table();
  int mismatches = 0;
  for (float value : probe_inputs(table)) {
    if (float_to_e4m3(value) != table.nearest(value) && ++mismatches < 10) {
      ADD_FAILURE() << "value " << value << ": got " << int(float_to_e4m3(value)) << ", expected " << int(table.nearest(value));
    }
  }
  EXPECT_EQ(mismatches, 0);
}

// ---- E5M2 --------------------------------------------------------------------------------------------

TEST(Fp8E5m2, HandWorkedValues) {
  EXPECT_EQ(float_to_e5m2(0.0f), 0x00);
  EXPECT_EQ(float_to_e5m2(-0.0f), 0x80);
  EXPECT_EQ(float_to_e5m2(1.0f), 0x3c);
  EXPECT_EQ(float_to_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(float_to_e5m2(pow2(-14)), 0x04);  // smallest normal
  EXPECT_EQ(float_to_e5m2(pow2(-16)), 0x01);  // smallest subnormal
  EXPECT_EQ(float_to_e5m2(pow2(-17)), 0x00);  // tie: to 0
  EXPECT_EQ(float_to_e5m2(1.5f * pow2(-17)), 0x01);
  EXPECT_EQ(float_to_e5m2(1.125f), 0x3c);     // between 1 and 1.25: to 1
  EXPECT_EQ(float_to_e5m2(1.375f), 0x3e);     // between 1.25 and 1.5: to 1.5
}

TEST(Fp8E5m2, SaturatesAndKeepsNan) {
  EXPECT_EQ(float_to_e5m2(61440.0f), 0x7b);  // halfway to the would-be 65536
  EXPECT_EQ(float_to_e5m2(65536.0f), 0x7b);
  EXPECT_EQ(float_to_e5m2(kInf), 0x7b);
  EXPECT_EQ(float_to_e5m2(-kInf), 0xfb);
  EXPECT_EQ(float_to_e5m2(kNan), 0x7e);
  EXPECT_EQ(float_to_e5m2(-kNan), 0xfe);
  EXPECT_EQ(e5m2_to_float(0x7c), kInf);
  EXPECT_EQ(e5m2_to_float(0xfc), -kInf);
  for (uint8_t code : {0x7d, 0x7e, 0x7f, 0xfd, 0xfe, 0xff}) EXPECT_TRUE(std::isnan(e5m2_to_float(code))) << int(code);
}

TEST(Fp8E5m2, DecodesAndRoundTripsEveryFiniteCode) {
  const FormatTable& table = e5m2_table();
  for (uint32_t code = 0; code <= table.max_code; ++code) {
    EXPECT_EQ(e5m2_to_float(static_cast<uint8_t>(code)), static_cast<float>(table.values[code])) << code;
    EXPECT_EQ(float_to_e5m2(e5m2_to_float(static_cast<uint8_t>(code))), code);
    EXPECT_EQ(float_to_e5m2(e5m2_to_float(static_cast<uint8_t>(code | 0x80))), code | 0x80);
  }
}

TEST(Fp8E5m2, MatchesBruteForceNearestValue) {
  const FormatTable& table = e5m2_table();
  int mismatches = 0;
  for (float value : probe_inputs(table)) {
    if (float_to_e5m2(value) != table.nearest(value) && ++mismatches < 10) {
      ADD_FAILURE() << "value " << value << ": got " << int(float_to_e5m2(value)) << ", expected " << int(table.nearest(value));
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(Fp8, FormatDispatch) {
  EXPECT_EQ(float_to_fp8(448.0f, Fp8Format::e4m3), 0x7e);
  EXPECT_EQ(float_to_fp8(448.0f, Fp8Format::e5m2), float_to_e5m2(448.0f));
  EXPECT_EQ(fp8_to_float(0x3c, Fp8Format::e5m2), 1.0f);
  EXPECT_EQ(fp8_max(Fp8Format::e4m3), 448.0f);
  EXPECT_EQ(fp8_max(Fp8Format::e5m2), 57344.0f);
}

// ---- E8M0 --------------------------------------------------------------------------------------------

TEST(E8m0, Decode) {
  EXPECT_EQ(e8m0_to_float(127), 1.0f);
  EXPECT_EQ(e8m0_to_float(128), 2.0f);
  EXPECT_EQ(e8m0_to_float(0), std::ldexp(1.0f, -127));  // an FP32 subnormal, exact
  EXPECT_EQ(e8m0_to_float(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(e8m0_to_float(255)));
}

TEST(E8m0, RoundUpHandWorked) {
  EXPECT_EQ(float_to_e8m0_round_up(1.0f), 127);
  EXPECT_EQ(float_to_e8m0_round_up(std::nextafter(1.0f, 2.0f)), 128);
  EXPECT_EQ(float_to_e8m0_round_up(2.0f), 128);
  EXPECT_EQ(float_to_e8m0_round_up(-3.0f), 129);  // the sign is ignored
  EXPECT_EQ(float_to_e8m0_round_up(0.0f), 0);
  EXPECT_EQ(float_to_e8m0_round_up(pow2(-127)), 0);
  EXPECT_EQ(float_to_e8m0_round_up(std::nextafter(pow2(-127), 1.0f)), 1);
  EXPECT_EQ(float_to_e8m0_round_up(pow2(-126)), 1);
  EXPECT_EQ(float_to_e8m0_round_up(pow2(-140)), 0);
  EXPECT_EQ(float_to_e8m0_round_up(pow2(127)), 254);
  EXPECT_EQ(float_to_e8m0_round_up(1.5f * pow2(127)), 254);  // saturates
  EXPECT_EQ(float_to_e8m0_round_up(std::numeric_limits<float>::max()), 254);
  EXPECT_EQ(float_to_e8m0_round_up(kInf), 254);
  EXPECT_EQ(float_to_e8m0_round_up(kNan), 255);
}

TEST(E8m0, RoundUpIsCeilLog2) {
  // For every value above 2^-127 and up to 2^127: code - 127 = ceil(log2 v), computed in double.
  for (uint64_t bits = 0x00400001u; bits <= 0x7f000000u; bits += 1021) {
    const float value = std::bit_cast<float>(static_cast<uint32_t>(bits));
    int exponent = 0;
    const double mantissa = std::frexp(static_cast<double>(value), &exponent);  // value = mantissa * 2^exponent, [0.5, 1)
    const int ceil_log2 = mantissa == 0.5 ? exponent - 1 : exponent;
    ASSERT_EQ(float_to_e8m0_round_up(value), ceil_log2 + 127) << value;
  }
}

TEST(E8m0, RoundDownHandWorked) {
  EXPECT_EQ(float_to_e8m0_round_down(1.0f), 127);
  EXPECT_EQ(float_to_e8m0_round_down(std::nextafter(2.0f, 0.0f)), 127);
  EXPECT_EQ(float_to_e8m0_round_down(3.0f), 128);
  EXPECT_EQ(float_to_e8m0_round_down(0.0f), 0);
  EXPECT_EQ(float_to_e8m0_round_down(pow2(-130)), 0);  // FP32 subnormals count as 2^-127
  EXPECT_EQ(float_to_e8m0_round_down(std::numeric_limits<float>::max()), 254);
  EXPECT_EQ(float_to_e8m0_round_down(kInf), 255);
  EXPECT_EQ(float_to_e8m0_round_down(kNan), 255);
}

// ---- E2M1 --------------------------------------------------------------------------------------------

TEST(E2m1, DecodesTheSixteenCodes) {
  const float expected[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  for (int code = 0; code < 16; ++code) {
    EXPECT_EQ(e2m1_to_float(static_cast<uint8_t>(code)), expected[code]) << code;
    EXPECT_EQ(std::signbit(e2m1_to_float(static_cast<uint8_t>(code))), code >= 8) << code;
    EXPECT_EQ(float_to_e2m1(expected[code]), code) << code;
  }
}

TEST(E2m1, TiesFromTheSpec) {
  // docs/numerics-reference.md §2.6
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(0.25f)), 0.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(0.75f)), 1.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(1.25f)), 1.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(1.75f)), 2.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(2.5f)), 2.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(3.5f)), 4.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(5.0f)), 4.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(6.5f)), 6.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(7.0f)), 6.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(-9.0f)), -6.0f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(std::nextafter(0.25f, 1.0f))), 0.5f);
  EXPECT_EQ(e2m1_to_float(float_to_e2m1(std::nextafter(5.0f, 6.0f))), 6.0f);
}

TEST(E2m1, SpecialValues) {
  EXPECT_EQ(float_to_e2m1(0.0f), 0x0);
  EXPECT_EQ(float_to_e2m1(-0.0f), 0x8);
  EXPECT_EQ(float_to_e2m1(-0.1f), 0x8);  // rounds to zero, keeps the sign
  EXPECT_EQ(float_to_e2m1(kInf), 0x7);
  EXPECT_EQ(float_to_e2m1(-kInf), 0xf);
  EXPECT_EQ(float_to_e2m1(kNan), 0x7);   // no NaN in E2M1: +6, as cuda_fp4.hpp
  EXPECT_EQ(float_to_e2m1(-kNan), 0x7);
}

TEST(E2m1, MatchesBruteForceNearestValue) {
  const FormatTable& table = e2m1_table();
  int mismatches = 0;
  for (float value : probe_inputs(table)) {
    if (float_to_e2m1(value) != table.nearest(value) && ++mismatches < 10) {
      ADD_FAILURE() << "value " << value << ": got " << int(float_to_e2m1(value)) << ", expected " << int(table.nearest(value));
    }
  }
  EXPECT_EQ(mismatches, 0);
}

TEST(E2m1Stochastic, ThresholdIsTheDistanceFromTheLowerNeighbour) {
  // 0.75 is half way from 0.5 to 1: the threshold is 2^31.
  EXPECT_EQ(float_to_e2m1_stochastic(0.75f, 0x7fffffffu), 0x2);  // below the threshold: up to 1
  EXPECT_EQ(float_to_e2m1_stochastic(0.75f, 0x80000000u), 0x1);  // at it: down to 0.5
  // 2.25 is a quarter of the way from 2 to 3: threshold 2^30.
  EXPECT_EQ(float_to_e2m1_stochastic(2.25f, 0x3fffffffu), 0x5);
  EXPECT_EQ(float_to_e2m1_stochastic(2.25f, 0x40000000u), 0x4);
  // 5 is half way from 4 to 6.
  EXPECT_EQ(float_to_e2m1_stochastic(5.0f, 0u), 0x7);
  EXPECT_EQ(float_to_e2m1_stochastic(5.0f, 0xffffffffu), 0x6);
  // 0.1 is 0.2 of the way from 0 to 0.5; negative values round in magnitude and keep the sign.
  EXPECT_EQ(float_to_e2m1_stochastic(-0.75f, 0u), 0xa);
  EXPECT_EQ(float_to_e2m1_stochastic(-0.75f, 0xffffffffu), 0x9);
  EXPECT_EQ(float_to_e2m1_stochastic(-0.1f, 0xffffffffu), 0x8);
  EXPECT_EQ(float_to_e2m1_stochastic(1.9999999f, 0u), 0x4);
}

TEST(E2m1Stochastic, RepresentableValuesAndSpecials) {
  const float grid[8] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6};
  for (uint32_t word : {0u, 1u, 0x80000000u, 0xffffffffu}) {
    for (int code = 0; code < 8; ++code) {
      EXPECT_EQ(float_to_e2m1_stochastic(grid[code], word), code);
      EXPECT_EQ(float_to_e2m1_stochastic(-grid[code], word), code | 0x8);
    }
    EXPECT_EQ(float_to_e2m1_stochastic(6.5f, word), 0x7);
    EXPECT_EQ(float_to_e2m1_stochastic(-1e9f, word), 0xf);
    EXPECT_EQ(float_to_e2m1_stochastic(kInf, word), 0x7);
    EXPECT_EQ(float_to_e2m1_stochastic(kNan, word), 0x7);
  }
}

TEST(E2m1Stochastic, UnbiasedOverManyDraws) {
  // Mean of N rounded draws against the input, within 5 standard errors; the words come from a
  // fixed Philox stream, so the test is deterministic.
  constexpr int kDraws = 200000;
  for (float value : {0.1f, 0.3f, 0.8f, 1.1f, 1.9f, 2.3f, 3.7f, 4.5f, 5.9f, -2.6f}) {
    const double magnitude = std::fabs(value);
    const double lo = magnitude < 2 ? std::floor(magnitude * 2) / 2 : (magnitude < 4 ? std::floor(magnitude) : 4.0);
    const double gap = magnitude < 2 ? 0.5 : (magnitude < 4 ? 1.0 : 2.0);
    const double p = (magnitude - lo) / gap;
    double sum = 0;
    for (int i = 0; i < kDraws; ++i) {
      sum += e2m1_to_float(float_to_e2m1_stochastic(value, philox_random_word(2024, 7, static_cast<uint64_t>(i))));
    }
    const double standard_error = gap * std::sqrt(p * (1 - p) / kDraws);
    EXPECT_NEAR(sum / kDraws, value, 5 * standard_error + 1e-12) << value;
  }
}

}  // namespace
}  // namespace mxtrain::numerics
