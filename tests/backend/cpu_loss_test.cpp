// Softmax cross-entropy on the cpu backend: per-row losses against a double-precision
// reference, the in-place gradient against finite differences of grad_scale·Σ losses, a padded
// vocabulary whose padding columns are never read (NaN or 1e4 there would change the result) and
// are zeroed in the gradient, and the logits left untouched when grad_scale is 0.
#include <cmath>
#include <limits>

#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

struct CrossEntropyCase {
  const char* name;
  int64_t rows, padded_vocab, valid_vocab;
  float grad_scale;
  float logit_range;  // logits uniform in [-range, range]
  // Written into the padding columns. NaN poisons any arithmetic that reads it; a huge finite
  // value catches a max taken over the padding (NaN never wins a comparison), since every
  // exp(logit - 1e4) underflows to 0 and the loss becomes infinite.
  float padding_value;
  // Max abs error of the losses: log-sum-exp in double of f32 exponentials, O(1..10) losses.
  double forward_tolerance;
};

const CrossEntropyCase kCrossEntropyCases[] = {
    {"no_padding", 4, 13, 13, 1.0f, 2.0f, 0.0f, 1e-5},
    {"padded_vocab_nan", 5, 16, 11, 0.25f, 3.0f, std::numeric_limits<float>::quiet_NaN(), 1e-5},
    {"padded_vocab_huge", 6, 16, 9, 0.5f, 3.0f, 1e4f, 1e-5},
    {"large_logits_padded", 3, 40, 37, 1.0f / 3.0f, 30.0f, std::numeric_limits<float>::quiet_NaN(), 5e-5},
};

class CpuCrossEntropy : public testing::TestWithParam<CrossEntropyCase> {
 protected:
  void SetUp() override {
    const CrossEntropyCase& c = GetParam();
    logits_ = random_vector(static_cast<size_t>(c.rows * c.padded_vocab), 71, -c.logit_range, c.logit_range);
    for (int64_t row = 0; row < c.rows; ++row)
      for (int64_t col = c.valid_vocab; col < c.padded_vocab; ++col)
        logits_[static_cast<size_t>(row * c.padded_vocab + col)] = c.padding_value;
    for (int64_t row = 0; row < c.rows; ++row) targets_.push_back(static_cast<int32_t>((row * 7 + 3) % c.valid_vocab));
  }

  // Runs the op; returns the losses and leaves the (possibly overwritten) logits in *logits.
  std::vector<float> run(std::vector<float>* logits, float grad_scale) {
    const CrossEntropyCase& c = GetParam();
    Buffer tlogits = upload(backend_, *logits, Shape{c.rows, c.padded_vocab});
    Buffer targets = upload_i32(backend_, targets_, Shape{c.rows});
    Buffer losses = zeros(backend_, Shape{c.rows});
    backend_.cross_entropy(tlogits, targets, losses, c.valid_vocab, grad_scale);
    *logits = download(backend_, tlogits);
    return download(backend_, losses);
  }

  CpuBackend backend_{2};
  std::vector<float> logits_;
  std::vector<int32_t> targets_;
};

TEST_P(CpuCrossEntropy, LossesMatchDoubleReference) {
  const CrossEntropyCase& c = GetParam();
  std::vector<double> expected(static_cast<size_t>(c.rows));
  for (int64_t row = 0; row < c.rows; ++row) {
    const float* logits = logits_.data() + row * c.padded_vocab;
    double maximum = -INFINITY, total = 0;
    for (int64_t col = 0; col < c.valid_vocab; ++col) maximum = std::max(maximum, static_cast<double>(logits[col]));
    for (int64_t col = 0; col < c.valid_vocab; ++col) total += std::exp(logits[col] - maximum);
    expected[static_cast<size_t>(row)] = maximum + std::log(total) - logits[targets_[static_cast<size_t>(row)]];
  }
  std::vector<float> logits = logits_;
  EXPECT_LE(max_abs_error(run(&logits, 0.0f), expected), c.forward_tolerance);
  // grad_scale 0: the logits are left as they were, bit for bit (NaN padding included).
  EXPECT_EQ(std::memcmp(logits.data(), logits_.data(), logits.size() * sizeof(float)), 0);
}

TEST_P(CpuCrossEntropy, GradientMatchesFiniteDifferences) {
  const CrossEntropyCase& c = GetParam();
  std::vector<float> gradient = logits_;
  const std::vector<float> losses = run(&gradient, c.grad_scale);
  std::vector<float> valid_logits, analytic;
  for (int64_t row = 0; row < c.rows; ++row) {
    for (int64_t col = 0; col < c.padded_vocab; ++col) {
      const size_t index = static_cast<size_t>(row * c.padded_vocab + col);
      if (col < c.valid_vocab) {
        valid_logits.push_back(logits_[index]);
        analytic.push_back(gradient[index]);
      } else {
        ASSERT_EQ(float_bits(gradient[index]), 0u) << "padding column " << col << " of row " << row;
      }
    }
  }
  // The losses do not depend on grad_scale.
  std::vector<float> untouched = logits_;
  EXPECT_TRUE(same_bits(losses, run(&untouched, 0.0f)));

  auto objective = [&](const std::vector<float>& valid) {
    std::vector<float> full = logits_;
    size_t next = 0;
    for (int64_t row = 0; row < c.rows; ++row)
      for (int64_t col = 0; col < c.valid_vocab; ++col) full[static_cast<size_t>(row * c.padded_vocab + col)] = valid[next++];
    double total = 0;
    for (float loss : run(&full, 0.0f)) total += loss;
    return c.grad_scale * total;
  };
  EXPECT_LE(relative_l2_error(analytic, numeric_gradient(valid_logits, objective)), kGradientTolerance);
}

INSTANTIATE_TEST_SUITE_P(, CpuCrossEntropy, testing::ValuesIn(kCrossEntropyCases), CaseName());

TEST(CpuCrossEntropyTargets, TargetOutsideValidVocabularyIsAnInternalError) {
  CpuBackend backend(2);
  Buffer logits = zeros(backend, Shape{2, 8});
  Buffer losses = zeros(backend, Shape{2});
  Buffer targets = upload_i32(backend, {1, 6}, Shape{2});  // 6 is padding when valid_vocab = 5
  try {
    backend.cross_entropy(logits, targets, losses, 5, 1.0f);
    FAIL() << "no error for a target in the padding";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::internal);
    EXPECT_NE(std::string(error.what()).find("target 6"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace mxtrain::test
