// Rotary embedding on the cpu backend: forward against a double-precision rotate-half reference
// (position = row % seq, every q and k head, v untouched), backward against finite differences,
// and backward ∘ forward = identity.
#include <cmath>

#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

struct RopeCase {
  const char* name;
  int64_t batch, seq, heads, kv_heads, head_dim;
  float theta;
  // Max abs error against angles taken in double. The op builds its table in f32 as torch does:
  // the f32 angle pos·inv_freq is off by up to pos·2^-24 relative, ~1e-6 at these positions,
  // and outputs are O(1).
  double forward_tolerance;
};

const RopeCase kRopeCases[] = {
    {"gqa_batch2_seq7", 2, 7, 4, 2, 8, 10000.0f, 1e-5},
    {"mqa_seq13", 1, 13, 4, 1, 16, 500000.0f, 1e-5},
    {"mha_batch3_dim4", 3, 5, 2, 2, 4, 10000.0f, 1e-5},
};

class CpuRope : public testing::TestWithParam<RopeCase> {
 protected:
  AttentionShape shape() const {
    const RopeCase& c = GetParam();
    return AttentionShape{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim};
  }
  int64_t rows() const { return GetParam().batch * GetParam().seq; }
  std::vector<float> apply(const std::vector<float>& values, bool inverse) {
    Buffer qkv = upload(backend_, values, Shape{rows(), shape().qkv_cols()});
    if (inverse) {
      backend_.rope_backward(qkv, shape(), GetParam().theta);
    } else {
      backend_.rope_forward(qkv, shape(), GetParam().theta);
    }
    return download(backend_, qkv);
  }

  CpuBackend backend_{2};
};

TEST_P(CpuRope, ForwardMatchesDoubleReference) {
  const RopeCase& c = GetParam();
  const int64_t cols = shape().qkv_cols(), half = c.head_dim / 2;
  const std::vector<float> input = random_vector(static_cast<size_t>(rows() * cols), 51);
  std::vector<double> expected(input.begin(), input.end());
  for (int64_t row = 0; row < rows(); ++row) {
    const double position = static_cast<double>(row % c.seq);
    for (int64_t head = 0; head < c.heads + c.kv_heads; ++head) {
      for (int64_t i = 0; i < half; ++i) {
        const double angle =
            position / std::pow(static_cast<double>(c.theta), static_cast<double>(2 * i) / static_cast<double>(c.head_dim));
        const size_t first = static_cast<size_t>(row * cols + head * c.head_dim + i), second = first + static_cast<size_t>(half);
        const double x1 = input[first], x2 = input[second];
        expected[first] = x1 * std::cos(angle) - x2 * std::sin(angle);
        expected[second] = x2 * std::cos(angle) + x1 * std::sin(angle);
      }
    }
  }
  const std::vector<float> got = apply(input, false);
  EXPECT_LE(max_abs_error(got, expected), c.forward_tolerance);
  // v is untouched, bit for bit.
  const int64_t v_begin = (c.heads + c.kv_heads) * c.head_dim;
  for (int64_t row = 0; row < rows(); ++row)
    for (int64_t col = v_begin; col < cols; ++col)
      ASSERT_EQ(float_bits(got[static_cast<size_t>(row * cols + col)]), float_bits(input[static_cast<size_t>(row * cols + col)]));
}

TEST_P(CpuRope, BackwardMatchesFiniteDifferences) {
  const std::vector<float> input = random_vector(static_cast<size_t>(rows() * shape().qkv_cols()), 52);
  const std::vector<float> r = random_vector(input.size(), 53);
  const std::vector<float> analytic = apply(r, true);
  const std::vector<float> numeric =
      numeric_gradient(input, [&](const std::vector<float>& v) { return weighted_sum(apply(v, false), r); });
  EXPECT_LE(relative_l2_error(analytic, numeric), kGradientTolerance);
}

TEST_P(CpuRope, BackwardUndoesForward) {
  const std::vector<float> input = random_vector(static_cast<size_t>(rows() * shape().qkv_cols()), 54);
  // A rotation and its transpose with the same f32 cos/sin: the round trip of O(1) values is
  // off by a few ulps (cos²+sin² of the f32 table is 1 within 1e-7).
  EXPECT_LE(max_abs_error(apply(apply(input, false), true), std::vector<double>(input.begin(), input.end())), 1e-6);
}

INSTANTIATE_TEST_SUITE_P(, CpuRope, testing::ValuesIn(kRopeCases), CaseName());

}  // namespace
}  // namespace mxtrain::test
