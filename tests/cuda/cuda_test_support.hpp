// Shared pieces of the cuda tests: a fixture that creates the cpu oracle and the cuda backend
// through the registry (and skips when no GPU is present), and helpers that feed both the
// same inputs. Inputs for bf16 runs are rounded to bf16 on the host first, so the CPU sees
// exactly the values the GPU reads and the measured error is the GPU's own arithmetic and
// output rounding, not input quantisation.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/backend/cuda/cuda_backend.hpp"
#include "mxtrain/core/error.hpp"
#include "support/test_support.hpp"

namespace mxtrain::test {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!backend_available("cuda")) GTEST_SKIP() << "no CUDA device on this machine";
    BackendOptions options;
    options.deterministic = true;
    cuda_ = create_backend("cuda", options);
    cpu_ = create_backend("cpu");
  }
  Backend& cpu() { return *cpu_; }
  Backend& cuda() { return *cuda_; }
  CudaBackend& cuda_backend() { return dynamic_cast<CudaBackend&>(*cuda_); }

  std::unique_ptr<Backend> cpu_, cuda_;
};

// Values as the given dtype stores them (identity for f32).
inline std::vector<float> rounded(std::vector<float> values, DType dtype) {
  if (dtype == DType::bf16)
    for (float& v : values) v = round_to_bf16(v);
  if (dtype == DType::f16)
    for (float& v : values) v = round_to_f16(v);
  return values;
}

inline std::vector<float> random_as(size_t count, uint64_t seed, DType dtype, float low = -1.0f, float high = 1.0f) {
  return rounded(random_vector(count, seed, low, high), dtype);
}

// Relative L2 error, printed so the device log carries every measured number.
inline double report_error(const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  const double error = relative_l2_error(got, want);
  std::printf("[ error ] %-60s rel L2 %.3e\n", what.c_str(), error);
  return error;
}

inline std::string dtype_text(DType dtype) { return std::string(dtype_name(dtype)); }

}  // namespace mxtrain::test
