#include "mxtrain/numerics/mxfp8.hpp"

#include "mxtrain/core/error.hpp"

namespace mxtrain::numerics {

namespace {

// Element i (0 <= i < 32) of a block sits at flat index first + i * stride.
struct BlockWalk {
  int64_t first;   // flat index of the block's first element
  int64_t stride;  // flat distance between consecutive elements of the block
};

BlockWalk block_walk(const Mxfp8Tensor& tensor, int64_t scale_row, int64_t scale_col) {
  if (tensor.options.axis == BlockAxis::rowwise) return {scale_row * tensor.cols + scale_col * kMxBlockSize, 1};
  return {scale_row * kMxBlockSize * tensor.cols + scale_col, tensor.cols};
}

}  // namespace

Mxfp8Tensor quantize_mxfp8(std::span<const float> input, int64_t rows, int64_t cols, const Mxfp8Options& options) {
  MXTRAIN_REQUIRE(rows > 0 && cols > 0 && rows % kMxBlockSize == 0 && cols % kMxBlockSize == 0, unsupported,
                  strf("MXFP8 needs both matrix dimensions divisible by 32, got [%lld, %lld]",
                       static_cast<long long>(rows), static_cast<long long>(cols)),
                  "choose hidden, FFN and token counts that are multiples of 32, or use precision \"bf16\" for this layer");
  MXTRAIN_ASSERT(static_cast<int64_t>(input.size()) == rows * cols, "input has %zu values for [%lld, %lld]",
                 input.size(), static_cast<long long>(rows), static_cast<long long>(cols));
  Mxfp8Tensor tensor;
  tensor.rows = rows;
  tensor.cols = cols;
  tensor.options = options;
  tensor.data.resize(static_cast<size_t>(rows * cols));
  tensor.scales.resize(static_cast<size_t>(tensor.scale_rows() * tensor.scale_cols()));
  for (int64_t scale_row = 0; scale_row < tensor.scale_rows(); ++scale_row) {
    for (int64_t scale_col = 0; scale_col < tensor.scale_cols(); ++scale_col) {
      const BlockWalk walk = block_walk(tensor, scale_row, scale_col);
      float block_amax = 0.0f;
      for (int64_t i = 0; i < kMxBlockSize; ++i) {
        block_amax = nan_propagating_max(block_amax, abs_value(input[static_cast<size_t>(walk.first + i * walk.stride)]));
      }
      const uint8_t scale = mx_scale(block_amax, options.format, options.rounding);
      tensor.scales[static_cast<size_t>(scale_row * tensor.scale_cols() + scale_col)] = scale;
      const float multiplier = mx_element_multiplier(scale);
      for (int64_t i = 0; i < kMxBlockSize; ++i) {
        const size_t index = static_cast<size_t>(walk.first + i * walk.stride);
        tensor.data[index] = float_to_fp8(mul_rn(input[index], multiplier), options.format);
      }
    }
  }
  return tensor;
}

std::vector<float> dequantize_mxfp8(const Mxfp8Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.rows * tensor.cols));
  for (int64_t scale_row = 0; scale_row < tensor.scale_rows(); ++scale_row) {
    for (int64_t scale_col = 0; scale_col < tensor.scale_cols(); ++scale_col) {
      const BlockWalk walk = block_walk(tensor, scale_row, scale_col);
      const float decode_scale = e8m0_to_float(tensor.scales[static_cast<size_t>(scale_row * tensor.scale_cols() + scale_col)]);
      for (int64_t i = 0; i < kMxBlockSize; ++i) {
        const size_t index = static_cast<size_t>(walk.first + i * walk.stride);
        values[index] = mul_rn(fp8_to_float(tensor.data[index], tensor.options.format), decode_scale);
      }
    }
  }
  return values;
}

}  // namespace mxtrain::numerics
