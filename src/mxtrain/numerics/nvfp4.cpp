#include "mxtrain/numerics/nvfp4.hpp"

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/hadamard.hpp"
#include "mxtrain/numerics/philox.hpp"
#include "mxtrain/numerics/scaling.hpp"

namespace mxtrain::numerics {

namespace {

void require_nvfp4_shape(int64_t rows, int64_t cols, bool two_dimensional_blocks) {
  MXTRAIN_REQUIRE(rows > 0 && cols > 0 && cols % kNvfp4BlockSize == 0, unsupported,
                  strf("NVFP4 needs the last dimension divisible by 16, got [%lld, %lld]",
                       static_cast<long long>(rows), static_cast<long long>(cols)),
                  "choose hidden, FFN and token counts that are multiples of 16, or use precision \"bf16\" for this layer");
  MXTRAIN_REQUIRE(!two_dimensional_blocks || rows % kNvfp4BlockSize == 0, unsupported,
                  strf("NVFP4 16x16 weight tiles need both dimensions divisible by 16, got [%lld, %lld]",
                       static_cast<long long>(rows), static_cast<long long>(cols)),
                  "choose layer sizes that are multiples of 16, or turn off 2D weight quantization");
}

std::vector<float> transpose(std::span<const float> input, int64_t rows, int64_t cols) {
  std::vector<float> output(input.size());
  for (int64_t row = 0; row < rows; ++row) {
    for (int64_t col = 0; col < cols; ++col) {
      output[static_cast<size_t>(col * rows + row)] = input[static_cast<size_t>(row * cols + col)];
    }
  }
  return output;
}

float block_amax(std::span<const float> values, int64_t cols, int64_t first_row, int64_t row_count, int64_t first_col) {
  float amax = 0.0f;
  for (int64_t row = first_row; row < first_row + row_count; ++row) {
    for (int64_t col = first_col; col < first_col + kNvfp4BlockSize; ++col) {
      amax = nan_propagating_max(amax, abs_value(values[static_cast<size_t>(row * cols + col)]));
    }
  }
  return amax;
}

void set_element(std::vector<uint8_t>& packed, int64_t index, uint8_t code) {
  uint8_t& byte = packed[static_cast<size_t>(index / 2)];
  byte = (index % 2 == 0) ? static_cast<uint8_t>((byte & 0xf0u) | code) : static_cast<uint8_t>((byte & 0x0fu) | code << 4);
}

}  // namespace

Nvfp4Options nvfp4_recipe_options(Nvfp4Role role, BlockAxis usage, uint64_t seed, uint64_t offset) {
  Nvfp4Options options;
  options.seed = seed;
  options.offset = offset;
  switch (role) {
    case Nvfp4Role::activation: options.random_hadamard = usage == BlockAxis::columnwise; break;
    case Nvfp4Role::weight: options.two_dimensional_blocks = true; break;
    case Nvfp4Role::gradient:
      options.random_hadamard = usage == BlockAxis::columnwise;
      options.stochastic_rounding = true;
      break;
  }
  return options;
}

uint8_t Nvfp4Tensor::element(int64_t row, int64_t col) const {
  const int64_t index = row * cols + col;
  const uint8_t byte = data[static_cast<size_t>(index / 2)];
  return index % 2 == 0 ? (byte & 0x0fu) : (byte >> 4);
}

void random_hadamard_transform_rows(std::span<float> values, int64_t rows, int64_t cols) {
  require_nvfp4_shape(rows, cols, false);
  MXTRAIN_ASSERT(static_cast<int64_t>(values.size()) == rows * cols, "%zu values for [%lld, %lld]", values.size(),
                 static_cast<long long>(rows), static_cast<long long>(cols));
  float chunk[kHadamardSize];
  for (size_t first = 0; first < values.size(); first += kHadamardSize) {
    random_hadamard_transform16(values.data() + first, chunk);
    for (int i = 0; i < kHadamardSize; ++i) values[first + static_cast<size_t>(i)] = chunk[i];
  }
}

Nvfp4Tensor quantize_nvfp4(std::span<const float> input, int64_t rows, int64_t cols, const Nvfp4Options& options) {
  require_nvfp4_shape(rows, cols, options.two_dimensional_blocks);
  MXTRAIN_ASSERT(static_cast<int64_t>(input.size()) == rows * cols, "%zu values for [%lld, %lld]", input.size(),
                 static_cast<long long>(rows), static_cast<long long>(cols));
  std::vector<float> rotated;
  std::span<const float> source = input;
  if (options.random_hadamard) {
    rotated.assign(input.begin(), input.end());
    random_hadamard_transform_rows(rotated, rows, cols);
    source = rotated;
  }

  Nvfp4Tensor tensor;
  tensor.rows = rows;
  tensor.cols = cols;
  tensor.amax = options.tensor_amax ? *options.tensor_amax : amax_of(source);
  tensor.data.assign(static_cast<size_t>(rows * cols / 2), 0);
  const int64_t blocks_per_row = cols / kNvfp4BlockSize;
  tensor.scales.resize(static_cast<size_t>(rows * blocks_per_row));
  const float encode_scale = nvfp4_global_encode_scale(tensor.amax);
  const float decode_scale = tensor.global_decode_scale();

  const int64_t rows_per_scale = options.two_dimensional_blocks ? kNvfp4BlockSize : 1;
  for (int64_t first_row = 0; first_row < rows; first_row += rows_per_scale) {
    for (int64_t block = 0; block < blocks_per_row; ++block) {
      const uint8_t scale =
          nvfp4_block_scale(block_amax(source, cols, first_row, rows_per_scale, block * kNvfp4BlockSize), encode_scale);
      const float multiplier = nvfp4_element_multiplier(scale, decode_scale);
      for (int64_t row = first_row; row < first_row + rows_per_scale; ++row) {
        tensor.scales[static_cast<size_t>(row * blocks_per_row + block)] = scale;
        for (int64_t col = block * kNvfp4BlockSize; col < (block + 1) * kNvfp4BlockSize; ++col) {
          const int64_t index = row * cols + col;
          const float scaled = mul_rn(source[static_cast<size_t>(index)], multiplier);
          const uint8_t code =
              options.stochastic_rounding
                  ? float_to_e2m1_stochastic(scaled, philox_random_word(options.seed, options.offset, static_cast<uint64_t>(index)))
                  : float_to_e2m1(scaled);
          set_element(tensor.data, index, code);
        }
      }
    }
  }
  return tensor;
}

Nvfp4Tensor quantize_nvfp4_transposed(std::span<const float> input, int64_t rows, int64_t cols,
                                      const Nvfp4Options& options) {
  MXTRAIN_ASSERT(static_cast<int64_t>(input.size()) == rows * cols, "%zu values for [%lld, %lld]", input.size(),
                 static_cast<long long>(rows), static_cast<long long>(cols));
  const std::vector<float> transposed = transpose(input, rows, cols);
  return quantize_nvfp4(transposed, cols, rows, options);
}

std::vector<float> dequantize_nvfp4(const Nvfp4Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.rows * tensor.cols));
  const float decode_scale = tensor.global_decode_scale();
  const int64_t blocks_per_row = tensor.cols / kNvfp4BlockSize;
  for (int64_t row = 0; row < tensor.rows; ++row) {
    for (int64_t col = 0; col < tensor.cols; ++col) {
      const uint8_t scale = tensor.scales[static_cast<size_t>(row * blocks_per_row + col / kNvfp4BlockSize)];
      values[static_cast<size_t>(row * tensor.cols + col)] =
          mul_rn(e2m1_to_float(tensor.element(row, col)), nvfp4_block_decode_factor(scale, decode_scale));
    }
  }
  return values;
}

}  // namespace mxtrain::numerics
