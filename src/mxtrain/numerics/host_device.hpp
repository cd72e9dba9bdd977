// What the scalar numerics headers need to compile for both the CPU reference (g++) and CUDA
// kernels (nvcc): the MXTRAIN_HD qualifier and exact bit-level helpers. Everything here is plain
// integer and float arithmetic, so the host and the device compute the same bits.
#pragma once
#include <cstdint>
#if !defined(__CUDA_ARCH__)
#include <cstring>
#endif

#if defined(__CUDACC__)
#define MXTRAIN_HD __host__ __device__
#else
#define MXTRAIN_HD
#endif

namespace mxtrain::numerics {

MXTRAIN_HD inline uint32_t float_to_bits(float value) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(value);
#else
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  return bits;
#endif
}

MXTRAIN_HD inline float bits_to_float(uint32_t bits) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(bits);
#else
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
#endif
}

constexpr uint32_t kFloatSignBit = 0x80000000u;
constexpr uint32_t kFloatInfinityBits = 0x7f800000u;
constexpr uint32_t kFloatMaxBits = 0x7f7fffffu;     // FLT_MAX
constexpr uint32_t kFloatQuietNanBits = 0x7fc00000u;

MXTRAIN_HD inline float float_max() { return bits_to_float(kFloatMaxBits); }
MXTRAIN_HD inline float quiet_nan() { return bits_to_float(kFloatQuietNanBits); }
MXTRAIN_HD inline bool is_nan(float value) { return (float_to_bits(value) & ~kFloatSignBit) > kFloatInfinityBits; }
MXTRAIN_HD inline bool is_finite(float value) { return (float_to_bits(value) & ~kFloatSignBit) < kFloatInfinityBits; }
MXTRAIN_HD inline float abs_value(float value) { return bits_to_float(float_to_bits(value) & ~kFloatSignBit); }

// 2^exponent, exact, for exponent in [-149, 127] (subnormals included); 0 below, +inf above.
MXTRAIN_HD inline float exact_pow2(int exponent) {
  if (exponent > 127) return bits_to_float(kFloatInfinityBits);
  if (exponent >= -126) return bits_to_float(static_cast<uint32_t>(exponent + 127) << 23);
  if (exponent >= -149) return bits_to_float(1u << (exponent + 149));
  return 0.0f;
}

// Single IEEE operations, round to nearest even, never fused or approximated. nvcc contracts
// a*b+c into an FMA and --use_fast_math approximates division; these intrinsics forbid both, so
// a kernel computes exactly what the reference computes. (The host build is -std=c++20 on
// x86-64, where GCC does not contract.)
MXTRAIN_HD inline float mul_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fmul_rn(a, b);
#else
  return a * b;
#endif
}
MXTRAIN_HD inline float add_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fadd_rn(a, b);
#else
  return a + b;
#endif
}
MXTRAIN_HD inline float sub_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fsub_rn(a, b);
#else
  return a - b;
#endif
}
MXTRAIN_HD inline float div_rn(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// The larger of two values where a NaN in either wins: an amax that saw a NaN is NaN, so a bad
// tensor is visible in its scale instead of being skipped as fmaxf would.
MXTRAIN_HD inline float nan_propagating_max(float a, float b) {
  if (is_nan(a)) return a;
  if (is_nan(b)) return b;
  return a > b ? a : b;
}

}  // namespace mxtrain::numerics
