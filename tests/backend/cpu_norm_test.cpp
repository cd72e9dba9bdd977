// RMSNorm and LayerNorm on the cpu backend: forward against a double-precision scalar reference,
// backward (dx, dweight, dbias, accumulate or overwrite) against finite differences of Σ out·R.
#include <cmath>

#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

struct NormCase {
  const char* name;
  NormKind kind;
  int64_t rows, cols;
  bool with_bias;
  bool accumulate_dx;
  // Max abs error of out against the double reference. Outputs are O(1..5); the f32 rounding of
  // the saved mean and rstd and of three products is a few ulps, about 1e-6.
  double forward_tolerance;
};

const NormCase kNormCases[] = {
    {"rms_overwrite", NormKind::rms, 6, 37, false, false, 1e-5},
    {"rms_accumulate", NormKind::rms, 5, 64, false, true, 1e-5},
    {"rms_bias_accumulate", NormKind::rms, 3, 19, true, true, 1e-5},
    {"layer_overwrite", NormKind::layer, 7, 33, true, false, 1e-5},
    {"layer_accumulate", NormKind::layer, 4, 48, true, true, 1e-5},
    {"layer_rows_span_chunks", NormKind::layer, 70, 9, true, false, 1e-5},
};

constexpr float kEps = 1e-5f;

class CpuNorm : public testing::TestWithParam<NormCase> {
 protected:
  struct Inputs {
    std::vector<float> x, weight, bias;
  };

  Inputs inputs() const {
    const NormCase& c = GetParam();
    Inputs in;
    // A row offset for LayerNorm, so subtracting the mean matters.
    in.x = random_vector(static_cast<size_t>(c.rows * c.cols), 11, c.kind == NormKind::layer ? 0.5f : -1.0f, 1.5f);
    in.weight = random_vector(static_cast<size_t>(c.cols), 12, 0.5f, 1.5f);
    if (c.with_bias) in.bias = random_vector(static_cast<size_t>(c.cols), 13, -0.5f, 0.5f);
    return in;
  }

  struct Forward {
    Buffer out, mean, rstd;
  };

  Forward forward(const Inputs& in) {
    const NormCase& c = GetParam();
    Buffer x = upload(backend_, in.x, Shape{c.rows, c.cols});
    Buffer weight = upload(backend_, in.weight, Shape{c.cols});
    Buffer bias = c.with_bias ? upload(backend_, in.bias, Shape{c.cols}) : Buffer();
    Forward f;
    f.out = zeros(backend_, Shape{c.rows, c.cols});
    if (c.kind == NormKind::layer) f.mean = zeros(backend_, Shape{c.rows});
    f.rstd = zeros(backend_, Shape{c.rows});
    backend_.norm_forward(c.kind, x, weight, bias, f.out, f.mean, f.rstd, kEps);
    return f;
  }

  double objective(const Inputs& in, const std::vector<float>& r) {
    return weighted_sum(download(backend_, forward(in).out), r);
  }

  CpuBackend backend_{2};
};

TEST_P(CpuNorm, ForwardMatchesDoubleReference) {
  const NormCase& c = GetParam();
  const Inputs in = inputs();
  Forward f = forward(in);
  std::vector<double> out(in.x.size()), mean(static_cast<size_t>(c.rows)), rstd(static_cast<size_t>(c.rows));
  for (int64_t row = 0; row < c.rows; ++row) {
    const float* x = in.x.data() + row * c.cols;
    double center = 0, squares = 0;
    if (c.kind == NormKind::layer) {
      for (int64_t i = 0; i < c.cols; ++i) center += x[i];
      center /= static_cast<double>(c.cols);
    }
    for (int64_t i = 0; i < c.cols; ++i) squares += (x[i] - center) * (x[i] - center);
    const double inverse = 1.0 / std::sqrt(squares / static_cast<double>(c.cols) + kEps);
    mean[static_cast<size_t>(row)] = center;
    rstd[static_cast<size_t>(row)] = inverse;
    for (int64_t i = 0; i < c.cols; ++i) {
      double value = (x[i] - center) * inverse * in.weight[static_cast<size_t>(i)];
      if (c.with_bias) value += in.bias[static_cast<size_t>(i)];
      out[static_cast<size_t>(row * c.cols + i)] = value;
    }
  }
  EXPECT_LE(max_abs_error(download(backend_, f.out), out), c.forward_tolerance);
  EXPECT_LE(max_relative_error(download(backend_, f.rstd), to_float(rstd)), 1e-6);  // one f32 rounding
  if (c.kind == NormKind::layer) EXPECT_LE(max_abs_error(download(backend_, f.mean), mean), 1e-6);
}

TEST_P(CpuNorm, BackwardMatchesFiniteDifferences) {
  const NormCase& c = GetParam();
  const Inputs in = inputs();
  const std::vector<float> r = random_vector(in.x.size(), 14);
  // Start the accumulated outputs away from zero to check += against =.
  const std::vector<float> dx_before =
      c.accumulate_dx ? random_vector(in.x.size(), 15) : std::vector<float>(in.x.size(), 0.0f);
  const std::vector<float> dweight_before = random_vector(in.weight.size(), 16);
  const std::vector<float> dbias_before = random_vector(static_cast<size_t>(c.cols), 17);

  Forward f = forward(in);
  Buffer x = upload(backend_, in.x, Shape{c.rows, c.cols});
  Buffer weight = upload(backend_, in.weight, Shape{c.cols});
  Buffer dout = upload(backend_, r, Shape{c.rows, c.cols});
  Buffer dx = upload(backend_, c.accumulate_dx ? dx_before : random_vector(in.x.size(), 18), Shape{c.rows, c.cols});
  Buffer dweight = upload(backend_, dweight_before, Shape{c.cols});
  Buffer dbias = c.with_bias ? upload(backend_, dbias_before, Shape{c.cols}) : Buffer();
  backend_.norm_backward(c.kind, dout, x, weight, f.mean, f.rstd, dx, dweight, dbias, c.accumulate_dx);

  const std::vector<float> dx_numeric = numeric_gradient(in.x, [&](const std::vector<float>& v) {
    Inputs changed = in;
    changed.x = v;
    return objective(changed, r);
  });
  const std::vector<float> dweight_numeric = numeric_gradient(in.weight, [&](const std::vector<float>& v) {
    Inputs changed = in;
    changed.weight = v;
    return objective(changed, r);
  });
  EXPECT_LE(relative_l2_error(difference(download(backend_, dx), dx_before), dx_numeric), kGradientTolerance);
  EXPECT_LE(relative_l2_error(difference(download(backend_, dweight), dweight_before), dweight_numeric),
            kGradientTolerance);
  if (c.with_bias) {
    const std::vector<float> dbias_numeric = numeric_gradient(in.bias, [&](const std::vector<float>& v) {
      Inputs changed = in;
      changed.bias = v;
      return objective(changed, r);
    });
    EXPECT_LE(relative_l2_error(difference(download(backend_, dbias), dbias_before), dbias_numeric),
              kGradientTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(, CpuNorm, testing::ValuesIn(kNormCases), CaseName());

TEST(CpuAddNorm, SumIsExactAndOutEqualsNormOfSum) {
  CpuBackend backend(2);
  const int64_t rows = 5, cols = 24;
  const std::vector<float> a = random_vector(rows * cols, 21), b = random_vector(rows * cols, 22);
  const std::vector<float> weight = random_vector(cols, 23, 0.5f, 1.5f), bias = random_vector(cols, 24);
  for (NormKind kind : {NormKind::rms, NormKind::layer}) {
    Buffer ta = upload(backend, a, Shape{rows, cols}), tb = upload(backend, b, Shape{rows, cols});
    Buffer tw = upload(backend, weight, Shape{cols}), tbias = upload(backend, bias, Shape{cols});
    Buffer sum = zeros(backend, Shape{rows, cols}), out = zeros(backend, Shape{rows, cols});
    Buffer mean = zeros(backend, Shape{rows}), rstd = zeros(backend, Shape{rows});
    backend.add_norm_forward(kind, ta, tb, sum, tw, tbias, out, mean, rstd, kEps);
    std::vector<float> expected_sum(a.size());
    for (size_t i = 0; i < a.size(); ++i) expected_sum[i] = a[i] + b[i];
    EXPECT_TRUE(same_bits(download(backend, sum), expected_sum));
    Buffer out2 = zeros(backend, Shape{rows, cols}), mean2 = zeros(backend, Shape{rows}),
           rstd2 = zeros(backend, Shape{rows});
    backend.norm_forward(kind, sum, tw, tbias, out2, mean2, rstd2, kEps);
    EXPECT_TRUE(same_bits(download(backend, out), download(backend, out2)));
    EXPECT_TRUE(same_bits(download(backend, rstd), download(backend, rstd2)));
  }
}

}  // namespace
}  // namespace mxtrain::test
