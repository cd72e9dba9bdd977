// SwiGLU and GELU (tanh approximation) on the cpu backend: forward against double-precision
// formulas, backward against finite differences of Σ out·R.
#include <cmath>

#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

enum class Activation { swiglu, gelu };

struct ActivationCase {
  const char* name;
  Activation activation;
  int64_t rows, features;  // out is [rows, features]; swiglu's input is [rows, 2·features]
  float low, high;         // input range: covers both tails and the bend around 0
  // Max abs error of out: O(1..4) outputs from exp/tanh in f32, a few ulps.
  double forward_tolerance;
};

const ActivationCase kActivationCases[] = {
    {"swiglu_small", Activation::swiglu, 3, 5, -3.0f, 3.0f, 1e-5},
    {"swiglu_wide_range", Activation::swiglu, 4, 17, -6.0f, 6.0f, 2e-5},
    {"gelu_small", Activation::gelu, 3, 7, -3.0f, 3.0f, 1e-5},
    {"gelu_wide_range", Activation::gelu, 5, 19, -5.0f, 5.0f, 2e-5},
};

double silu(double x) { return x / (1.0 + std::exp(-x)); }
double gelu(double x) {
  const double k = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

class CpuActivation : public testing::TestWithParam<ActivationCase> {
 protected:
  bool swiglu() const { return GetParam().activation == Activation::swiglu; }
  int64_t in_cols() const { return swiglu() ? 2 * GetParam().features : GetParam().features; }
  std::vector<float> input() const {
    const ActivationCase& c = GetParam();
    return random_vector(static_cast<size_t>(c.rows * in_cols()), 61, c.low, c.high);
  }
  std::vector<float> forward(const std::vector<float>& values) {
    const ActivationCase& c = GetParam();
    Buffer x = upload(backend_, values, Shape{c.rows, in_cols()});
    Buffer out = zeros(backend_, Shape{c.rows, c.features});
    if (swiglu()) {
      backend_.swiglu_forward(x, out);
    } else {
      backend_.gelu_forward(x, out);
    }
    return download(backend_, out);
  }

  CpuBackend backend_{2};
};

TEST_P(CpuActivation, ForwardMatchesDoubleReference) {
  const ActivationCase& c = GetParam();
  const std::vector<float> x = input();
  std::vector<double> expected(static_cast<size_t>(c.rows * c.features));
  for (int64_t row = 0; row < c.rows; ++row) {
    for (int64_t f = 0; f < c.features; ++f) {
      const size_t out = static_cast<size_t>(row * c.features + f);
      if (swiglu()) {
        // gate/up interleaved: gate f in column 2f, up f in 2f + 1.
        const double gate = x[static_cast<size_t>(row * 2 * c.features + 2 * f)];
        const double up = x[static_cast<size_t>(row * 2 * c.features + 2 * f + 1)];
        expected[out] = silu(gate) * up;
      } else {
        expected[out] = gelu(x[out]);
      }
    }
  }
  EXPECT_LE(max_abs_error(forward(x), expected), c.forward_tolerance);
}

TEST_P(CpuActivation, BackwardMatchesFiniteDifferences) {
  const ActivationCase& c = GetParam();
  const std::vector<float> x = input();
  const std::vector<float> r = random_vector(static_cast<size_t>(c.rows * c.features), 62);
  Buffer tx = upload(backend_, x, Shape{c.rows, in_cols()});
  Buffer dout = upload(backend_, r, Shape{c.rows, c.features});
  Buffer dx = upload(backend_, random_vector(x.size(), 63), Shape{c.rows, in_cols()});  // overwritten
  if (swiglu()) {
    backend_.swiglu_backward(dout, tx, dx);
  } else {
    backend_.gelu_backward(dout, tx, dx);
  }
  const std::vector<float> numeric =
      numeric_gradient(x, [&](const std::vector<float>& v) { return weighted_sum(forward(v), r); });
  EXPECT_LE(relative_l2_error(download(backend_, dx), numeric), kGradientTolerance);
}

INSTANTIATE_TEST_SUITE_P(, CpuActivation, testing::ValuesIn(kActivationCases), CaseName());

}  // namespace
}  // namespace mxtrain::test
