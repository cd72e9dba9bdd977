// Causal grouped-query attention on the cpu backend: forward (out and lse) against a
// double-precision scalar reference; backward (dq, dk, dv in dqkv) against finite differences
// of Σ out·R over every element of the packed qkv.
#include <cmath>

#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

struct AttentionCase {
  const char* name;
  int64_t batch, seq, heads, kv_heads, head_dim;
  float softmax_scale;  // 0 = 1/sqrt(head_dim)
  // Max abs error of out and lse against the double reference: outputs are convex combinations
  // of values in [-1, 1] and lse is O(1..3); f32 scores, exponentials and sums of up to `seq`
  // terms keep both within ~1e-6.
  double forward_tolerance;
};

const AttentionCase kAttentionCases[] = {
    {"gqa_kv2_batch2", 2, 7, 4, 2, 8, 0.0f, 1e-5},
    {"gqa_kv1_seq13", 1, 13, 4, 1, 16, 0.0f, 1e-5},
    {"mha_batch3_custom_scale", 3, 5, 2, 2, 4, 0.3f, 1e-5},
    {"single_token", 2, 1, 2, 1, 4, 0.0f, 1e-5},
    // 21 keys: two 16-key tiles; head_dim 24: one 16-column tile and an 8-column tail.
    {"two_key_tiles_dim_tail", 1, 21, 2, 1, 24, 0.0f, 1e-5},
};

class CpuAttention : public testing::TestWithParam<AttentionCase> {
 protected:
  AttentionShape shape() const {
    const AttentionCase& c = GetParam();
    return AttentionShape{c.batch, c.seq, c.heads, c.kv_heads, c.head_dim, c.softmax_scale};
  }
  int64_t rows() const { return GetParam().batch * GetParam().seq; }
  int64_t out_cols() const { return GetParam().heads * GetParam().head_dim; }

  struct Forward {
    Buffer out, lse;
  };
  Forward forward(const Tensor& qkv) {
    const AttentionCase& c = GetParam();
    Forward f;
    f.out = upload(backend_, random_vector(static_cast<size_t>(rows() * out_cols()), 41), Shape{rows(), out_cols()});
    f.lse = zeros(backend_, Shape{c.batch, c.heads, c.seq});
    backend_.attention_forward(qkv, f.out, f.lse, shape());
    return f;
  }
  std::vector<float> forward_out(const std::vector<float>& qkv_values) {
    Buffer qkv = upload(backend_, qkv_values, Shape{rows(), shape().qkv_cols()});
    return download(backend_, forward(qkv).out);
  }

  CpuBackend backend_{2};
};

TEST_P(CpuAttention, ForwardMatchesDoubleReference) {
  const AttentionCase& c = GetParam();
  const AttentionShape s = shape();
  const int64_t cols = s.qkv_cols(), group = c.heads / c.kv_heads;
  const double scale = c.softmax_scale != 0 ? c.softmax_scale : 1.0 / std::sqrt(static_cast<double>(c.head_dim));
  const std::vector<float> qkv = random_vector(static_cast<size_t>(rows() * cols), 42);
  std::vector<double> out(static_cast<size_t>(rows() * out_cols())), lse(static_cast<size_t>(c.batch * c.heads * c.seq));
  auto at = [&](int64_t b, int64_t t, int64_t column) {
    return static_cast<double>(qkv[static_cast<size_t>((b * c.seq + t) * cols + column)]);
  };
  for (int64_t b = 0; b < c.batch; ++b) {
    for (int64_t h = 0; h < c.heads; ++h) {
      const int64_t q0 = h * c.head_dim, k0 = (c.heads + h / group) * c.head_dim,
                    v0 = (c.heads + c.kv_heads + h / group) * c.head_dim;
      for (int64_t t = 0; t < c.seq; ++t) {
        std::vector<double> scores(static_cast<size_t>(t + 1));
        double maximum = -INFINITY;
        for (int64_t j = 0; j <= t; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < c.head_dim; ++d) dot += at(b, t, q0 + d) * at(b, j, k0 + d);
          scores[static_cast<size_t>(j)] = dot * scale;
          maximum = std::max(maximum, dot * scale);
        }
        double total = 0;
        for (double& score : scores) total += (score = std::exp(score - maximum));
        lse[static_cast<size_t>((b * c.heads + h) * c.seq + t)] = maximum + std::log(total);
        for (int64_t d = 0; d < c.head_dim; ++d) {
          double value = 0;
          for (int64_t j = 0; j <= t; ++j) value += scores[static_cast<size_t>(j)] * at(b, j, v0 + d);
          out[static_cast<size_t>((b * c.seq + t) * out_cols() + q0 + d)] = value / total;
        }
      }
    }
  }
  Buffer tqkv = upload(backend_, qkv, Shape{rows(), cols});
  Forward f = forward(tqkv);
  EXPECT_LE(max_abs_error(download(backend_, f.out), out), c.forward_tolerance);
  EXPECT_LE(max_abs_error(download(backend_, f.lse), lse), c.forward_tolerance);
}

TEST_P(CpuAttention, BackwardMatchesFiniteDifferences) {
  const AttentionShape s = shape();
  const std::vector<float> qkv = random_vector(static_cast<size_t>(rows() * s.qkv_cols()), 43);
  const std::vector<float> r = random_vector(static_cast<size_t>(rows() * out_cols()), 44);
  Buffer tqkv = upload(backend_, qkv, Shape{rows(), s.qkv_cols()});
  Forward f = forward(tqkv);
  Buffer dout = upload(backend_, r, Shape{rows(), out_cols()});
  // Garbage first: the backward overwrites every element of dqkv.
  Buffer dqkv = upload(backend_, random_vector(qkv.size(), 45, 5.0f, 9.0f), Shape{rows(), s.qkv_cols()});
  backend_.attention_backward(dout, tqkv, f.out, f.lse, dqkv, s);
  const std::vector<float> numeric =
      numeric_gradient(qkv, [&](const std::vector<float>& v) { return weighted_sum(forward_out(v), r); });
  // dq, dk and dv separately, so a wrong small part cannot hide under a right large one.
  const std::vector<float> analytic = download(backend_, dqkv);
  const int64_t q_cols = s.heads * s.head_dim, kv_cols = s.kv_heads * s.head_dim;
  const struct {
    const char* part;
    int64_t begin, end;
  } parts[] = {{"dq", 0, q_cols}, {"dk", q_cols, q_cols + kv_cols}, {"dv", q_cols + kv_cols, s.qkv_cols()}};
  for (const auto& part : parts) {
    std::vector<float> got, expected;
    for (int64_t row = 0; row < rows(); ++row) {
      for (int64_t col = part.begin; col < part.end; ++col) {
        got.push_back(analytic[static_cast<size_t>(row * s.qkv_cols() + col)]);
        expected.push_back(numeric[static_cast<size_t>(row * s.qkv_cols() + col)]);
      }
    }
    EXPECT_LE(relative_l2_error(got, expected), kGradientTolerance) << part.part;
  }
}

INSTANTIATE_TEST_SUITE_P(, CpuAttention, testing::ValuesIn(kAttentionCases), CaseName());

}  // namespace
}  // namespace mxtrain::test
