// NVFP4 reference quantizer (§2.5): E2M1 elements, one E4M3 decode scale per 16 consecutive
// elements of a row (or per 16×16 tile for weights), and one FP32 tensor amax from which the global
// scales derive: x ≈ e2m1 · float(block_scale) · S_dec.
//
// Order of work for one tensor: [optional RHT over 16-element chunks of each row] → tensor amax
// (after the RHT; NaN if any value is NaN) → S_enc, S_dec → per block (or tile) amax → E4M3 block
// scale → multiplier min(1 / (block_scale · S_dec), FLT_MAX) → E2M1 cast of x · multiplier, RNE or
// stochastic. Stochastic rounding draws philox_random_word(seed, offset, r·cols + c) for element
// (r, c) of the matrix being quantized, so a kernel with the same seed and offset matches bit for bit.
// E2M1 has no NaN: NaN inputs encode as +6; check the stored amax for non-finite values.
//
// TE layout conventions: NVFP4 GEMMs are TN only, so the columnwise (wgrad) copy of a [rows, cols]
// tensor is the transpose [cols, rows] quantized rowwise — quantize_nvfp4_transposed. The RHT runs
// along the last dimension of the matrix being quantized, which for the transposed copy is K of
// the wgrad GEMM, so it cancels between the two wgrad operands.
#pragma once
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "mxtrain/numerics/fp8.hpp"
#include "mxtrain/numerics/mxfp8.hpp"
#include "mxtrain/numerics/scale_rules.hpp"

namespace mxtrain::numerics {

constexpr int64_t kNvfp4BlockSize = 16;

struct Nvfp4Options {
  bool two_dimensional_blocks = false;  // one scale per 16×16 tile (weights) instead of per 1×16 block
  bool random_hadamard = false;         // RHT over each 16-element chunk of every row first
  bool stochastic_rounding = false;     // E2M1 stochastic rounding instead of RNE
  uint64_t seed = 0;                    // Philox key for stochastic rounding
  uint64_t offset = 0;                  // Philox stream (e.g. step and tensor id) for stochastic rounding
  // The tensor amax to derive the global scales from, instead of this matrix's own (after the
  // RHT): an amax all-reduced over ranks, or one computed by a separate pass on the device.
  std::optional<float> tensor_amax;
};

enum class Nvfp4Role : uint8_t { activation, weight, gradient };

// TE's NVFP4BlockScaling defaults: activations 1×16 with RHT on the columnwise copy; weights 16×16
// tiles, no RHT, no SR; gradients 1×16, RHT on the columnwise copy, stochastic rounding on.
Nvfp4Options nvfp4_recipe_options(Nvfp4Role role, BlockAxis usage, uint64_t seed = 0, uint64_t offset = 0);

struct Nvfp4Tensor {
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> data;    // [rows, cols/2]: element 2k in the low nibble of byte k, 2k+1 in the high one
  std::vector<uint8_t> scales;  // [rows, cols/16] E4M3 block decode scales (a 16×16 tile repeats its scale on its 16 rows)
  float amax = 0.0f;            // tensor amax, after the RHT when it is on

  float global_decode_scale() const { return nvfp4_global_decode_scale(amax); }
  uint8_t element(int64_t row, int64_t col) const;  // the 4-bit E2M1 code
};

// Quantizes a row-major [rows, cols] matrix; cols must be a multiple of 16 (and rows too for tiles).
Nvfp4Tensor quantize_nvfp4(std::span<const float> input, int64_t rows, int64_t cols, const Nvfp4Options& options);
// The columnwise copy: quantizes the transpose, a [cols, rows] matrix.
Nvfp4Tensor quantize_nvfp4_transposed(std::span<const float> input, int64_t rows, int64_t cols,
                                      const Nvfp4Options& options);

// Values back as row-major [rows, cols] floats (in the RHT domain if the RHT was applied).
std::vector<float> dequantize_nvfp4(const Nvfp4Tensor& tensor);

// random_hadamard_transform16 on every 16-element chunk of every row, in place; cols % 16 == 0.
void random_hadamard_transform_rows(std::span<float> values, int64_t rows, int64_t cols);

}  // namespace mxtrain::numerics
