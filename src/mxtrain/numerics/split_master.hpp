// An f32 master weight kept as two 16-bit halves (precision bf16, one GPU): the high half is the
// bf16 compute weight the GEMMs read, the low half the 16 bits the bf16 value drops, so the pair
// holds the f32 master exactly and the optimizer neither reads nor writes a separate f32 copy
// (26 bytes a parameter per AdamW step instead of 28; 2 bytes a parameter less memory).
//
// high = the f32 bits' top half rounded to nearest on the low half, ties away from zero
// (magnitude + 1 when low >= 0x8000); joining subtracts that carry again. This is torch's
// round-to-nearest-even cast except at an exact tie with an even top half (low == 0x8000, about
// one weight in 2^17 a step), where the bf16 weight is the odd neighbour one ulp further from
// zero. (No 16-bit low half can tell RNE's two ties apart: 2^16 + 1 f32 values round to each
// even bf16.) A NaN master becomes the quiet NaN 0x7fc0 with low 0.
#pragma once
#include <cstdint>

#include "mxtrain/numerics/host_device.hpp"

namespace mxtrain::numerics {

struct SplitMaster {
  uint16_t high, low;
};

MXTRAIN_HD inline SplitMaster split_master(float value) {
  const uint32_t bits = float_to_bits(value);
  if (is_nan(value)) return {static_cast<uint16_t>(0x7fc0u | ((bits >> 16) & 0x8000u)), 0};
  const uint32_t low = bits & 0xffffu;
  return {static_cast<uint16_t>((bits >> 16) + (low >= 0x8000u ? 1u : 0u)), static_cast<uint16_t>(low)};
}

MXTRAIN_HD inline float join_master(uint16_t high, uint16_t low) {
  const uint32_t top = static_cast<uint32_t>(high) - (low >= 0x8000u ? 1u : 0u);
  return bits_to_float((top << 16) | low);
}

}  // namespace mxtrain::numerics
