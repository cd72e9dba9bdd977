// Every scale rule of the precision recipes as one scalar function, exactly as
// docs/numerics-reference.md §2 states it (TransformerEngine's arithmetic, operation by
// operation, where the spec leaves the order open). Block and tensor loops live in scaling.cpp,
// mxfp8.cpp and nvfp4.cpp; CUDA kernels call these same MXTRAIN_HD functions.
//
// Naming follows TE: a `scale` multiplies high-precision values before the cast, a decode scale
// (`scale_inverse`, E8M0 block scale, NVFP4 E4M3 block scale) multiplies quantized values back.
#pragma once
#include <cstdint>

#include "mxtrain/numerics/fp8.hpp"
#include "mxtrain/numerics/host_device.hpp"

namespace mxtrain::numerics {

// ---- per-tensor FP8 (§2.1, §2.2) -----------------------------------------------------------------

// Delayed scaling: scale = scaled_max / window_amax when window_amax is finite and > 0, otherwise
// the previous scale is kept; a scale that overflows to +inf becomes FLT_MAX.
// scaled_max = fp8_max(format) * 2^-margin.
MXTRAIN_HD inline float delayed_scale_from_amax(float window_amax, float scaled_max, float previous_scale) {
  float scale = previous_scale;
  if (is_finite(window_amax) && window_amax > 0.0f) scale = div_rn(scaled_max, window_amax);
  if (float_to_bits(scale) == kFloatInfinityBits) scale = float_max();
  return scale;
}

// Current scaling: amax = max(amax, epsilon); amax 0, ±inf or NaN → scale 1; otherwise
// fp8_max / amax (IEEE division), FLT_MAX if that overflows; with power_of_2_scales the mantissa
// bits are cleared, which rounds the scale down to a power of two.
MXTRAIN_HD inline float current_scale_from_amax(float amax, float format_max, float epsilon, bool power_of_2_scales) {
  if (amax < epsilon) amax = epsilon;
  if (amax == 0.0f || !is_finite(amax)) return 1.0f;
  float scale = div_rn(format_max, amax);
  if (float_to_bits(scale) == kFloatInfinityBits) scale = float_max();
  if (power_of_2_scales) scale = bits_to_float(float_to_bits(scale) & 0xFF800000u);
  return scale;
}

// ---- MXFP8 block scales (§2.4, both rules) -----------------------------------------------

enum class E8m0Rounding : uint8_t {
  round_up,  // NVIDIA "RCEIL" (TE, cuBLAS D_OUT scales): s_dec = 2^ceil(log2(amax / fmax)); never saturates
  floor,     // OCP MX v1.0 §6.3: s_dec = 2^(floor(log2 amax) - emax_elem); the block max may saturate
};

// RCEIL, computed as TE does: float_to_e8m0(amax * (1/fmax)) with the FP32 reciprocal constant.
// amax 0 (and any amax <= fmax·2^-127) → 0x00; NaN → 0xFF; inf → 0xFE (satfinite).
MXTRAIN_HD inline uint8_t mx_scale_round_up(float block_amax, Fp8Format format) {
  const float reciprocal_max = format == Fp8Format::e4m3 ? 1.0f / kE4m3Max : 1.0f / kE5m2Max;
  return float_to_e8m0_round_up(mul_rn(block_amax, reciprocal_max));
}

// OCP FLOOR: e = unbiased exponent of amax (zero and FP32 subnormals count as -127),
// s = clamp(e - element_max_exponent, -127, 127), code = s + 127; NaN or inf amax → 0xFF.
MXTRAIN_HD inline uint8_t mx_scale_floor(float block_amax, int element_max_exponent) {
  const uint8_t amax_code = float_to_e8m0_round_down(block_amax);
  if (amax_code == kE8m0NanCode) return kE8m0NanCode;
  const int code = static_cast<int>(amax_code) - element_max_exponent;
  return static_cast<uint8_t>(code < 0 ? 0 : code);
}

MXTRAIN_HD inline uint8_t mx_scale(float block_amax, Fp8Format format, E8m0Rounding rounding) {
  return rounding == E8m0Rounding::round_up ? mx_scale_round_up(block_amax, format)
                                            : mx_scale_floor(block_amax, fp8_max_exponent(format));
}

// What each element of a block with E8M0 code e is multiplied by before the cast: 2^(127 - e),
// exact for every e in [0, 254] (2^127 included). A NaN scale (0xFF) gives NaN, so the whole block
// encodes as NaN. (TE's exp2f_rcp returns 1 instead of 2^127 for e = 0; see mxfp8.hpp.)
MXTRAIN_HD inline float mx_element_multiplier(uint8_t scale_code) {
  if (scale_code == kE8m0NanCode) return quiet_nan();
  return exact_pow2(127 - static_cast<int>(scale_code));
}

// ---- NVFP4 two-level scales (§2.5) -------------------------------------------------------------------

constexpr float kNvfp4GlobalScaleNumerator = kE4m3Max * kE2m1Max;  // 2688
constexpr float kE2m1MaxReciprocal = 1.0f / kE2m1Max;

// S_enc = 448·6 / tensor_amax, clamped to FLT_MAX (fminf: +inf and NaN become FLT_MAX); 1 when the
// amax is 0 or the result is 0 (amax inf).
MXTRAIN_HD inline float nvfp4_global_encode_scale(float tensor_amax) {
  float scale = div_rn(kNvfp4GlobalScaleNumerator, tensor_amax);
  if (!(scale <= float_max())) scale = float_max();
  if (tensor_amax == 0.0f || scale == 0.0f) scale = 1.0f;
  return scale;
}

// S_dec = 1 / S_enc: the per-tensor factor of every dequantized element.
MXTRAIN_HD inline float nvfp4_global_decode_scale(float tensor_amax) {
  return div_rn(1.0f, nvfp4_global_encode_scale(tensor_amax));
}

// Block decode scale, stored as E4M3: RNE-satfinite(amax_b / 6 · S_enc), evaluated as TE does:
// amax_b · (S_enc · fl(1/6)), clamped to FLT_MAX (so a NaN block amax saturates to 448).
MXTRAIN_HD inline uint8_t nvfp4_block_scale(float block_amax, float global_encode_scale) {
  float decode_scale = mul_rn(block_amax, mul_rn(global_encode_scale, kE2m1MaxReciprocal));
  if (!(decode_scale <= float_max())) decode_scale = float_max();
  return float_to_e4m3(decode_scale);
}

// What each element is multiplied by before the E2M1 cast: min(1 / (float(block_scale) · S_dec),
// FLT_MAX). A zero block scale gives FLT_MAX (its elements decode to 0 whatever they encode to).
MXTRAIN_HD inline float nvfp4_element_multiplier(uint8_t block_scale, float global_decode_scale) {
  float multiplier = div_rn(1.0f, mul_rn(e4m3_to_float(block_scale), global_decode_scale));
  if (!(multiplier <= float_max())) multiplier = float_max();
  return multiplier;
}

// The factor that turns E2M1 codes back into values: float(block_scale) · S_dec.
MXTRAIN_HD inline float nvfp4_block_decode_factor(uint8_t block_scale, float global_decode_scale) {
  return mul_rn(e4m3_to_float(block_scale), global_decode_scale);
}

// The GEMM output factor alpha for NVFP4 operands A and B (block scales go to cuBLAS separately):
// the product of their global decode scales, amax_A·amax_B / (6·6·448·448) up to rounding, and the
// same S_dec that dequantization uses (1 for an all-zero operand).
MXTRAIN_HD inline float nvfp4_gemm_alpha(float amax_a, float amax_b) {
  return mul_rn(nvfp4_global_decode_scale(amax_a), nvfp4_global_decode_scale(amax_b));
}

}  // namespace mxtrain::numerics
