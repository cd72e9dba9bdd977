#include "mxtrain/numerics/scale_layout.hpp"

#include "mxtrain/core/error.hpp"

namespace mxtrain::numerics {

std::vector<uint8_t> swizzle_scales(std::span<const uint8_t> scales, int64_t scale_rows, int64_t scale_cols) {
  MXTRAIN_ASSERT(scale_rows >= 0 && scale_cols >= 0 && static_cast<int64_t>(scales.size()) == scale_rows * scale_cols,
                 "scales hold %zu bytes, expected %lld x %lld", scales.size(), static_cast<long long>(scale_rows),
                 static_cast<long long>(scale_cols));
  std::vector<uint8_t> swizzled(static_cast<size_t>(swizzled_scale_buffer_size(scale_rows, scale_cols)), 0);
  for (int64_t row = 0; row < scale_rows; ++row) {
    for (int64_t col = 0; col < scale_cols; ++col) {
      swizzled[static_cast<size_t>(swizzled_scale_offset(row, col, scale_cols))] =
          scales[static_cast<size_t>(row * scale_cols + col)];
    }
  }
  return swizzled;
}

}  // namespace mxtrain::numerics
