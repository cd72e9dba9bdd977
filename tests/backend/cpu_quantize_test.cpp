// The CPU backend's precision-recipe ops against numerics/ called directly: the ops only move
// data between tensors and the reference quantizers, so the checks are exact. What they add —
// columnwise copies stored transposed, swizzled block scales, dequantization back into x's layout,
// the scale update over many tensors — is what these tests pin down. Also supports().
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/numerics/mxfp8.hpp"
#include "mxtrain/numerics/nvfp4.hpp"
#include "mxtrain/numerics/scale_layout.hpp"
#include "mxtrain/numerics/scaling.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

std::vector<uint8_t> bytes_of(const Tensor& tensor) {
  const uint8_t* data = tensor.ptr<uint8_t>();
  return std::vector<uint8_t>(data, data + tensor.bytes());
}

std::vector<float> transpose(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<float> result(values.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) result[static_cast<size_t>(c * rows + r)] = values[static_cast<size_t>(r * cols + c)];
  return result;
}

struct Copy {
  Buffer data, scales, amax;
  QuantizedTensor q;
};

Copy make_copy(Backend& backend, const QuantizeSpec& spec, bool transposed, int64_t rows, int64_t cols) {
  Copy copy;
  copy.q.spec = spec;
  copy.q.transposed = transposed;
  const int64_t r = transposed ? cols : rows, k = transposed ? rows : cols;
  copy.data = backend.allocate("data", Shape{r, k}, spec.element, Lifetime::scratch);
  copy.scales = backend.allocate("scales", block_scale_shape(spec, r, k), block_scale_dtype(spec.mode), Lifetime::scratch);
  copy.amax = backend.allocate("amax", Shape{1}, DType::f32, Lifetime::scratch);
  copy.q.data = copy.data;
  copy.q.scale_inverse = copy.scales;
  copy.q.amax = copy.amax;
  return copy;
}

class CpuQuantize : public ::testing::Test {
 protected:
  CpuBackend cpu_{2};
  const int64_t rows_ = 64, cols_ = 96;
  std::vector<float> values_ = test::random_vector(static_cast<size_t>(64 * 96), 21, -4.0f, 4.0f);
};

TEST_F(CpuQuantize, PerTensorCopiesAndAmax) {
  Buffer x = test::upload(cpu_, values_, Shape{rows_, cols_});
  Buffer scale = test::upload(cpu_, {50.0f}, Shape{1});
  Buffer amax = test::upload(cpu_, {3.0f}, Shape{1});
  QuantizeSpec spec;
  spec.element = DType::e5m2;
  Copy rows = make_copy(cpu_, spec, false, rows_, cols_), columns = make_copy(cpu_, spec, true, rows_, cols_);
  cpu_.quantize(x, scale, rows.q, columns.q, amax);
  std::vector<uint8_t> want(values_.size());
  numerics::quantize_fp8(values_, 50.0f, numerics::Fp8Format::e5m2, want);
  EXPECT_EQ(bytes_of(rows.data), want);
  numerics::quantize_fp8(transpose(values_, rows_, cols_), 50.0f, numerics::Fp8Format::e5m2, want);
  EXPECT_EQ(bytes_of(columns.data), want);
  EXPECT_EQ(test::download(cpu_, amax)[0], numerics::amax_of(values_));  // max= over the previous 3
  // Dequantization transposes the columnwise copy back.
  EXPECT_EQ(columns.scales.tensor().ptr<float>()[0], 1.0f / 50.0f);  // each copy carries its decode scale
  Buffer back = cpu_.allocate("back", Shape{rows_, cols_}, DType::f32, Lifetime::scratch);
  cpu_.dequantize(columns.q, back);
  const std::vector<float> got = test::download(cpu_, back);
  for (size_t i = 0; i < got.size(); i += 97) {
    const uint8_t code = numerics::float_to_e5m2(values_[i] * 50.0f);
    EXPECT_EQ(got[i], numerics::e5m2_to_float(code) * 0.02f) << i;
  }
}

TEST_F(CpuQuantize, MxColumnwiseCopyIsTheTransposedColumnwiseBlocks) {
  Buffer x = test::upload(cpu_, values_, Shape{rows_, cols_});
  for (bool swizzled : {false, true}) {
    QuantizeSpec spec;
    spec.mode = ScalingMode::mxfp8;
    spec.swizzled_scales = swizzled;
    Copy columns = make_copy(cpu_, spec, true, rows_, cols_);
    cpu_.quantize(x, Tensor(), QuantizedTensor{}, columns.q, Tensor());
    numerics::Mxfp8Options options;
    options.axis = numerics::BlockAxis::columnwise;
    const numerics::Mxfp8Tensor reference = numerics::quantize_mxfp8(values_, rows_, cols_, options);
    // numerics keeps x's layout: data [rows, cols], scales [rows/32, cols]; the copy is xᵀ.
    std::vector<uint8_t> data(reference.data.size()), scales(reference.scales.size());
    for (int64_t r = 0; r < rows_; ++r)
      for (int64_t c = 0; c < cols_; ++c) data[static_cast<size_t>(c * rows_ + r)] = reference.data[static_cast<size_t>(r * cols_ + c)];
    const int64_t blocks = rows_ / 32;
    for (int64_t b = 0; b < blocks; ++b)
      for (int64_t c = 0; c < cols_; ++c) scales[static_cast<size_t>(c * blocks + b)] = reference.scales[static_cast<size_t>(b * cols_ + c)];
    EXPECT_EQ(bytes_of(columns.data), data) << swizzled;
    EXPECT_EQ(bytes_of(columns.scales), swizzled ? numerics::swizzle_scales(scales, cols_, blocks) : scales) << swizzled;
    Buffer back = cpu_.allocate("back", Shape{rows_, cols_}, DType::f32, Lifetime::scratch);
    cpu_.dequantize(columns.q, back);
    EXPECT_EQ(test::download(cpu_, back), numerics::dequantize_mxfp8(reference)) << swizzled;
  }
}

TEST_F(CpuQuantize, Nvfp4UsesTheGivenAmaxAndTheRhtOfTheTransposedCopy) {
  Buffer x = test::upload(cpu_, values_, Shape{rows_, cols_});
  QuantizeSpec spec;
  spec.mode = ScalingMode::nvfp4;
  spec.element = DType::e2m1;
  spec.hadamard = true;
  spec.stochastic_rounding = true;
  spec.seed = 3;
  spec.offset = 8;
  Copy columns = make_copy(cpu_, spec, true, rows_, cols_);
  cpu_.amax(x, columns.amax, false, true);
  std::vector<float> rotated = transpose(values_, rows_, cols_);
  numerics::random_hadamard_transform_rows(rotated, cols_, rows_);
  EXPECT_EQ(test::download(cpu_, columns.amax)[0], numerics::amax_of(rotated));
  EXPECT_NE(numerics::amax_of(rotated), numerics::amax_of(values_));  // the RHT changed it
  cpu_.quantize(x, Tensor(), QuantizedTensor{}, columns.q, Tensor());
  const numerics::Nvfp4Tensor reference = numerics::quantize_nvfp4_transposed(
      values_, rows_, cols_, numerics::nvfp4_recipe_options(numerics::Nvfp4Role::gradient, numerics::BlockAxis::columnwise, 3, 8));
  EXPECT_EQ(bytes_of(columns.data), reference.data);
  EXPECT_EQ(bytes_of(columns.scales), reference.scales);
  // A given amax (an all-reduced one) sets the global scale instead of the tensor's own.
  columns.amax.tensor().ptr<float>()[0] = 2 * reference.amax;
  cpu_.quantize(x, Tensor(), QuantizedTensor{}, columns.q, Tensor());
  EXPECT_NE(bytes_of(columns.scales), reference.scales);
}

TEST_F(CpuQuantize, ScaleUpdateRollsLikeDelayedScaling) {
  numerics::DelayedScalingConfig config;
  config.amax_history_length = 3;
  config.margin = 1;
  numerics::DelayedScaling reference(config, {numerics::TensorDirection::backward, numerics::TensorDirection::backward});
  Buffer history = test::upload(cpu_, std::vector<float>(6, 0.0f), Shape{3, 2});
  Buffer scale = test::upload(cpu_, {1.0f, 1.0f}, Shape{2});
  Buffer inverse = test::upload(cpu_, {1.0f, 1.0f}, Shape{2});
  ScaleUpdateArgs args;
  args.scaled_max = std::ldexp(numerics::kE5m2Max, -1);
  const float amaxes[4][2] = {{2.0f, 0.0f}, {0.5f, 8.0f}, {NAN, 1.0f}, {0.25f, 0.125f}};
  for (const auto& step : amaxes) {
    for (int t = 0; t < 2; ++t) {
      reference.record_amax(t, step[t]);
      history.tensor().ptr<float>()[t] = numerics::nan_propagating_max(history.tensor().ptr<float>()[t], step[t]);
    }
    reference.update();
    cpu_.fp8_scale_update(history, scale, inverse, args);
    for (int t = 0; t < 2; ++t) {
      EXPECT_EQ(scale.tensor().ptr<float>()[t], reference.scale(t));
      EXPECT_EQ(inverse.tensor().ptr<float>()[t], reference.scale_inverse(t));
      for (int slot = 0; slot < 3; ++slot) {
        const float got = history.tensor().ptr<float>()[slot * 2 + t], want = reference.history(slot, t);
        EXPECT_TRUE(std::isnan(want) ? std::isnan(got) : got == want);
      }
    }
  }
}

TEST_F(CpuQuantize, ColumnSumAndSupports) {
  Buffer x = test::upload(cpu_, values_, Shape{rows_, cols_});
  Buffer sums = test::upload(cpu_, std::vector<float>(static_cast<size_t>(cols_), 1.0f), Shape{cols_});
  cpu_.column_sum(x, sums);
  for (int64_t c = 0; c < cols_; ++c) {
    double total = 1.0;
    for (int64_t r = 0; r < rows_; ++r) total += values_[static_cast<size_t>(r * cols_ + c)];
    EXPECT_EQ(test::download(cpu_, sums)[static_cast<size_t>(c)], static_cast<float>(total));
  }
  for (DType dtype : {DType::e4m3, DType::e5m2, DType::e8m0, DType::e2m1}) {
    EXPECT_TRUE(cpu_.supports(OpKind::quantize, dtype));
    EXPECT_TRUE(cpu_.supports(OpKind::linear_forward, dtype));
    EXPECT_FALSE(cpu_.supports(OpKind::attention_forward, dtype));
  }
}

// A column range of whole rows (the queries' part of the packed q|k|v gradient): the sums of
// those columns, read through the row stride; a view that is not one is refused.
TEST_F(CpuQuantize, ColumnSumOfAColumnRange) {
  Buffer x = test::upload(cpu_, values_, Shape{rows_, cols_});
  const int64_t begin = 32, width = 40;
  Buffer sums = test::upload(cpu_, std::vector<float>(static_cast<size_t>(width), 2.0f), Shape{width});
  cpu_.column_sum(x.tensor().narrow(1, begin, width), sums, false);
  for (int64_t c = 0; c < width; ++c) {
    double total = 0.0;
    for (int64_t r = 0; r < rows_; ++r) total += values_[static_cast<size_t>(r * cols_ + begin + c)];
    EXPECT_EQ(test::download(cpu_, sums)[static_cast<size_t>(c)], static_cast<float>(total)) << c;
  }
  EXPECT_EQ(column_sum_row_stride(x.tensor().narrow(1, begin, width)), cols_);
  EXPECT_EQ(column_sum_row_stride(x.tensor()), cols_);
  Buffer column_sums = test::upload(cpu_, std::vector<float>(static_cast<size_t>(rows_), 0.0f), Shape{rows_});
  EXPECT_ANY_THROW(cpu_.column_sum(x.tensor().transpose(0, 1), column_sums, false));
}

}  // namespace
}  // namespace mxtrain
