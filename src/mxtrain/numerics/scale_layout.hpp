// The cuBLAS block-scaling layout of MXFP8 (E8M0, blocks of 32) and NVFP4 (E4M3, blocks of 16)
// scale factors. Scales form a matrix S[R][C] (R = rows of the operand, C = blocks along K). It is
// padded to R' = roundup(R, 128) and C' = roundup(C, 4) and cut into 128×4 tiles of 512 bytes; the
// tiles are laid out row-major by (r/128, c/4) and, inside a tile, row r sits at
// (r%32)·16 + ((r%128)/32)·4, i.e. rows 0, 32, 64, 96, 1, 33, ... interleaved 4 bytes at a time.
// (docs/numerics-reference.md §2.3; torchao to_blocked; cudnn-frontend F8_128x4.)
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "mxtrain/numerics/host_device.hpp"

namespace mxtrain::numerics {

MXTRAIN_HD inline int64_t round_up_to_multiple(int64_t value, int64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

// Bytes of the padded, swizzled scale buffer of an R×C scale matrix.
MXTRAIN_HD inline int64_t swizzled_scale_buffer_size(int64_t scale_rows, int64_t scale_cols) {
  return round_up_to_multiple(scale_rows, 128) * round_up_to_multiple(scale_cols, 4);
}

// Byte offset of S[row][col] in the swizzled buffer of a matrix with `scale_cols` columns (unpadded).
MXTRAIN_HD inline int64_t swizzled_scale_offset(int64_t row, int64_t col, int64_t scale_cols) {
  const int64_t tiles_per_row = round_up_to_multiple(scale_cols, 4) / 4;
  return ((row / 128) * tiles_per_row + col / 4) * 512 + (row % 32) * 16 + ((row % 128) / 32) * 4 + (col % 4);
}

// The compact row-major [scale_rows, scale_cols] scales rearranged into the swizzled buffer; the
// padding bytes are 0.
std::vector<uint8_t> swizzle_scales(std::span<const uint8_t> scales, int64_t scale_rows, int64_t scale_cols);

}  // namespace mxtrain::numerics
