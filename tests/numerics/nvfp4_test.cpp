// NVFP4: the two-level scale rules (§2.5) on hand-worked values, exact small examples computed by
// hand, 16×16 weight tiles, the round-trip error bound, stochastic rounding (unbiased and
// reproducible), and the random Hadamard transform (orthogonal; cancels between wgrad operands).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/hadamard.hpp"
#include "mxtrain/numerics/nvfp4.hpp"
#include "mxtrain/numerics/philox.hpp"

namespace mxtrain::numerics {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
const float kNan = std::numeric_limits<float>::quiet_NaN();
constexpr float kFloatMax = std::numeric_limits<float>::max();

// Roughly Gaussian values (sum of four uniforms), deterministic.
std::vector<float> gaussian_like(size_t count, uint64_t seed, float scale = 1.0f) {
  std::vector<float> values(count);
  uint64_t state = seed * 0x9E3779B97F4A7C15ull + 1;
  auto uniform = [&state] {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return static_cast<double>(state >> 11) / 9007199254740992.0;
  };
  for (float& value : values) value = static_cast<float>(scale * (uniform() + uniform() + uniform() + uniform() - 2.0));
  return values;
}

std::vector<float> transpose(const std::vector<float>& input, int64_t rows, int64_t cols) {
  std::vector<float> output(input.size());
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) output[c * rows + r] = input[r * cols + c];
  }
  return output;
}

// ---- scale rules ------------------------------------------------------------------------------------

TEST(Nvfp4Scales, GlobalEncodeScale) {
  EXPECT_EQ(nvfp4_global_encode_scale(6.0f), 448.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(2688.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(5376.0f), 0.5f);
  EXPECT_EQ(nvfp4_global_encode_scale(0.0f), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(kInf), 1.0f);
  EXPECT_EQ(nvfp4_global_encode_scale(1e-45f), kFloatMax);  // 2688 / denorm_min overflows
  EXPECT_EQ(nvfp4_global_encode_scale(kNan), kFloatMax);    // fminf semantics
  EXPECT_EQ(nvfp4_global_decode_scale(6.0f), 1.0f / 448.0f);
  EXPECT_EQ(nvfp4_global_decode_scale(0.0f), 1.0f);
}

TEST(Nvfp4Scales, BlockScaleAndMultiplier) {
  EXPECT_EQ(nvfp4_block_scale(6.0f, 448.0f), 0x7e);   // 6/6·448 = 448 (448.00003 before the cast)
  EXPECT_EQ(nvfp4_block_scale(3.0f, 448.0f), 0x76);   // 224
  EXPECT_EQ(nvfp4_block_scale(0.0f, 448.0f), 0x00);
  EXPECT_EQ(nvfp4_block_scale(1e30f, 448.0f), 0x7e);  // saturates
  EXPECT_EQ(nvfp4_block_scale(kNan, 448.0f), 0x7e);   // clamped to FLT_MAX first
  EXPECT_EQ(nvfp4_block_scale(6.0f, 1.0f), float_to_e4m3(1.0f));
  EXPECT_EQ(nvfp4_element_multiplier(0x7e, 1.0f / 448.0f), 1.0f);
  EXPECT_EQ(nvfp4_element_multiplier(0x76, 1.0f / 448.0f), 2.0f);
  EXPECT_EQ(nvfp4_element_multiplier(0x00, 1.0f / 448.0f), kFloatMax);  // 1/0 clamped
  EXPECT_EQ(nvfp4_block_decode_factor(0x76, 1.0f / 448.0f), 0.5f);
}

TEST(Nvfp4Scales, GemmAlphaIsTheProductOfDecodeScales) {
  const float a = 3.5f, b = 120.0f;
  EXPECT_NEAR(nvfp4_gemm_alpha(a, b), static_cast<double>(a) * b / (6.0 * 6.0 * 448.0 * 448.0),
              1e-6 * static_cast<double>(a) * b / 7225344.0);
  EXPECT_EQ(nvfp4_gemm_alpha(a, b), nvfp4_global_decode_scale(a) * nvfp4_global_decode_scale(b));
  EXPECT_EQ(nvfp4_gemm_alpha(0.0f, b), nvfp4_global_decode_scale(b));
}

// ---- hand-worked quantization ---------------------------------------------------------------------

TEST(Nvfp4, ExactSmallExample) {
  // Tensor amax 6 → S_enc = 448, S_dec = fl(1/448). Block 0 (amax 6) → scale 448 (0x7E), multiplier
  // 1: the values are E2M1 values and the spec's ties. Block 1 (amax 3) → scale 224 (0x76),
  // multiplier 2.
  const std::vector<float> input = {
      0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.25f, -0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -6,
      3, -1.5f, 0.25f, 0.5f, 1, 2, -0.125f, 0.375f, 0, 0, 0, 0, 0, 0, 0, 0};
  const Nvfp4Tensor tensor = quantize_nvfp4(input, 1, 32, {});
  EXPECT_EQ(tensor.amax, 6.0f);
  EXPECT_EQ(tensor.scales, (std::vector<uint8_t>{0x7e, 0x76}));
  const std::vector<uint8_t> expected_codes = {0, 1, 2, 3, 4, 5, 6, 7, 0x8, 0xa, 2, 4, 4, 6, 6, 0xf,
                                               7, 0xd, 1, 2, 4, 6, 0x8, 2, 0, 0, 0, 0, 0, 0, 0, 0};
  for (int col = 0; col < 32; ++col) EXPECT_EQ(tensor.element(0, col), expected_codes[col]) << col;
  EXPECT_EQ(tensor.data, (std::vector<uint8_t>{0x10, 0x32, 0x54, 0x76, 0xa8, 0x42, 0x64, 0xf6, 0xd7, 0x21, 0x64,
                                               0x28, 0, 0, 0, 0}));
  const std::vector<float> expected_values = {
      0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -1, 1, 2, 2, 4, 4, -6,
      3, -1.5f, 0.25f, 0.5f, 1, 2, -0.0f, 0.5f, 0, 0, 0, 0, 0, 0, 0, 0};
  EXPECT_EQ(dequantize_nvfp4(tensor), expected_values);
}

TEST(Nvfp4, TwoDimensionalTilesShareOneScale) {
  // 16 rows, each a multiple (r+1)/16 of the example row: tile amaxes 6 and 3 (from row 15).
  const std::vector<float> base = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.25f, -0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5, -6,
                                   3, -1.5f, 0.25f, 0.5f, 1, 2, -0.125f, 0.375f, 0, 0, 0, 0, 0, 0, 0, 0};
  std::vector<float> input;
  for (int r = 0; r < 16; ++r) {
    for (float value : base) input.push_back(value * static_cast<float>(r + 1) / 16.0f);
  }
  Nvfp4Options tiles;
  tiles.two_dimensional_blocks = true;
  const Nvfp4Tensor tiled = quantize_nvfp4(input, 16, 32, tiles);
  const Nvfp4Tensor rows = quantize_nvfp4(input, 16, 32, {});
  for (int r = 0; r < 16; ++r) {
    EXPECT_EQ(tiled.scales[r * 2], 0x7e) << r;
    EXPECT_EQ(tiled.scales[r * 2 + 1], 0x76) << r;
  }
  EXPECT_EQ(rows.scales[30], 0x7e);  // row 15 alone has the same amaxes
  EXPECT_EQ(rows.scales[31], 0x76);
  EXPECT_NE(rows.scales[0], 0x7e);   // row 0's own amax is 6/16
  // Row 15 quantizes identically both ways.
  for (int c = 0; c < 32; ++c) EXPECT_EQ(tiled.element(15, c), rows.element(15, c)) << c;
}

TEST(Nvfp4, TileQuantizationCommutesWithTransposition) {
  // With 16×16 tiles the rowwise and columnwise (transposed) copies hold the same numbers.
  const int64_t rows = 48, cols = 32;
  const std::vector<float> weight = gaussian_like(rows * cols, 5, 0.02f);
  const Nvfp4Options options = nvfp4_recipe_options(Nvfp4Role::weight, BlockAxis::rowwise);
  const std::vector<float> rowwise = dequantize_nvfp4(quantize_nvfp4(weight, rows, cols, options));
  const Nvfp4Tensor columnwise = quantize_nvfp4_transposed(weight, rows, cols, options);
  ASSERT_EQ(columnwise.rows, cols);
  ASSERT_EQ(columnwise.cols, rows);
  EXPECT_EQ(dequantize_nvfp4(columnwise), transpose(rowwise, rows, cols));
}

TEST(Nvfp4, RoundTripErrorBound) {
  const int64_t rows = 16, cols = 128;
  std::vector<float> input = gaussian_like(rows * cols, 17, 3.0f);
  input[77] = 40.0f;  // an outlier sets the tensor amax
  const Nvfp4Tensor tensor = quantize_nvfp4(input, rows, cols, {});
  const std::vector<float> back = dequantize_nvfp4(tensor);
  const double amax = 40.0;
  EXPECT_EQ(tensor.amax, 40.0f);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t block = 0; block < cols / 16; ++block) {
      double block_amax = 0;
      for (int64_t c = block * 16; c < block * 16 + 16; ++c) block_amax = std::max(block_amax, std::fabs(double(input[r * cols + c])));
      // The stored scale is the nearest E4M3 value to amax_b/6 · S_enc (computed here in double).
      const uint8_t scale = tensor.scales[r * (cols / 16) + block];
      EXPECT_EQ(scale, float_to_e4m3(static_cast<float>(block_amax / 6.0 * (2688.0 / amax)))) << r << "," << block;
      const double factor = e4m3_to_float(scale) * (amax / 2688.0);  // decode scale of the block
      for (int64_t c = block * 16; c < block * 16 + 16; ++c) {
        const double x = input[r * cols + c];
        const double y = std::fabs(x) / factor;  // the element in E2M1 units
        ASSERT_LE(y, 6.0 * (1 + 0x1p-4) * (1 + 1e-6));  // E4M3 rounding of the scale can push the block max past 6
        const double half_gap = y < 2 ? 0.25 : (y < 4 ? 0.5 : (y <= 6 ? 1.0 : y - 6.0));
        // plus FP32 rounding of the decode factor, which matters when y sits just above 6
        ASSERT_LE(std::fabs(back[r * cols + c] - x), half_gap * factor + 1e-6 * std::fabs(x)) << r << "," << c;
      }
    }
  }
}

TEST(Nvfp4, AllZeroAndNonFiniteTensors) {
  const std::vector<float> zeros(32, 0.0f);
  const Nvfp4Tensor zero = quantize_nvfp4(zeros, 2, 16, {});
  EXPECT_EQ(zero.amax, 0.0f);
  EXPECT_EQ(zero.global_decode_scale(), 1.0f);
  for (uint8_t scale : zero.scales) EXPECT_EQ(scale, 0);
  for (float value : dequantize_nvfp4(zero)) EXPECT_EQ(value, 0.0f);
  std::vector<float> with_nan(32, 1.0f);
  with_nan[3] = kNan;
  EXPECT_TRUE(std::isnan(quantize_nvfp4(with_nan, 2, 16, {}).amax));  // visible to the caller
}

TEST(Nvfp4, PackingPutsTheEvenElementInTheLowNibble) {
  std::vector<float> input(16, 0.0f);
  input[0] = 6.0f;   // code 7
  input[1] = -1.0f;  // code 0xA
  const Nvfp4Tensor tensor = quantize_nvfp4(input, 1, 16, {});
  EXPECT_EQ(tensor.data[0], 0xa7);
  EXPECT_EQ(tensor.element(0, 0), 0x7);
  EXPECT_EQ(tensor.element(0, 1), 0xa);
}

TEST(Nvfp4, RejectsUnsupportedShapes) {
  std::vector<float> input(8 * 24, 1.0f);
  EXPECT_THROW(quantize_nvfp4(input, 8, 24, {}), Error);
  Nvfp4Options tiles;
  tiles.two_dimensional_blocks = true;
  std::vector<float> narrow(8 * 16, 1.0f);
  EXPECT_THROW(quantize_nvfp4(narrow, 8, 16, tiles), Error);
  EXPECT_NO_THROW(quantize_nvfp4(narrow, 8, 16, {}));
}

TEST(Nvfp4, RecipeDefaults) {
  const Nvfp4Options activation_rows = nvfp4_recipe_options(Nvfp4Role::activation, BlockAxis::rowwise);
  const Nvfp4Options activation_cols = nvfp4_recipe_options(Nvfp4Role::activation, BlockAxis::columnwise);
  const Nvfp4Options weight = nvfp4_recipe_options(Nvfp4Role::weight, BlockAxis::columnwise);
  const Nvfp4Options gradient_rows = nvfp4_recipe_options(Nvfp4Role::gradient, BlockAxis::rowwise, 3, 4);
  const Nvfp4Options gradient_cols = nvfp4_recipe_options(Nvfp4Role::gradient, BlockAxis::columnwise, 3, 4);
  EXPECT_FALSE(activation_rows.random_hadamard || activation_rows.stochastic_rounding || activation_rows.two_dimensional_blocks);
  EXPECT_TRUE(activation_cols.random_hadamard);
  EXPECT_FALSE(activation_cols.stochastic_rounding);
  EXPECT_TRUE(weight.two_dimensional_blocks);
  EXPECT_FALSE(weight.random_hadamard || weight.stochastic_rounding);
  EXPECT_TRUE(gradient_rows.stochastic_rounding);
  EXPECT_FALSE(gradient_rows.random_hadamard);
  EXPECT_TRUE(gradient_cols.stochastic_rounding && gradient_cols.random_hadamard);
  EXPECT_EQ(gradient_cols.seed, 3u);
  EXPECT_EQ(gradient_cols.offset, 4u);
}

// ---- stochastic rounding ---------------------------------------------------------------------------

// amax 6 makes S_enc = 448, the block scale 448 and the multiplier exactly 1, so E2M1 sees x itself.
const std::vector<float> kOffGrid = {6, 0.3f, 0.8f, 1.1f, 1.9f, 2.3f, 3.7f, 4.5f,
                                     5.2f, -0.6f, -2.6f, 0.1f, 1.3f, 2.8f, -4.9f, 3.3f};

TEST(Nvfp4StochasticRounding, ElementIndexSelectsThePhiloxWord) {
  // Element (r, c) of a [rows, cols] matrix rounds with philox_random_word(seed, offset, r·cols + c).
  const int64_t rows = 4, cols = 32;
  const std::vector<float> input = gaussian_like(rows * cols, 13);
  Nvfp4Options options;
  options.stochastic_rounding = true;
  options.seed = 5;
  options.offset = 9;
  const Nvfp4Tensor tensor = quantize_nvfp4(input, rows, cols, options);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float multiplier = nvfp4_element_multiplier(tensor.scales[r * (cols / 16) + c / 16], tensor.global_decode_scale());
      const uint32_t word = philox_random_word(5, 9, static_cast<uint64_t>(r * cols + c));
      EXPECT_EQ(tensor.element(r, c), float_to_e2m1_stochastic(input[r * cols + c] * multiplier, word)) << r << "," << c;
    }
  }
}

TEST(Nvfp4StochasticRounding, ReproducibleAndStreamDependent) {
  Nvfp4Options options;
  options.stochastic_rounding = true;
  options.seed = 1234;
  options.offset = 1;
  const std::vector<float> input = gaussian_like(64 * 64, 9);
  const Nvfp4Tensor first = quantize_nvfp4(input, 64, 64, options);
  const Nvfp4Tensor again = quantize_nvfp4(input, 64, 64, options);
  EXPECT_EQ(first.data, again.data);
  EXPECT_EQ(first.scales, again.scales);
  options.offset = 2;
  EXPECT_NE(quantize_nvfp4(input, 64, 64, options).data, first.data);
  EXPECT_NE(quantize_nvfp4(input, 64, 64, {}).data, first.data);  // differs from RNE
}

TEST(Nvfp4StochasticRounding, UnbiasedOverManyStreams) {
  constexpr int kStreams = 20000;
  std::vector<double> sums(16, 0.0);
  Nvfp4Options options;
  options.stochastic_rounding = true;
  options.seed = 77;
  for (int stream = 0; stream < kStreams; ++stream) {
    options.offset = static_cast<uint64_t>(stream);
    const std::vector<float> back = dequantize_nvfp4(quantize_nvfp4(kOffGrid, 1, 16, options));
    for (int i = 0; i < 16; ++i) sums[i] += back[i];
  }
  for (int i = 0; i < 16; ++i) {
    const double x = std::fabs(kOffGrid[i]);
    const double gap = x < 2 ? 0.5 : (x < 4 ? 1.0 : 2.0);
    const double p = (x - (x < 2 ? std::floor(x * 2) / 2 : (x < 4 ? std::floor(x) : 4.0))) / gap;
    const double standard_error = gap * std::sqrt(p * (1 - p) / kStreams);
    EXPECT_NEAR(sums[i] / kStreams, kOffGrid[i], 5 * standard_error + 1e-9) << i;
  }
}

// ---- random Hadamard transform ---------------------------------------------------------------------

// H16 by Sylvester's construction and the sign vector as listed in docs/numerics-reference.md §2.5.
std::vector<std::vector<int>> sylvester16() {
  std::vector<std::vector<int>> h = {{1}};
  while (h.size() < 16) {
    const size_t n = h.size();
    std::vector<std::vector<int>> next(2 * n, std::vector<int>(2 * n));
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        next[i][j] = next[i][j + n] = next[i + n][j] = h[i][j];
        next[i + n][j + n] = -h[i][j];
      }
    }
    h = next;
  }
  return h;
}
const int kSigns[16] = {+1, +1, +1, -1, +1, -1, -1, -1, -1, -1, -1, +1, -1, +1, -1, -1};

TEST(RandomHadamard, MatrixIsQuarterSignsTimesSylvester) {
  const auto h16 = sylvester16();
  for (int i = 0; i < 16; ++i) {
    float unit[16] = {};
    unit[i] = 1.0f;
    float row[16];
    random_hadamard_transform16(unit, row);  // e_i · H is row i of H
    for (int j = 0; j < 16; ++j) {
      const float expected = 0.25f * static_cast<float>(kSigns[i] * h16[i][j]);
      EXPECT_EQ(row[j], expected) << i << "," << j;
      EXPECT_EQ(random_hadamard_entry(i, j), expected) << i << "," << j;
    }
  }
}

TEST(RandomHadamard, IsOrthogonal) {
  // H·Hᵀ = I exactly: entries are ±1/4, so every dot product is a sum of sixteen ±1/16.
  for (int i = 0; i < 16; ++i) {
    for (int k = 0; k < 16; ++k) {
      float dot = 0.0f;
      for (int j = 0; j < 16; ++j) dot += random_hadamard_entry(i, j) * random_hadamard_entry(k, j);
      EXPECT_EQ(dot, i == k ? 1.0f : 0.0f) << i << "," << k;
    }
  }
}

TEST(RandomHadamard, MatchesTheMatrixProduct) {
  const std::vector<float> x = gaussian_like(16 * 8, 21, 10.0f);
  for (int chunk = 0; chunk < 8; ++chunk) {
    float y[16];
    random_hadamard_transform16(&x[chunk * 16], y);
    double norm_x = 0, norm_y = 0;
    for (int j = 0; j < 16; ++j) {
      double expected = 0;
      for (int i = 0; i < 16; ++i) expected += double(x[chunk * 16 + i]) * random_hadamard_entry(i, j);
      EXPECT_NEAR(y[j], expected, 1e-5 * 40) << chunk << "," << j;
      norm_x += double(x[chunk * 16 + j]) * x[chunk * 16 + j];
      norm_y += double(y[j]) * y[j];
    }
    EXPECT_NEAR(std::sqrt(norm_y), std::sqrt(norm_x), 1e-5 * std::sqrt(norm_x));
  }
}

// C = A·Bᵀ with K along the rows of both, in double.
std::vector<double> product_abt(const std::vector<float>& a, const std::vector<float>& b, int64_t m, int64_t n, int64_t k) {
  std::vector<double> c(m * n, 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      for (int64_t t = 0; t < k; ++t) c[i * n + j] += double(a[i * k + t]) * b[j * k + t];
    }
  }
  return c;
}

double relative_frobenius(const std::vector<double>& got, const std::vector<double>& want) {
  double error = 0, norm = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    error += (got[i] - want[i]) * (got[i] - want[i]);
    norm += want[i] * want[i];
  }
  return std::sqrt(error / norm);
}

TEST(RandomHadamard, CancelsBetweenTheWgradOperands) {
  const int64_t m = 8, n = 12, k = 64;
  const std::vector<float> a = gaussian_like(m * k, 31);
  const std::vector<float> b = gaussian_like(n * k, 32);
  std::vector<float> a_rotated = a, b_rotated = b;
  random_hadamard_transform_rows(a_rotated, m, k);
  random_hadamard_transform_rows(b_rotated, n, k);
  const std::vector<double> exact = product_abt(a, b, m, n, k);
  const std::vector<double> rotated = product_abt(a_rotated, b_rotated, m, n, k);
  for (size_t i = 0; i < exact.size(); ++i) EXPECT_NEAR(rotated[i], exact[i], 1e-5) << i;
  const std::vector<double> one_sided = product_abt(a_rotated, b, m, n, k);
  EXPECT_GT(relative_frobenius(one_sided, exact), 0.5);  // the transform really changes each operand
}

TEST(RandomHadamard, Nvfp4WgradWithRhtApproximatesTheExactProduct) {
  // dW = dYᵀ·X over 128 tokens; both operands quantized as TE's columnwise copies: transposed,
  // RHT along the tokens, and stochastic rounding for the gradient.
  const int64_t tokens = 128, in_features = 32, out_features = 16;
  const std::vector<float> x = gaussian_like(tokens * in_features, 41);
  std::vector<float> dy = gaussian_like(tokens * out_features, 42, 1e-3f);
  dy[5 * out_features + 3] = 0.05f;  // an outlier gradient
  const Nvfp4Tensor xq = quantize_nvfp4_transposed(x, tokens, in_features,
                                                   nvfp4_recipe_options(Nvfp4Role::activation, BlockAxis::columnwise));
  const Nvfp4Tensor dyq = quantize_nvfp4_transposed(dy, tokens, out_features,
                                                    nvfp4_recipe_options(Nvfp4Role::gradient, BlockAxis::columnwise, 99, 0));
  const std::vector<double> exact = product_abt(transpose(dy, tokens, out_features), transpose(x, tokens, in_features),
                                                out_features, in_features, tokens);
  const std::vector<double> quantized =
      product_abt(dequantize_nvfp4(dyq), dequantize_nvfp4(xq), out_features, in_features, tokens);
  // Each operand's own quantization error, measured in the rotated domain (the RHT keeps norms).
  std::vector<float> x_rotated = transpose(x, tokens, in_features);
  std::vector<float> dy_rotated = transpose(dy, tokens, out_features);
  random_hadamard_transform_rows(x_rotated, in_features, tokens);
  random_hadamard_transform_rows(dy_rotated, out_features, tokens);
  auto operand_error = [](const std::vector<float>& got, const std::vector<float>& want) {
    double error = 0, norm = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      error += (double(got[i]) - want[i]) * (double(got[i]) - want[i]);
      norm += double(want[i]) * want[i];
    }
    return std::sqrt(error / norm);
  };
  const double x_error = operand_error(dequantize_nvfp4(xq), x_rotated);
  const double dy_error = operand_error(dequantize_nvfp4(dyq), dy_rotated);
  const double product_error = relative_frobenius(quantized, exact);
  // NVFP4 on Gaussian-like data: about 0.1 relative error with RNE, about 0.17 with stochastic
  // rounding (it trades variance for unbiasedness); measured 0.096 and 0.170 here.
  EXPECT_LT(x_error, 0.12);
  EXPECT_LT(dy_error, 0.2);
  // Independent operand errors add in quadrature in the product (measured 0.197 against 0.195);
  // a transform that did not cancel would add an O(1) error instead (see the control below).
  EXPECT_LT(product_error, 1.25 * std::hypot(x_error, dy_error));

  // The same product from the raw codes: block scales per operand and alpha once, as cuBLAS does.
  const float alpha = nvfp4_gemm_alpha(dyq.amax, xq.amax);
  std::vector<double> from_codes(out_features * in_features, 0.0);
  for (int64_t o = 0; o < out_features; ++o) {
    for (int64_t i = 0; i < in_features; ++i) {
      for (int64_t t = 0; t < tokens; ++t) {
        from_codes[o * in_features + i] += double(e2m1_to_float(dyq.element(o, t))) *
                                           e4m3_to_float(dyq.scales[o * (tokens / 16) + t / 16]) *
                                           e2m1_to_float(xq.element(i, t)) *
                                           e4m3_to_float(xq.scales[i * (tokens / 16) + t / 16]);
      }
      from_codes[o * in_features + i] *= alpha;
    }
  }
  EXPECT_LT(relative_frobenius(from_codes, quantized), 1e-5);

  // Control: transforming only one operand leaves an O(1) error (measured 1.8), so the checks above
  // have teeth.
  Nvfp4Options no_rht = nvfp4_recipe_options(Nvfp4Role::gradient, BlockAxis::columnwise, 99, 0);
  no_rht.random_hadamard = false;
  const Nvfp4Tensor dyq_plain = quantize_nvfp4_transposed(dy, tokens, out_features, no_rht);
  const std::vector<double> mismatched =
      product_abt(dequantize_nvfp4(dyq_plain), dequantize_nvfp4(xq), out_features, in_features, tokens);
  EXPECT_GT(relative_frobenius(mismatched, exact), 0.5);
}

}  // namespace
}  // namespace mxtrain::numerics
