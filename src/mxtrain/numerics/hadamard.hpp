// The 16-point random Hadamard transform (RHT) of NVFP4's wgrad operands. A chunk x of 16
// consecutive elements (a row vector) becomes
//     y = x · H,   H = (1/4) · S · H16,
// with H16 the Sylvester ±1 matrix, H16[i][j] = (-1)^popcount(i & j), and S = diag(s) the fixed
// sign vector [+,+,+,-,+,-,-,-,-,-,-,+,-,+,-,-] of TransformerEngine (get_wgrad_sign_vector). S
// multiplies from the left, so it flips the *input* elements: y_j = 1/4 · Σ_i s_i x_i H16[i][j].
// H is orthogonal (H·Hᵀ = I), so applying it along K to both operands of a GEMM leaves the product
// unchanged: (A·H)(B·H)ᵀ = A·Bᵀ. It spreads an outlier over 16 elements before FP4 quantization.
//
// Exact evaluation order (what a CUDA kernel must reproduce bit for bit): t_i = 0.25 · s_i · x_i
// (exact but for FP32 subnormals), then the in-place fast Walsh–Hadamard butterflies for
// h = 1, 2, 4, 8: (t_j, t_{j+h}) ← (t_j + t_{j+h}, t_j - t_{j+h}) for every j with bit h clear,
// each an FP32 add or subtract rounded to nearest even.
#pragma once
#include <cstdint>

#include "mxtrain/numerics/host_device.hpp"

namespace mxtrain::numerics {

constexpr int kHadamardSize = 16;
// Bit i set = s_i is -1: positions 3, 5, 6, 7, 8, 9, 10, 12, 14, 15.
constexpr uint32_t kRhtSignMask = 0xD7E8u;

MXTRAIN_HD inline void random_hadamard_transform16(const float* input, float* output,
                                                   uint32_t sign_mask = kRhtSignMask) {
  float t[kHadamardSize];
  for (int i = 0; i < kHadamardSize; ++i) {
    const float signed_input = ((sign_mask >> i) & 1u) ? -input[i] : input[i];
    t[i] = mul_rn(0.25f, signed_input);
  }
  for (int half = 1; half < kHadamardSize; half <<= 1) {
    for (int j = 0; j < kHadamardSize; ++j) {
      if (j & half) continue;
      const float a = t[j];
      const float b = t[j + half];
      t[j] = add_rn(a, b);
      t[j + half] = sub_rn(a, b);
    }
  }
  for (int i = 0; i < kHadamardSize; ++i) output[i] = t[i];
}

// Entry (i, j) of H = (1/4)·S·H16, for tests and for building the matrix explicitly.
MXTRAIN_HD inline float random_hadamard_entry(int i, int j, uint32_t sign_mask = kRhtSignMask) {
  int parity = 0;
  for (unsigned both = static_cast<unsigned>(i & j); both != 0; both &= both - 1) parity ^= 1;
  const bool negative = (parity != 0) != (((sign_mask >> i) & 1u) != 0);
  return negative ? -0.25f : 0.25f;
}

}  // namespace mxtrain::numerics
