// Linear layers on the cpu backend (OpenBLAS): forward against a double-precision reference;
// backward_input and backward_weight (with and without bias, accumulate or overwrite) against
// finite differences of Σ out·R.
#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

struct LinearCase {
  const char* name;
  int64_t rows, in_features, out_features;
  bool with_bias;
  bool accumulate_dx;
};

const LinearCase kLinearCases[] = {
    {"square_bias", 8, 16, 16, true, false},
    {"odd_no_bias", 7, 13, 5, false, false},
    {"wide_bias_accumulate", 5, 9, 33, true, true},
    {"one_row_no_bias_accumulate", 1, 31, 3, false, true},
};

class CpuLinear : public testing::TestWithParam<LinearCase> {
 protected:
  void SetUp() override {
    const LinearCase& c = GetParam();
    x_ = random_vector(static_cast<size_t>(c.rows * c.in_features), 31);
    weight_ = random_vector(static_cast<size_t>(c.out_features * c.in_features), 32, -0.5f, 0.5f);
    if (c.with_bias) bias_ = random_vector(static_cast<size_t>(c.out_features), 33);
  }

  std::vector<float> forward(const std::vector<float>& x, const std::vector<float>& weight,
                             const std::vector<float>& bias) {
    const LinearCase& c = GetParam();
    Buffer tx = upload(backend_, x, Shape{c.rows, c.in_features});
    Buffer tw = upload(backend_, weight, Shape{c.out_features, c.in_features});
    Buffer tb = c.with_bias ? upload(backend_, bias, Shape{c.out_features}) : Buffer();
    Buffer out = upload(backend_, random_vector(static_cast<size_t>(c.rows * c.out_features), 34),
                        Shape{c.rows, c.out_features});  // garbage: the forward overwrites
    backend_.gemm({.role = GemmRole::forward, .a = tx, .b = tw, .out = out, .bias = tb});
    return download(backend_, out);
  }

  CpuBackend backend_{2};
  std::vector<float> x_, weight_, bias_;
};

// Each output against the double-precision sum, within the f32 rounding bound of a sum of K + 1
// terms in any order, with or without fused multiply-adds: (K + 1)·2⁻²⁴·(|b| + Σ|x·w|). The bound
// is relative to the terms' magnitudes, not to the result's, which cancellation can make small
// (a relative-error check failed where OpenBLAS's AVX-512 kernel sums in another order than its
// AVX2 one); a wrong element or index is off by about the terms themselves.
TEST_P(CpuLinear, ForwardMatchesDoubleReference) {
  const LinearCase& c = GetParam();
  const std::vector<float> out = forward(x_, weight_, bias_);
  double worst = 0;  // the largest error as a fraction of its bound
  for (int64_t n = 0; n < c.rows; ++n) {
    for (int64_t m = 0; m < c.out_features; ++m) {
      const double bias = c.with_bias ? bias_[static_cast<size_t>(m)] : 0.0;
      double total = bias, magnitude = std::fabs(bias);
      for (int64_t k = 0; k < c.in_features; ++k) {
        const double term = static_cast<double>(x_[static_cast<size_t>(n * c.in_features + k)]) *
                            weight_[static_cast<size_t>(m * c.in_features + k)];
        total += term;
        magnitude += std::fabs(term);
      }
      const double bound = static_cast<double>(c.in_features + 1) * 0x1.0p-24 * magnitude;
      worst = std::max(worst, std::fabs(out[static_cast<size_t>(n * c.out_features + m)] - total) / bound);
    }
  }
  EXPECT_LE(worst, 1.0) << "an output is off by more than f32 rounding of its terms allows";
}

TEST_P(CpuLinear, BackwardMatchesFiniteDifferences) {
  const LinearCase& c = GetParam();
  const std::vector<float> r = random_vector(static_cast<size_t>(c.rows * c.out_features), 35);
  const std::vector<float> dx_before = c.accumulate_dx ? random_vector(x_.size(), 36) : std::vector<float>(x_.size());
  const std::vector<float> dweight_before = random_vector(weight_.size(), 37);
  const std::vector<float> dbias_before = random_vector(static_cast<size_t>(c.out_features), 38);

  Buffer dout = upload(backend_, r, Shape{c.rows, c.out_features});
  Buffer tx = upload(backend_, x_, Shape{c.rows, c.in_features});
  Buffer tw = upload(backend_, weight_, Shape{c.out_features, c.in_features});
  Buffer dx = upload(backend_, c.accumulate_dx ? dx_before : random_vector(x_.size(), 39), Shape{c.rows, c.in_features});
  Buffer dweight = upload(backend_, dweight_before, Shape{c.out_features, c.in_features});
  Buffer dbias = c.with_bias ? upload(backend_, dbias_before, Shape{c.out_features}) : Buffer();
  backend_.gemm({.role = GemmRole::backward_input, .a = dout, .b = tw, .out = dx, .accumulate = c.accumulate_dx});
  backend_.gemm({.role = GemmRole::backward_weight, .a = dout, .b = tx, .out = dweight, .accumulate = true,
                 .bias_gradient = dbias});

  auto objective = [&](const std::vector<float>& x, const std::vector<float>& w, const std::vector<float>& b) {
    return weighted_sum(forward(x, w, b), r);
  };
  const std::vector<float> dx_numeric =
      numeric_gradient(x_, [&](const std::vector<float>& v) { return objective(v, weight_, bias_); });
  const std::vector<float> dweight_numeric =
      numeric_gradient(weight_, [&](const std::vector<float>& v) { return objective(x_, v, bias_); });
  EXPECT_LE(relative_l2_error(difference(download(backend_, dx), dx_before), dx_numeric), kGradientTolerance);
  EXPECT_LE(relative_l2_error(difference(download(backend_, dweight), dweight_before), dweight_numeric),
            kGradientTolerance);
  if (c.with_bias) {
    const std::vector<float> dbias_numeric =
        numeric_gradient(bias_, [&](const std::vector<float>& v) { return objective(x_, weight_, v); });
    EXPECT_LE(relative_l2_error(difference(download(backend_, dbias), dbias_before), dbias_numeric),
              kGradientTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(, CpuLinear, testing::ValuesIn(kLinearCases), CaseName());

// The GEMMs are cut into 128 x 512 tiles of C; the cases above fit in one tile. Here every product
// spans several tiles in both directions (forward 3 x 2, backward_input 3 x 2 with an
// untransposed weight, backward_weight 5 x 2 with a transposed dout), checked against double sums:
// too large for finite differences, and the backward formulas are already checked above.
TEST(CpuLinearTiles, ProductsSpanningSeveralTilesMatchDoubleReference) {
  CpuBackend backend(2);
  const int64_t rows = 260, in_features = 530, out_features = 600;
  const std::vector<float> x = random_vector(static_cast<size_t>(rows * in_features), 401);
  const std::vector<float> w = random_vector(static_cast<size_t>(out_features * in_features), 402);
  const std::vector<float> g = random_vector(static_cast<size_t>(rows * out_features), 403);
  auto at = [](const std::vector<float>& v, int64_t row, int64_t col, int64_t cols) {
    return static_cast<double>(v[static_cast<size_t>(row * cols + col)]);
  };
  std::vector<float> out_ref(g.size()), dx_ref(x.size()), dw_ref(w.size());
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t m = 0; m < out_features; ++m) {
      double total = 0;
      for (int64_t k = 0; k < in_features; ++k) total += at(x, n, k, in_features) * at(w, m, k, in_features);
      out_ref[static_cast<size_t>(n * out_features + m)] = static_cast<float>(total);
    }
  for (int64_t n = 0; n < rows; ++n)
    for (int64_t k = 0; k < in_features; ++k) {
      double total = 0;
      for (int64_t m = 0; m < out_features; ++m) total += at(g, n, m, out_features) * at(w, m, k, in_features);
      dx_ref[static_cast<size_t>(n * in_features + k)] = static_cast<float>(total);
    }
  for (int64_t m = 0; m < out_features; ++m)
    for (int64_t k = 0; k < in_features; ++k) {
      double total = 0;
      for (int64_t n = 0; n < rows; ++n) total += at(g, n, m, out_features) * at(x, n, k, in_features);
      dw_ref[static_cast<size_t>(m * in_features + k)] = static_cast<float>(total);
    }
  Buffer tx = upload(backend, x, Shape{rows, in_features});
  Buffer tw = upload(backend, w, Shape{out_features, in_features});
  Buffer tg = upload(backend, g, Shape{rows, out_features});
  Buffer out = zeros(backend, Shape{rows, out_features});
  Buffer dx = zeros(backend, Shape{rows, in_features});
  Buffer dw = zeros(backend, Shape{out_features, in_features});
  backend.gemm({.role = GemmRole::forward, .a = tx, .b = tw, .out = out});
  backend.gemm({.role = GemmRole::backward_input, .a = tg, .b = tw, .out = dx});
  backend.gemm({.role = GemmRole::backward_weight, .a = tg, .b = tx, .out = dw, .accumulate = true});
  // Sums of 260..600 products of O(1) terms are O(10); f32 accumulation is off by ~1e-5 of that.
  EXPECT_LE(relative_l2_error(download(backend, out), out_ref), 1e-5);
  EXPECT_LE(relative_l2_error(download(backend, dx), dx_ref), 1e-5);
  EXPECT_LE(relative_l2_error(download(backend, dw), dw_ref), 1e-5);
}

}  // namespace
}  // namespace mxtrain::test
