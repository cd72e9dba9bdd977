// MXFP8 reference quantizer (§2.4): FP8 elements with one E8M0 power-of-two scale per 32
// consecutive elements, either along a row (1×32, "rowwise", the fprop copy) or along a column
// (32×1, "columnwise", the copy whose K runs down the rows). Both copies are always quantized from
// the high-precision input, never from each other.
//
// Per block: amax (NaN if any element is NaN) → E8M0 code e (mx_scale: RCEIL by default, OCP FLOOR
// as an option) → element = RNE-satfinite(x · 2^(127-e)) → value ≈ element · 2^(e-127).
// With RCEIL, |x · 2^(127-e)| <= fmax, so no element saturates. A NaN scale (0xFF) makes every
// element of its block NaN as well.
// Known difference from TE's kernels: for e = 0 (a block amax <= fmax·2^-127, zero included) TE
// multiplies by 1 (exp2f_rcp) rather than 2^127, flushing such tiny blocks to zero; this follows
// the spec's 2^(127-e), which dequantizes consistently. Zero blocks are identical either way.
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "mxtrain/numerics/fp8.hpp"
#include "mxtrain/numerics/scale_rules.hpp"

namespace mxtrain::numerics {

constexpr int64_t kMxBlockSize = 32;

enum class BlockAxis : uint8_t {
  rowwise,     // blocks of 32 consecutive elements of a row; scales [rows, cols/32]
  columnwise,  // blocks of 32 consecutive elements of a column; scales [rows/32, cols]
};

struct Mxfp8Options {
  Fp8Format format = Fp8Format::e4m3;
  BlockAxis axis = BlockAxis::rowwise;
  E8m0Rounding rounding = E8m0Rounding::round_up;
};

struct Mxfp8Tensor {
  int64_t rows = 0;
  int64_t cols = 0;
  Mxfp8Options options;
  std::vector<uint8_t> data;    // [rows, cols] FP8 codes, the input's layout (not transposed)
  std::vector<uint8_t> scales;  // E8M0, compact row-major [scale_rows(), scale_cols()]

  int64_t scale_rows() const { return options.axis == BlockAxis::rowwise ? rows : rows / kMxBlockSize; }
  int64_t scale_cols() const { return options.axis == BlockAxis::rowwise ? cols / kMxBlockSize : cols; }
};

// Quantizes a row-major [rows, cols] matrix. rows and cols must both be multiples of 32.
Mxfp8Tensor quantize_mxfp8(std::span<const float> input, int64_t rows, int64_t cols, const Mxfp8Options& options);

// Values back as row-major [rows, cols] floats: fp8_to_float(element) · 2^(e-127).
std::vector<float> dequantize_mxfp8(const Mxfp8Tensor& tensor);

}  // namespace mxtrain::numerics
