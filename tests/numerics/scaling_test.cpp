// Per-tensor FP8 recipes: delayed scaling's history and scale rule step by step, worked by hand
// from docs/numerics-reference.md §2.1, and current scaling's edge cases from §2.2.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/scale_rules.hpp"
#include "mxtrain/numerics/scaling.hpp"

namespace mxtrain::numerics {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kFloatMax = std::numeric_limits<float>::max();

TEST(Fp8FormatPolicy, HybridUsesE5m2ForGradients) {
  EXPECT_EQ(fp8_format_for(Fp8FormatPolicy::hybrid, TensorDirection::forward), Fp8Format::e4m3);
  EXPECT_EQ(fp8_format_for(Fp8FormatPolicy::hybrid, TensorDirection::backward), Fp8Format::e5m2);
  EXPECT_EQ(fp8_format_for(Fp8FormatPolicy::e4m3, TensorDirection::backward), Fp8Format::e4m3);
}

DelayedScalingConfig history_of(int length, AmaxAlgorithm algorithm = AmaxAlgorithm::max, int margin = 0) {
  DelayedScalingConfig config;
  config.amax_history_length = length;
  config.algorithm = algorithm;
  config.margin = margin;
  return config;
}

TEST(DelayedScaling, StartsWithScaleOneAndZeroHistory) {
  DelayedScaling scaling(history_of(4), {TensorDirection::forward, TensorDirection::backward});
  ASSERT_EQ(scaling.tensor_count(), 2);
  for (int tensor = 0; tensor < 2; ++tensor) {
    EXPECT_EQ(scaling.scale(tensor), 1.0f);
    EXPECT_EQ(scaling.scale_inverse(tensor), 1.0f);
    for (int slot = 0; slot < 4; ++slot) EXPECT_EQ(scaling.history(slot, tensor), 0.0f);
  }
  EXPECT_EQ(scaling.format(0), Fp8Format::e4m3);
  EXPECT_EQ(scaling.format(1), Fp8Format::e5m2);
}

TEST(DelayedScaling, MaxOverTheWindowThenRoll) {
  DelayedScaling scaling(history_of(3), {TensorDirection::forward});
  // step 1: amax 2 → window {2, 0, 0} → scale 448 / 2 = 224; history rolls to {0, 2, 0}
  scaling.record_amax(0, 2.0f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 224.0f);
  EXPECT_EQ(scaling.scale_inverse(0), 1.0f / 224.0f);
  EXPECT_EQ(scaling.history(0, 0), 0.0f);
  EXPECT_EQ(scaling.history(1, 0), 2.0f);
  EXPECT_EQ(scaling.history(2, 0), 0.0f);
  // step 2: amax 0.5 → window {0.5, 2, 0} → still 224; history {0, 0.5, 2}
  scaling.record_amax(0, 0.5f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 224.0f);
  EXPECT_EQ(scaling.history(1, 0), 0.5f);
  EXPECT_EQ(scaling.history(2, 0), 2.0f);
  // step 3: amax 1 → window {1, 0.5, 2} → 224; the 2 then falls off: {0, 1, 0.5}
  scaling.record_amax(0, 1.0f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 224.0f);
  EXPECT_EQ(scaling.history(1, 0), 1.0f);
  EXPECT_EQ(scaling.history(2, 0), 0.5f);
  // step 4: amax 0.25 → window {0.25, 1, 0.5} → 448
  scaling.record_amax(0, 0.25f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 448.0f);
}

TEST(DelayedScaling, MostRecentUsesOnlyTheNewestAmax) {
  DelayedScaling scaling(history_of(4, AmaxAlgorithm::most_recent), {TensorDirection::forward});
  scaling.record_amax(0, 4.0f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 112.0f);
  scaling.record_amax(0, 0.5f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 896.0f);  // the 4 in slot 1 is ignored
}

TEST(DelayedScaling, MarginDividesByPowersOfTwo) {
  DelayedScaling scaling(history_of(2, AmaxAlgorithm::max, 2), {TensorDirection::forward, TensorDirection::backward});
  scaling.record_amax(0, 1.0f);
  scaling.record_amax(1, 1.0f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 112.0f);     // 448 / 4
  EXPECT_EQ(scaling.scale(1), 14336.0f);   // 57344 / 4: gradients are E5M2 under HYBRID
}

TEST(DelayedScaling, SeveralCastsInOneStepKeepTheirMax) {
  DelayedScaling scaling(history_of(2), {TensorDirection::forward});
  scaling.record_amax(0, 1.0f);
  scaling.record_amax(0, 7.0f);
  scaling.record_amax(0, 3.0f);
  EXPECT_EQ(scaling.history(0, 0), 7.0f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 64.0f);
}

TEST(DelayedScaling, ZeroInfOrNanWindowKeepsThePreviousScale) {
  DelayedScaling scaling(history_of(2), {TensorDirection::forward});
  scaling.update();  // window all zero: keeps the initial 1
  EXPECT_EQ(scaling.scale(0), 1.0f);
  scaling.record_amax(0, 8.0f);
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 56.0f);
  scaling.record_amax(0, kInf);
  scaling.update();  // window {inf, 8}
  EXPECT_EQ(scaling.scale(0), 56.0f);
  scaling.record_amax(0, 1.0f);
  scaling.update();  // window {1, inf}: inf still inside
  EXPECT_EQ(scaling.scale(0), 56.0f);
  scaling.record_amax(0, 1.0f);
  scaling.update();  // window {1, 1}
  EXPECT_EQ(scaling.scale(0), 448.0f);
  scaling.record_amax(0, 2.0f);
  scaling.record_amax(0, kNan);  // a NaN sticks in slot 0
  scaling.record_amax(0, 3.0f);
  EXPECT_TRUE(std::isnan(scaling.history(0, 0)));
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 448.0f);
}

TEST(DelayedScaling, TinyAmaxGivesFloatMax) {
  DelayedScaling scaling(history_of(1), {TensorDirection::forward});
  scaling.record_amax(0, std::numeric_limits<float>::denorm_min());
  scaling.update();
  EXPECT_EQ(scaling.scale(0), kFloatMax);
}

TEST(DelayedScaling, AllReducedNewestAmaxesDriveTheUpdate) {
  DelayedScaling scaling(history_of(2), {TensorDirection::forward, TensorDirection::forward});
  scaling.record_amax(0, 1.0f);
  scaling.record_amax(1, 2.0f);
  std::span<float> newest = scaling.newest_amaxes();
  ASSERT_EQ(newest.size(), 2u);
  EXPECT_EQ(newest[0], 1.0f);
  EXPECT_EQ(newest[1], 2.0f);
  newest[0] = 4.0f;  // another rank saw a larger amax
  scaling.update();
  EXPECT_EQ(scaling.scale(0), 112.0f);
  EXPECT_EQ(scaling.scale(1), 224.0f);
}

TEST(DelayedScaling, RejectsAnEmptyHistory) {
  EXPECT_THROW(DelayedScaling(history_of(0), {TensorDirection::forward}), Error);
}

TEST(DelayedScaleRule, SpecCases) {
  EXPECT_EQ(delayed_scale_from_amax(2.0f, 448.0f, 5.0f), 224.0f);
  EXPECT_EQ(delayed_scale_from_amax(0.0f, 448.0f, 5.0f), 5.0f);
  EXPECT_EQ(delayed_scale_from_amax(kInf, 448.0f, 5.0f), 5.0f);
  EXPECT_EQ(delayed_scale_from_amax(kNan, 448.0f, 5.0f), 5.0f);
  EXPECT_EQ(delayed_scale_from_amax(1e-40f, 448.0f, 5.0f), kFloatMax);
}

TEST(CurrentScaleRule, SpecCases) {
  EXPECT_EQ(current_scale_from_amax(2.0f, 448.0f, 0.0f, false), 224.0f);
  EXPECT_EQ(current_scale_from_amax(0.0f, 448.0f, 0.0f, false), 1.0f);
  EXPECT_EQ(current_scale_from_amax(kInf, 448.0f, 0.0f, false), 1.0f);
  EXPECT_EQ(current_scale_from_amax(kNan, 448.0f, 0.0f, false), 1.0f);
  EXPECT_EQ(current_scale_from_amax(1e-40f, 448.0f, 0.0f, false), kFloatMax);  // overflow
  EXPECT_EQ(current_scale_from_amax(3.0f, 448.0f, 0.0f, false), 448.0f / 3.0f);
  // epsilon floors the amax, zero included
  EXPECT_EQ(current_scale_from_amax(0.0f, 448.0f, 0.5f, false), 896.0f);
  EXPECT_EQ(current_scale_from_amax(0.25f, 448.0f, 0.5f, false), 896.0f);
  EXPECT_EQ(current_scale_from_amax(1.0f, 448.0f, 0.5f, false), 448.0f);
  // power-of-2 scales round down
  EXPECT_EQ(current_scale_from_amax(3.0f, 448.0f, 0.0f, true), 128.0f);   // 149.33 → 128
  EXPECT_EQ(current_scale_from_amax(1.75f, 448.0f, 0.0f, true), 256.0f);  // exactly 256
  EXPECT_EQ(current_scale_from_amax(1e-40f, 448.0f, 0.0f, true), std::ldexp(1.0f, 127));
  EXPECT_EQ(current_scale_from_amax(1.0f, 57344.0f, 0.0f, true), 32768.0f);
}

TEST(PerTensorCast, HandWorkedValues) {
  const std::vector<float> input = {1.0f, -2.0f, 0.5f, 448.0f, 500.0f, -0.0f};
  std::vector<uint8_t> codes(input.size());
  EXPECT_EQ(quantize_fp8(input, 1.0f, Fp8Format::e4m3, codes), 500.0f);
  EXPECT_EQ(codes, (std::vector<uint8_t>{0x38, 0xc0, 0x30, 0x7e, 0x7e, 0x80}));
  EXPECT_EQ(quantize_fp8(input, 0.5f, Fp8Format::e4m3, codes), 500.0f);
  EXPECT_EQ(codes, (std::vector<uint8_t>{0x30, 0xb8, 0x28, 0x76, 0x78, 0x80}));  // 250 → 256 (nearer than 240)
  std::vector<float> back(input.size());
  dequantize_fp8(codes, 2.0f, Fp8Format::e4m3, back);
  EXPECT_EQ(back, (std::vector<float>{1.0f, -2.0f, 0.5f, 448.0f, 512.0f, -0.0f}));
  EXPECT_TRUE(std::signbit(back[5]));
  const std::vector<float> with_nan = {1.0f, std::numeric_limits<float>::quiet_NaN()};
  std::vector<uint8_t> nan_codes(2);
  EXPECT_TRUE(std::isnan(quantize_fp8(with_nan, 1.0f, Fp8Format::e5m2, nan_codes)));
  EXPECT_EQ(nan_codes[1], 0x7e);
}

TEST(PerTensorCast, CurrentScalingRoundTrip) {
  std::vector<float> input;
  for (int i = -200; i <= 200; ++i) input.push_back(0.013f * static_cast<float>(i) * static_cast<float>(std::abs(i)));
  const float amax = 0.013f * 200 * 200;
  const Fp8Tensor forward = quantize_fp8_current_scaling(input, TensorDirection::forward, {});
  EXPECT_EQ(forward.format, Fp8Format::e4m3);
  EXPECT_EQ(forward.amax, amax);
  EXPECT_EQ(forward.scale, 448.0f / amax);
  EXPECT_EQ(forward.data[400], 0x7e);  // the amax element lands exactly on 448
  std::vector<float> back(input.size());
  dequantize_fp8(forward.data, forward.scale_inverse, forward.format, back);
  for (size_t i = 0; i < input.size(); ++i) {
    // E4M3: half an ulp is 2^-4 relative for normals; subnormals (below 2^-6 after scaling) are
    // 2^-10 apart in absolute terms.
    const double bound = std::max(std::fabs(input[i]) * 0x1p-4, 0x1p-10 * forward.scale_inverse) * (1 + 1e-6);
    EXPECT_LE(std::fabs(back[i] - input[i]), bound) << i;
  }
  CurrentScalingConfig power_of_2;
  power_of_2.power_of_2_scales = true;
  const Fp8Tensor backward = quantize_fp8_current_scaling(input, TensorDirection::backward, power_of_2);
  EXPECT_EQ(backward.format, Fp8Format::e5m2);
  EXPECT_EQ(backward.scale, 64.0f);  // 57344 / 520 = 110.3, rounded down to a power of two
  EXPECT_EQ(backward.scale_inverse, 1.0f / 64.0f);
}

}  // namespace
}  // namespace mxtrain::numerics
