// Exact scalar casts between FP32 and the narrow formats: FP8 E4M3 and E5M2, the E8M0 power-of-two
// scale, and FP4 E2M1. The trick: every narrow format is sign + magnitude, and its magnitude codes
// are ordered like the values, so one integer routine on the FP32 bits rounds to nearest even
// (ties to the even code) for all of them, and saturation is "clamp the code to the largest
// finite one". Casts are satfinite, as cvt.rn.satfinite on the GPU: finite overflow and ±inf go to
// ±max. NaN: E4M3 → 0x7F|sign, E5M2 → 0x7E|sign (quiet NaN; payload dropped), E2M1 has no NaN and
// gives +6 (0x7), as cuda_fp4.hpp does. ±0 and values that round to zero keep their sign.
// All functions are MXTRAIN_HD so the CUDA kernels call these very functions.
#pragma once
#include <cstdint>

#include "mxtrain/numerics/host_device.hpp"

namespace mxtrain::numerics {

enum class Fp8Format : uint8_t {
  e4m3,  // OCP E4M3 "fn": bias 7, max 448, no infinity, NaN = S.1111.111; subnormals 2^-9 apart
  e5m2,  // E5M2: bias 15, max 57344, IEEE-like infinity and NaN; subnormals 2^-16 apart
};

constexpr float kE4m3Max = 448.0f;
constexpr float kE5m2Max = 57344.0f;
constexpr float kE2m1Max = 6.0f;
// Exponent of the largest power of two in each element format (OCP "emax_elem").
constexpr int kE4m3MaxExponent = 8;
constexpr int kE5m2MaxExponent = 15;
constexpr int kE2m1MaxExponent = 2;

constexpr uint8_t kE4m3MaxCode = 0x7e;
constexpr uint8_t kE4m3NanCode = 0x7f;
constexpr uint8_t kE5m2MaxCode = 0x7b;
constexpr uint8_t kE5m2InfinityCode = 0x7c;
constexpr uint8_t kE5m2NanCode = 0x7e;
constexpr uint8_t kE2m1MaxCode = 0x7;
constexpr uint8_t kE8m0NanCode = 0xff;
constexpr uint8_t kE8m0MaxCode = 0xfe;

MXTRAIN_HD inline float fp8_max(Fp8Format format) { return format == Fp8Format::e4m3 ? kE4m3Max : kE5m2Max; }
MXTRAIN_HD inline int fp8_max_exponent(Fp8Format format) {
  return format == Fp8Format::e4m3 ? kE4m3MaxExponent : kE5m2MaxExponent;
}

namespace detail {

// Magnitude code of a non-NaN FP32 magnitude (sign bit clear) in a format with `mantissa_bits`
// and `bias`, rounded to nearest even and clamped to `max_code`. The code of a normal value is
// (biased exponent << mantissa_bits) | mantissa; a subnormal one is the count of quanta
// 2^(1-bias-mantissa_bits). A round-up carry from the mantissa into the exponent is exactly the
// next value, so the arithmetic needs no special case for it.
MXTRAIN_HD inline uint32_t round_magnitude_to_nearest_even(uint32_t magnitude_bits, int mantissa_bits, int bias,
                                                           uint32_t max_code) {
  if (magnitude_bits >= kFloatInfinityBits) return max_code;
  // FP32 zero and subnormals lie far below half the smallest subnormal of every narrow format.
  if (magnitude_bits < 0x00800000u) return 0;
  const int exponent = static_cast<int>(magnitude_bits >> 23) - 127;
  const int min_normal_exponent = 1 - bias;
  uint32_t significand;
  int dropped_bits;
  uint32_t code_base;
  if (exponent >= min_normal_exponent) {
    significand = magnitude_bits & 0x7fffffu;
    dropped_bits = 23 - mantissa_bits;
    code_base = static_cast<uint32_t>(exponent + bias) << mantissa_bits;
  } else {
    // value = significand * 2^(exponent-23); quantum = 2^(min_normal_exponent - mantissa_bits).
    significand = (magnitude_bits & 0x7fffffu) | 0x800000u;
    dropped_bits = (min_normal_exponent - mantissa_bits) - (exponent - 23);
    // significand < 2^24 <= half a quantum: rounds to zero.
    if (dropped_bits > 24) return 0;
    code_base = 0;
  }
  uint32_t code = code_base + (significand >> dropped_bits);
  const uint32_t remainder = significand & ((1u << dropped_bits) - 1u);
  const uint32_t half = 1u << (dropped_bits - 1);
  if (remainder > half || (remainder == half && (code & 1u))) ++code;
  return code > max_code ? max_code : code;
}

// The value of a magnitude code (no NaN/inf handling; callers do that).
MXTRAIN_HD inline float decode_magnitude(uint32_t code, int mantissa_bits, int bias) {
  const uint32_t exponent_field = code >> mantissa_bits;
  const uint32_t mantissa = code & ((1u << mantissa_bits) - 1u);
  if (exponent_field == 0) return mul_rn(static_cast<float>(mantissa), exact_pow2(1 - bias - mantissa_bits));
  return bits_to_float((exponent_field - static_cast<uint32_t>(bias) + 127u) << 23 | mantissa << (23 - mantissa_bits));
}

}  // namespace detail

// ---- FP8 ----------------------------------------------------------------------------------------

MXTRAIN_HD inline uint8_t float_to_e4m3(float value) {
  const uint32_t bits = float_to_bits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & ~kFloatSignBit;
  if (magnitude > kFloatInfinityBits) return sign | kE4m3NanCode;
  return sign | static_cast<uint8_t>(detail::round_magnitude_to_nearest_even(magnitude, 3, 7, kE4m3MaxCode));
}

MXTRAIN_HD inline float e4m3_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t magnitude = code & 0x7fu;
  if (magnitude == kE4m3NanCode) return bits_to_float(sign | kFloatQuietNanBits);
  return bits_to_float(sign | float_to_bits(detail::decode_magnitude(magnitude, 3, 7)));
}

MXTRAIN_HD inline uint8_t float_to_e5m2(float value) {
  const uint32_t bits = float_to_bits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80u);
  const uint32_t magnitude = bits & ~kFloatSignBit;
  if (magnitude > kFloatInfinityBits) return sign | kE5m2NanCode;
  return sign | static_cast<uint8_t>(detail::round_magnitude_to_nearest_even(magnitude, 2, 15, kE5m2MaxCode));
}

MXTRAIN_HD inline float e5m2_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80u) << 24;
  const uint32_t magnitude = code & 0x7fu;
  if (magnitude >= kE5m2InfinityCode) {
    return bits_to_float(sign | (magnitude == kE5m2InfinityCode ? kFloatInfinityBits : kFloatQuietNanBits));
  }
  return bits_to_float(sign | float_to_bits(detail::decode_magnitude(magnitude, 2, 15)));
}

MXTRAIN_HD inline uint8_t float_to_fp8(float value, Fp8Format format) {
  return format == Fp8Format::e4m3 ? float_to_e4m3(value) : float_to_e5m2(value);
}
MXTRAIN_HD inline float fp8_to_float(uint8_t code, Fp8Format format) {
  return format == Fp8Format::e4m3 ? e4m3_to_float(code) : e5m2_to_float(code);
}

// ---- E8M0 (unsigned power of two, bias 127; 0x00 = 2^-127, 0xFE = 2^127, 0xFF = NaN) --------------

MXTRAIN_HD inline float e8m0_to_float(uint8_t code) {
  if (code == kE8m0NanCode) return quiet_nan();
  return exact_pow2(static_cast<int>(code) - 127);
}

// 2^ceil(log2|value|) as an E8M0 code: TransformerEngine's float_to_e8m0, the same as
// cvt.rp.satfinite.ue8m0x2.f32. NaN → 0xFF; ±inf and anything above 2^127 saturate to 0xFE;
// |value| <= 2^-127 (zero included) → 0x00. The sign is ignored.
MXTRAIN_HD inline uint8_t float_to_e8m0_round_up(float value) {
  const uint32_t magnitude = float_to_bits(value) & ~kFloatSignBit;
  if (magnitude > kFloatInfinityBits) return kE8m0NanCode;
  if (magnitude == kFloatInfinityBits) return kE8m0MaxCode;
  uint32_t exponent = magnitude >> 23;
  const uint32_t mantissa = magnitude & 0x7fffffu;
  if (exponent == 0) return mantissa > 0x400000u ? 1 : 0;  // FP32 subnormal: 2^-127 is 0x400000
  if (mantissa != 0 && exponent < kE8m0MaxCode) ++exponent;
  return static_cast<uint8_t>(exponent);
}

// 2^floor(log2|value|) as an E8M0 code (OCP's rule for the shared exponent). NaN and ±inf → 0xFF;
// FP32 subnormals and zero count as 2^-127 → 0x00.
MXTRAIN_HD inline uint8_t float_to_e8m0_round_down(float value) {
  const uint32_t magnitude = float_to_bits(value) & ~kFloatSignBit;
  if (magnitude >= kFloatInfinityBits) return kE8m0NanCode;
  return static_cast<uint8_t>(magnitude >> 23);
}

// ---- E2M1 (FP4: bias 1, values 0, 0.5, 1, 1.5, 2, 3, 4, 6; the code sits in the low 4 bits) -------

MXTRAIN_HD inline uint8_t float_to_e2m1(float value) {
  const uint32_t bits = float_to_bits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 28) & 0x8u);
  const uint32_t magnitude = bits & ~kFloatSignBit;
  if (magnitude > kFloatInfinityBits) return kE2m1MaxCode;
  return sign | static_cast<uint8_t>(detail::round_magnitude_to_nearest_even(magnitude, 1, 1, kE2m1MaxCode));
}

MXTRAIN_HD inline float e2m1_to_float(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x8u) << 28;
  return bits_to_float(sign | float_to_bits(detail::decode_magnitude(code & 0x7u, 1, 1)));
}

// Stochastic rounding to E2M1 with one 32-bit random word. Let lo <= |x| < hi be the neighbouring
// E2M1 magnitudes and q = hi - lo (0.5 below 2, 1 in [2,4), 2 in [4,6)). With
// threshold = floor(((|x| - lo) / q) * 2^32), the result is hi when random_word < threshold and lo
// otherwise, so P(hi) = threshold / 2^32: unbiased up to 2^-32 of a quantum for a uniform word.
// Every step is exact in FP32 (scaling by a power of two, splitting off the integer part), so the
// CUDA kernel gets the same bits. |x| >= 6 and ±inf give ±6, NaN gives +6, the sign of zero is kept.
MXTRAIN_HD inline uint8_t float_to_e2m1_stochastic(float value, uint32_t random_word) {
  const uint32_t bits = float_to_bits(value);
  const uint8_t sign = static_cast<uint8_t>((bits >> 28) & 0x8u);
  const uint32_t magnitude_bits = bits & ~kFloatSignBit;
  if (magnitude_bits > kFloatInfinityBits) return kE2m1MaxCode;
  const float magnitude = bits_to_float(magnitude_bits);
  if (!(magnitude < kE2m1Max)) return sign | kE2m1MaxCode;
  // In units of the quantum q, |x| lies in [0,4) below 2, [2,4) in [2,4), [2,3) in [4,6).
  const float inverse_quantum = magnitude < 2.0f ? 2.0f : (magnitude < 4.0f ? 1.0f : 0.5f);
  const float in_quanta = mul_rn(magnitude, inverse_quantum);
  uint32_t whole = static_cast<uint32_t>(in_quanta);
  const float fraction = sub_rn(in_quanta, static_cast<float>(whole));
  const uint32_t threshold = static_cast<uint32_t>(mul_rn(fraction, 4294967296.0f));
  if (random_word < threshold) ++whole;
  // Quanta back to codes: 0.5·k is code k; 1·k is code k+2 (k >= 2); 2·k is code k+4 (k >= 2).
  const uint32_t code = inverse_quantum == 2.0f ? whole : (inverse_quantum == 1.0f ? whole + 2 : whole + 4);
  return sign | static_cast<uint8_t>(code);
}

}  // namespace mxtrain::numerics
