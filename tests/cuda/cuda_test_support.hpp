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
// An AdamW weight cast (delayed scaling): elements [begin, end) of the update written as an E4M3
// copy of `shape` (rows x k, end - begin elements) with the given scale (f32 [1]); its amax record
// starts at 0. The buffers it needs are appended to `keep`.
inline WeightCastSegment weight_cast_segment(Backend& backend, int64_t begin, int64_t end, Shape shape, float scale,
                                             std::vector<Buffer>& keep) {
  WeightCastSegment cast;
  cast.begin = begin;
  cast.end = end;
  keep.push_back(upload(backend, {scale}, Shape{1}));
  cast.scale = keep.back();
  keep.push_back(upload(backend, {0.0f}, Shape{1}));
  cast.amax = keep.back();
  cast.out.spec.mode = ScalingMode::per_tensor;
  cast.out.spec.element = DType::e4m3;
  keep.push_back(backend.allocate("cast", shape, DType::e4m3, Lifetime::scratch));
  cast.out.data = keep.back();
  keep.push_back(backend.allocate("cast.scale_inverse", Shape{1}, DType::f32, Lifetime::scratch));
  cast.out.scale_inverse = keep.back();
  return cast;
}

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

// An attention shape of the attention tests, its test-name form and its AttentionShape.
struct AttentionCase {
  int64_t batch, seq, heads, kv_heads, head_dim;
};

inline std::string case_name(const AttentionCase& c) {
  return "B" + std::to_string(c.batch) + "_T" + std::to_string(c.seq) + "_H" + std::to_string(c.heads) + "_KV" +
         std::to_string(c.kv_heads) + "_D" + std::to_string(c.head_dim);
}

inline AttentionShape shape_of(const AttentionCase& c) {
  AttentionShape shape;
  shape.batch = c.batch;
  shape.seq = c.seq;
  shape.heads = c.heads;
  shape.kv_heads = c.kv_heads;
  shape.head_dim = c.head_dim;
  shape.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  return shape;
}

}  // namespace mxtrain::test
