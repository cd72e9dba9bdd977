#include "mxtrain/core/dtype.hpp"

#include <string>

namespace mxtrain {

std::string_view dtype_name(DType dtype) {
  switch (dtype) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
    case DType::e4m3: return "e4m3";
    case DType::e5m2: return "e5m2";
    case DType::e8m0: return "e8m0";
    case DType::e2m1: return "e2m1";
    case DType::i32: return "i32";
    case DType::u8: return "u8";
  }
  return "?";
}

bool parse_dtype(std::string_view text, DType* out) {
  struct Name { std::string_view text; DType dtype; };
  static constexpr Name names[] = {
      {"f32", DType::f32},   {"fp32", DType::f32},  {"float32", DType::f32}, {"bf16", DType::bf16},
      {"bfloat16", DType::bf16}, {"f16", DType::f16}, {"fp16", DType::f16},  {"float16", DType::f16},
      {"e4m3", DType::e4m3}, {"e5m2", DType::e5m2}, {"e8m0", DType::e8m0},   {"e2m1", DType::e2m1},
      {"i32", DType::i32},   {"u8", DType::u8},
  };
  for (const Name& name : names) {
    if (name.text == text) {
      *out = name.dtype;
      return true;
    }
  }
  return false;
}

uint16_t float_to_f16(float value) {
  uint32_t bits = float_bits(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  uint32_t magnitude = bits & 0x7fffffffu;
  if (magnitude > 0x7f800000u) return sign | 0x7e00u;        // NaN (quiet)
  // >= 65536 (and infinity) overflow; [65520, 65536) round up to infinity through the carry below.
  if (magnitude >= 0x47800000u) return sign | 0x7c00u;
  int exponent = static_cast<int>(magnitude >> 23) - 127;
  uint32_t mantissa = magnitude & 0x7fffffu;
  if (exponent >= -14) {
    // Normal half: keep 10 mantissa bits, round the 13 dropped bits to nearest even.
    uint32_t half = static_cast<uint32_t>(exponent + 15) << 10 | (mantissa >> 13);
    uint32_t dropped = mantissa & 0x1fffu;
    if (dropped > 0x1000u || (dropped == 0x1000u && (half & 1u))) ++half;  // may carry into exponent/inf
    return sign | static_cast<uint16_t>(half);
  }
  if (exponent < -25) return sign;  // below half of the smallest subnormal: zero
  // Subnormal half: value = m * 2^-24 with the implicit bit made explicit.
  uint32_t full = mantissa | 0x800000u;
  int shift = -exponent - 14 + 13;  // 14..24 bits dropped -> shift in [14, 24]
  uint32_t half = full >> shift;
  uint32_t dropped = full & ((1u << shift) - 1u);
  uint32_t halfway = 1u << (shift - 1);
  if (dropped > halfway || (dropped == halfway && (half & 1u))) ++half;
  return sign | static_cast<uint16_t>(half);
}

float f16_to_float(uint16_t value) {
  uint32_t sign = static_cast<uint32_t>(value & 0x8000u) << 16;
  uint32_t exponent = (value >> 10) & 0x1fu;
  uint32_t mantissa = value & 0x3ffu;
  if (exponent == 0x1fu) return bits_float(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return bits_float(sign);
    // Subnormal: normalise.
    int shift = 0;
    while (!(mantissa & 0x400u)) {
      mantissa <<= 1;
      ++shift;
    }
    mantissa &= 0x3ffu;
    return bits_float(sign | static_cast<uint32_t>(127 - 15 - shift + 1) << 23 | (mantissa << 13));
  }
  return bits_float(sign | (exponent + 127 - 15) << 23 | (mantissa << 13));
}

std::string precision_label(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "BF16";
    case DType::f16: return "FP16";
    default: return "FP32";
  }
}

}  // namespace mxtrain
