// Helpers for the CPU op-conformance suite: host <-> tensor transfers, the scalar objective
// L = Σ out·R that every backward is checked against, and central finite differences of it.
//
// Why central differences with eps = 1e-3 and a 1e-2 relative-L2 tolerance are honest in FP32:
// inputs are O(1) and the ops smooth, so the truncation error eps²·|f'''|/6 is about 1e-7. The
// rounding error is what limits: perturbing one input changes only the outputs that depend on it
// (the others cancel exactly in L+ − L−), each carrying an f32 rounding of ~6e-8 relative, so the
// difference quotient is off by about 6e-8·sqrt(affected outputs)/(2·eps) ≈ 3e-5·sqrt(k) — around
// 1e-3 of a typical O(0.1..1) gradient. A wrong formula (a missing term, a transposed index, a
// wrong scale) moves the relative L2 error to O(0.1..1), two orders above the tolerance.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/core/error.hpp"
#include "support/test_support.hpp"

namespace mxtrain::test {

constexpr float kFiniteDifferenceStep = 1e-3f;
constexpr double kGradientTolerance = 1e-2;  // relative L2 error against finite differences

inline void write(Backend& backend, const Tensor& tensor, const std::vector<float>& values) {
  ASSERT_EQ(static_cast<int64_t>(values.size()), tensor.numel());
  ASSERT_EQ(tensor.dtype, DType::f32);
  backend.copy_from_host(values.data(), tensor);
}

inline Buffer zeros(Backend& backend, Shape shape, const std::string& name = "zeros") {
  Buffer buffer = backend.allocate(name, shape, DType::f32, Lifetime::scratch);
  backend.fill(buffer, 0.0f);
  return buffer;
}

// Σ values·weights in double.
inline double weighted_sum(const std::vector<float>& values, const std::vector<float>& weights) {
  EXPECT_EQ(values.size(), weights.size());
  double total = 0;
  for (size_t i = 0; i < values.size() && i < weights.size(); ++i)
    total += static_cast<double>(values[i]) * weights[i];
  return total;
}

// ∂objective/∂input[i] for every i by central differences. The step actually taken is
// f32(x+eps) − f32(x−eps), not 2·eps, so representation error in x does not bias the quotient.
inline std::vector<float> numeric_gradient(std::vector<float> input,
                                           const std::function<double(const std::vector<float>&)>& objective,
                                           float eps = kFiniteDifferenceStep) {
  std::vector<float> gradient(input.size());
  for (size_t i = 0; i < input.size(); ++i) {
    const float original = input[i];
    const float up = original + eps, down = original - eps;
    input[i] = up;
    const double above = objective(input);
    input[i] = down;
    const double below = objective(input);
    input[i] = original;
    gradient[i] = static_cast<float>((above - below) / (static_cast<double>(up) - static_cast<double>(down)));
  }
  return gradient;
}

inline std::vector<float> difference(const std::vector<float>& after, const std::vector<float>& before) {
  std::vector<float> result(after.size());
  for (size_t i = 0; i < after.size(); ++i) result[i] = after[i] - before[i];
  return result;
}

inline double max_abs_error(const std::vector<float>& a, const std::vector<double>& reference) {
  EXPECT_EQ(a.size(), reference.size());
  double worst = 0;
  for (size_t i = 0; i < a.size() && i < reference.size(); ++i) {
    double error = std::fabs(static_cast<double>(a[i]) - reference[i]);
    if (std::isnan(error)) return INFINITY;
    worst = std::max(worst, error);
  }
  return worst;
}

inline std::vector<float> to_float(const std::vector<double>& values) {
  return std::vector<float>(values.begin(), values.end());
}

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

// gtest parameter names from the case struct's `name`.
struct CaseName {
  template <typename Param>
  std::string operator()(const testing::TestParamInfo<Param>& info) const {
    return info.param.name;
  }
};

}  // namespace mxtrain::test
