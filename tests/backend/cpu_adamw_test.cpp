// AdamW on the cpu backend against a double-precision scalar re-implementation of
// torch.optim.AdamW (plus clip_grad_norm_ and the grad multiplier) over several steps: weight
// decay only on [0, decay_count), clipping active and inactive, bf16 gradients, and the
// compute copy equal to the rounded new master weights bit for bit.
#include <cmath>

#include "backend/cpu_op_checks.hpp"
#include "mxtrain/numerics/split_master.hpp"

namespace mxtrain::test {
namespace {

struct AdamWCase {
  const char* name;
  int64_t count, decay_count;
  float learning_rate, weight_decay, epsilon;
  float grad_multiplier, max_grad_norm;  // max_grad_norm 0 = no clipping
  DType grad_dtype;
  DType compute_dtype;  // f32 = no compute copy
  int steps;
};

// Gradients are uniform in [-1, 1], so the norm of `count` of them is about sqrt(count/3):
// max_grad_norm 1 clips hard, 1000 never does.
const AdamWCase kAdamWCases[] = {
    {"clip_decay_split_bf16_copy", 1000, 600, 1e-2f, 0.1f, 1e-8f, 0.5f, 1.0f, DType::f32, DType::bf16, 5},
    {"clip_inactive_all_decay_f16_copy", 300, 300, 3e-3f, 0.01f, 1e-8f, 1.0f, 1000.0f, DType::f32, DType::f16, 4},
    {"no_clip_no_decay_large_eps", 257, 0, 1e-2f, 0.1f, 1e-3f, 2.0f, 0.0f, DType::f32, DType::f32, 3},
    {"bf16_grads_clipped", 500, 250, 5e-3f, 0.05f, 1e-8f, 1.0f, 2.0f, DType::bf16, DType::f32, 3},
};

// Tolerances. Each f32 step rounds p, m and v a few times (a few ulps of O(1) weights, 1e-7);
// after `steps` steps the master weights are within 2e-6 of the double run, m and v within 1e-5
// relative L2. A wrong decay split, clip factor, bias correction or eps placement moves p by
// 1e-4 or more and m/v by 1e-2 or more.
constexpr double kParamTolerance = 2e-6;
constexpr double kMomentTolerance = 1e-5;

class CpuAdamW : public testing::TestWithParam<AdamWCase> {};

TEST_P(CpuAdamW, MatchesScalarReferenceOverSteps) {
  const AdamWCase& c = GetParam();
  CpuBackend backend(2);
  const size_t n = static_cast<size_t>(c.count);
  std::vector<float> initial = random_vector(n, 91);
  std::vector<double> p(initial.begin(), initial.end()), m(n, 0.0), v(n, 0.0);

  Buffer param = upload(backend, initial, Shape{c.count});
  Buffer first = zeros(backend, Shape{c.count}), second = zeros(backend, Shape{c.count});
  Buffer copy = c.compute_dtype != DType::f32 ? backend.allocate("copy", Shape{c.count}, c.compute_dtype, Lifetime::parameter)
                                              : Buffer();
  Buffer norm_sq = zeros(backend, Shape{1});
  const double beta1 = 0.9, beta2 = 0.95;

  for (int step = 1; step <= c.steps; ++step) {
    std::vector<float> grad = random_vector(n, 100 + static_cast<uint64_t>(step));
    if (c.grad_dtype == DType::bf16)
      for (float& g : grad) g = round_to_bf16(g);  // what the op will read
    double norm_squared = 0;
    for (float g : grad) norm_squared += static_cast<double>(g * c.grad_multiplier) * (g * c.grad_multiplier);
    const float norm_sq_value = static_cast<float>(norm_squared);
    backend.copy_from_host(&norm_sq_value, norm_sq);
    Buffer tgrad = upload(backend, grad, Shape{c.count}, c.grad_dtype);

    AdamWArgs args;
    args.learning_rate = c.learning_rate;
    args.beta1 = static_cast<float>(beta1);
    args.beta2 = static_cast<float>(beta2);
    args.epsilon = c.epsilon;
    args.weight_decay = c.weight_decay;
    args.step = step;
    args.decay_count = c.decay_count;
    args.grad_multiplier = c.grad_multiplier;
    args.max_grad_norm = c.max_grad_norm;
    backend.adamw(param, tgrad, first, second, copy.defined() ? copy.tensor() : Tensor(), norm_sq, args);

    // The reference, in double, with the coefficients as the args carry them (f32 values).
    const double lr = c.learning_rate, wd = c.weight_decay, eps = c.epsilon, b1 = args.beta1, b2 = args.beta2;
    double clip = 1;
    if (c.max_grad_norm > 0) clip = std::min(1.0, c.max_grad_norm / (std::sqrt(static_cast<double>(norm_sq_value)) + 1e-6));
    const double correction1 = 1 - std::pow(b1, step), correction2 = 1 - std::pow(b2, step);
    for (size_t i = 0; i < n; ++i) {
      const double g = static_cast<double>(grad[i]) * c.grad_multiplier * clip;
      if (static_cast<int64_t>(i) < c.decay_count) p[i] *= 1 - lr * wd;
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      p[i] -= lr / correction1 * m[i] / (std::sqrt(v[i]) / std::sqrt(correction2) + eps);
    }

    const std::vector<float> got = download(backend, param);
    ASSERT_LE(max_abs_error(got, p), kParamTolerance) << "step " << step;
    ASSERT_LE(relative_l2_error(download(backend, first), to_float(m)), kMomentTolerance) << "step " << step;
    ASSERT_LE(relative_l2_error(download(backend, second), to_float(v)), kMomentTolerance) << "step " << step;
    if (copy.defined()) {
      std::vector<uint16_t> bits(n);
      backend.copy_to_host(copy, bits.data());
      for (size_t i = 0; i < n; ++i) {
        const uint16_t expected = c.compute_dtype == DType::bf16 ? float_to_bf16(got[i]) : float_to_f16(got[i]);
        ASSERT_EQ(bits[i], expected) << "element " << i << " of step " << step;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, CpuAdamW, testing::ValuesIn(kAdamWCases), CaseName());

// Without clipping the update can leave the squared gradient norm (AdamWArgs::grad_norm_output):
// the same value as the sum_of_squares op (on the cpu backend the same blocks in the same order,
// so the same bits), the same update as without it, and `add` adds to what is there.
TEST(CpuAdamWNorm, SumsTheSquaredGradientsItReads) {
  CpuBackend backend(2);
  const int64_t n = 3 * 8192 + 123;  // several of the backend's 8192-element blocks and a short one
  const std::vector<float> initial = random_vector(static_cast<size_t>(n), 31);
  const std::vector<float> grad = random_vector(static_cast<size_t>(n), 32);
  Buffer tgrad = upload(backend, grad, Shape{n}, DType::bf16);
  Buffer expected = zeros(backend, Shape{1});
  backend.sum_of_squares(tgrad, expected, false);

  AdamWArgs args;
  args.learning_rate = 1e-2f;
  args.weight_decay = 0.1f;
  args.decay_count = n / 2;
  std::vector<std::vector<float>> params;
  for (AdamWArgs::NormOutput output :
       {AdamWArgs::NormOutput::none, AdamWArgs::NormOutput::overwrite, AdamWArgs::NormOutput::add}) {
    Buffer param = upload(backend, initial, Shape{n});
    Buffer first = zeros(backend, Shape{n}), second = zeros(backend, Shape{n});
    Buffer norm_sq = upload(backend, {3.0f}, Shape{1});
    args.grad_norm_output = output;
    backend.adamw(param, tgrad, first, second, Tensor(), norm_sq, args);
    const float got = download(backend, norm_sq)[0], sum = download(backend, expected)[0];
    if (output == AdamWArgs::NormOutput::none) EXPECT_EQ(got, 3.0f);
    if (output == AdamWArgs::NormOutput::overwrite) EXPECT_EQ(got, sum);
    if (output == AdamWArgs::NormOutput::add) EXPECT_NEAR(got, sum + 3.0f, 1e-6 * sum);
    EXPECT_GT(sum, n / 4.0f);  // uniform in [-1, 1]: about n/3
    params.push_back(download(backend, param));
  }
  EXPECT_EQ(params[0], params[1]);
  EXPECT_EQ(params[0], params[2]);
}

// A split master (AdamWArgs::master_low: the bf16 copy as the high halves) takes the same
// update, bit for bit, as an f32 master: over several steps the joined halves equal the f32
// master, m and v are equal, and the high halves are the split of that master.
TEST(CpuAdamWSplit, UpdatesAsTheF32Master) {
  CpuBackend backend(2);
  const int64_t n = 2 * 8192 + 77;
  const std::vector<float> initial = random_vector(static_cast<size_t>(n), 41);
  std::vector<uint16_t> high(static_cast<size_t>(n)), low(static_cast<size_t>(n));
  for (size_t i = 0; i < high.size(); ++i) {
    const numerics::SplitMaster halves = numerics::split_master(initial[i]);
    high[i] = halves.high;
    low[i] = halves.low;
  }
  Buffer param = upload(backend, initial, Shape{n});
  Buffer copy = backend.allocate("copy", Shape{n}, DType::bf16, Lifetime::parameter);
  Buffer split_copy = backend.allocate("split.copy", Shape{n}, DType::bf16, Lifetime::parameter);
  Buffer split_low = backend.allocate("split.low", Shape{2 * n}, DType::u8, Lifetime::master_parameter);
  backend.copy_from_host(high.data(), split_copy);
  backend.copy_from_host(low.data(), split_low);
  Buffer first = zeros(backend, Shape{n}), second = zeros(backend, Shape{n});
  Buffer split_first = zeros(backend, Shape{n}), split_second = zeros(backend, Shape{n});
  Buffer norm_sq = zeros(backend, Shape{1});
  for (int step = 1; step <= 4; ++step) {
    Buffer grad = upload(backend, random_vector(static_cast<size_t>(n), 50 + static_cast<uint64_t>(step)), Shape{n},
                         DType::bf16);
    AdamWArgs args;
    args.learning_rate = 1e-2f;
    args.weight_decay = 0.1f;
    args.step = step;
    args.decay_count = n / 2;
    backend.adamw(param, grad, first, second, copy, norm_sq, args);
    args.master_low = split_low;
    backend.adamw(Tensor(), grad, split_first, split_second, split_copy, norm_sq, args);

    const std::vector<float> master = download(backend, param);
    backend.copy_to_host(split_copy, high.data());
    backend.copy_to_host(split_low, low.data());
    for (size_t i = 0; i < master.size(); ++i) {
      ASSERT_EQ(numerics::float_to_bits(numerics::join_master(high[i], low[i])), numerics::float_to_bits(master[i]))
          << "element " << i << " of step " << step;
      ASSERT_EQ(high[i], numerics::split_master(master[i]).high) << "element " << i << " of step " << step;
    }
    ASSERT_EQ(download(backend, split_first), download(backend, first)) << "step " << step;
    ASSERT_EQ(download(backend, split_second), download(backend, second)) << "step " << step;
  }
}

}  // namespace
}  // namespace mxtrain::test
