// Element types and the exact scalar conversions between FP32, BF16 and FP16
// (round to nearest, ties to even; NaN stays NaN, overflow goes to infinity as IEEE says).
// The 8-bit and 4-bit formats are declared here; their saturating casts live in numerics/.
#pragma once
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mxtrain {

enum class DType : uint8_t {
  f32,   // IEEE binary32
  bf16,  // bfloat16
  f16,   // IEEE binary16
  e4m3,  // FP8 E4M3 (OCP "fn": no infinity, max 448)
  e5m2,  // FP8 E5M2 (IEEE-like, max 57344)
  e8m0,  // unsigned power-of-two scale (MX)
  e2m1,  // FP4 (two per byte)
  i32,
  u8,
};

constexpr int dtype_bits(DType dtype) {
  switch (dtype) {
    case DType::f32: case DType::i32: return 32;
    case DType::bf16: case DType::f16: return 16;
    case DType::e4m3: case DType::e5m2: case DType::e8m0: case DType::u8: return 8;
    case DType::e2m1: return 4;
  }
  return 0;
}

// Bytes of `count` elements (FP4 packs two per byte, rounded up).
constexpr size_t dtype_bytes(DType dtype, size_t count) { return (count * dtype_bits(dtype) + 7) / 8; }

std::string_view dtype_name(DType dtype);
// "BF16", "FP16", "FP32" (any other dtype): how start-up lines name a compute precision.
std::string precision_label(DType dtype);
// Parses "f32"/"fp32"/"float32", "bf16", "f16"/"fp16", ...; returns false if unknown.
bool parse_dtype(std::string_view text, DType* out);

inline uint32_t float_bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}
inline float bits_float(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

inline uint16_t float_to_bf16(float value) {
  uint32_t bits = float_bits(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);  // quiet NaN
  uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}
inline float bf16_to_float(uint16_t value) { return bits_float(static_cast<uint32_t>(value) << 16); }

uint16_t float_to_f16(float value);
float f16_to_float(uint16_t value);

// Round-trips through a format, for tests and CPU emulation.
inline float round_to_bf16(float value) { return bf16_to_float(float_to_bf16(value)); }
inline float round_to_f16(float value) { return f16_to_float(float_to_f16(value)); }

}  // namespace mxtrain
