// Eight FP32 values to their eight FP8 codes with the hardware's conversion, bit for bit the
// reference's numerics::float_to_fp8: shared by the cast kernels (quantize.cu) and AdamW's
// weight casts (adamw.cu), so the two make the same bytes.
#pragma once
#include <cuda_fp8.h>

#include <cstdint>

#include "mxtrain/numerics/fp8.hpp"

namespace mxtrain::cuda_kernels {

__device__ __forceinline__ uint8_t fp8_nan_patch(uint8_t code, uint32_t bits, numerics::Fp8Format format) {
  if ((bits & 0x7fffffffu) <= 0x7f800000u) return code;
  return static_cast<uint8_t>(((bits >> 24) & 0x80u) | (format == numerics::Fp8Format::e4m3 ? numerics::kE4m3NanCode
                                                                                        : numerics::kE5m2NanCode));
}

// Eight scaled values -> their eight codes as two words (values 0-3 and 4-7, the first in the
// lowest byte), the reference's float_to_fp8 bit for bit. may_be_nan: whether any scaled value can
// be NaN (else the NaN patch is skipped). The format is a template argument: a runtime one made
// the compiler emit both conversions under predicates, and the words are assembled with byte
// permutes instead of byte extracts and shifts (the casts were issue-bound on an H200).
template <numerics::Fp8Format kFormat>
__device__ __forceinline__ void cast8(const float (&scaled)[8], uint32_t (&words)[2], bool may_be_nan = true) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890
  uint32_t pair[4];
#pragma unroll
  for (int k = 0; k < 4; ++k)
    pair[k] = __nv_cvt_float2_to_fp8x2(make_float2(scaled[2 * k], scaled[2 * k + 1]), __NV_SATFINITE,
                                       kFormat == numerics::Fp8Format::e4m3 ? __NV_E4M3 : __NV_E5M2);
  words[0] = __byte_perm(pair[0], pair[1], 0x5410);
  words[1] = __byte_perm(pair[2], pair[3], 0x5410);
  if (may_be_nan) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int shift = 8 * (i % 4);
      const uint8_t code = fp8_nan_patch(static_cast<uint8_t>(words[i / 4] >> shift), numerics::float_to_bits(scaled[i]),
                                         kFormat);
      words[i / 4] = (words[i / 4] & ~(0xffu << shift)) | (static_cast<uint32_t>(code) << shift);
    }
  }
#else
  (void)may_be_nan;
  words[0] = words[1] = 0;
#pragma unroll
  for (int i = 0; i < 8; ++i) words[i / 4] |= static_cast<uint32_t>(numerics::float_to_fp8(scaled[i], kFormat)) << (8 * (i % 4));
#endif
}

}  // namespace mxtrain::cuda_kernels
