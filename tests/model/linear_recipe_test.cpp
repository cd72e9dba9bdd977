// The linear recipe on the CPU backend against an independent computation from numerics/: each
// GEMM of a quantized linear layer must equal the FP64 product of the operands that numerics'
// reference quantizers produce (per-tensor FP8 with delayed and current scaling, MXFP8, NVFP4 with
// RHT and stochastic rounding); delayed scaling's device state must follow numerics'
// DelayedScaling step for step; the native (quantized GEMM) and emulated (dequantize, then the
// FP32 linear op) paths must agree; first/last-N selection must route layers to the right ops.
//
// Tolerances: the oracle multiplies the same dequantized values in FP64, the backend in FP32 with
// OpenBLAS's summation order, so only FP32 accumulation error remains (about 1e-7 relative per
// addition): 1e-5 relative L2 over K = 64..128 terms, three orders below a single wrong scale or a
// transposed operand.
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/model/linear_recipe.hpp"
#include "mxtrain/numerics/mxfp8.hpp"
#include "mxtrain/numerics/nvfp4.hpp"
#include "mxtrain/numerics/scaling.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

using numerics::Fp8Format;

constexpr double kTolerance = 1e-5;

std::vector<float> transpose(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<float> result(values.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) result[static_cast<size_t>(c * rows + r)] = values[static_cast<size_t>(r * cols + c)];
  return result;
}

// a [n, k] times b [m, k] transposed, in FP64.
std::vector<float> product(const std::vector<float>& a, const std::vector<float>& b, int64_t n, int64_t m, int64_t k) {
  std::vector<float> out(static_cast<size_t>(n * m));
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < m; ++j) {
      double total = 0;
      for (int64_t p = 0; p < k; ++p) total += static_cast<double>(a[static_cast<size_t>(i * k + p)]) * b[static_cast<size_t>(j * k + p)];
      out[static_cast<size_t>(i * m + j)] = static_cast<float>(total);
    }
  }
  return out;
}

std::vector<float> fp8_values(const std::vector<float>& x, float scale, Fp8Format format) {
  std::vector<uint8_t> codes(x.size());
  numerics::quantize_fp8(x, scale, format, codes);
  std::vector<float> values(x.size());
  numerics::dequantize_fp8(codes, 1.0f / scale, format, values);
  return values;
}

struct Linear {
  int64_t n = 64, k = 96, m = 32;  // tokens, in, out
  std::vector<float> x, w, dy;
  Linear() {
    x = test::random_vector(static_cast<size_t>(n * k), 1, -2.0f, 2.0f);
    w = test::random_vector(static_cast<size_t>(m * k), 2, -0.5f, 0.5f);
    dy = test::random_vector(static_cast<size_t>(n * m), 3, -1e-3f, 1e-3f);
  }
};

class LinearRecipeTest : public ::testing::Test {
 protected:
  // Runs forward, backward_weight and backward_input of layer 0's up projection.
  struct Results {
    std::vector<float> out, dw, dx;
  };
  Results run(LinearRecipe& recipe, const Linear& l) {
    Buffer x = test::upload(cpu_, l.x, Shape{l.n, l.k});
    Buffer w = test::upload(cpu_, l.w, Shape{l.m, l.k});
    Buffer dy = test::upload(cpu_, l.dy, Shape{l.n, l.m});
    Buffer out = cpu_.allocate("out", Shape{l.n, l.m}, DType::f32, Lifetime::scratch);
    Buffer dw = test::upload(cpu_, std::vector<float>(static_cast<size_t>(l.m * l.k), 0.0f), Shape{l.m, l.k});
    Buffer dx = cpu_.allocate("dx", Shape{l.n, l.k}, DType::f32, Lifetime::scratch);
    recipe.gemm(0, LinearKind::up, {.role = GemmRole::forward, .a = x, .b = w, .out = out});
    recipe.gemm(0, LinearKind::up, {.role = GemmRole::backward_weight, .a = dy, .b = x, .out = dw, .accumulate = true});
    recipe.gemm(0, LinearKind::up, {.role = GemmRole::backward_input, .a = dy, .b = w, .out = dx});
    return {test::download(cpu_, out), test::download(cpu_, dw), test::download(cpu_, dx)};
  }
  CpuBackend cpu_{2};
};

LinearRecipeOptions options_for(LinearFormat format) {
  LinearRecipeOptions options;
  options.format = format;
  options.amax_history_length = 4;
  return options;
}

TEST_F(LinearRecipeTest, DelayedScalingGemmsMatchNumericsStepByStep) {
  const Linear l;
  LinearRecipe recipe(options_for(LinearFormat::fp8_delayed), cpu_, 2);
  // numerics' DelayedScaling over the same three tensors of linear 2 (layer 0, mlp.up):
  // input, weight (E4M3) and output gradient (E5M2).
  numerics::DelayedScalingConfig config;
  config.amax_history_length = 4;
  numerics::DelayedScaling forward(config, {numerics::TensorDirection::forward, numerics::TensorDirection::forward});
  numerics::DelayedScaling backward(config, {numerics::TensorDirection::backward});
  for (int step = 0; step < 3; ++step) {
    const float sx = forward.scale(0), sw = forward.scale(1), sdy = backward.scale(0);
    const Results got = run(recipe, l);
    const std::vector<float> xq = fp8_values(l.x, sx, Fp8Format::e4m3), wq = fp8_values(l.w, sw, Fp8Format::e4m3);
    const std::vector<float> dyq = fp8_values(l.dy, sdy, Fp8Format::e5m2);
    EXPECT_LE(test::relative_l2_error(got.out, product(xq, wq, l.n, l.m, l.k)), kTolerance) << "step " << step;
    EXPECT_LE(test::relative_l2_error(got.dw, product(transpose(dyq, l.n, l.m), transpose(xq, l.n, l.k), l.m, l.k, l.n)),
              kTolerance)
        << "step " << step;
    EXPECT_LE(test::relative_l2_error(got.dx, product(dyq, transpose(wq, l.m, l.k), l.n, l.k, l.m)), kTolerance)
        << "step " << step;
    forward.record_amax(0, numerics::amax_of(l.x));
    forward.record_amax(1, numerics::amax_of(l.w));
    backward.record_amax(0, numerics::amax_of(l.dy));
    // The recorded amaxes sit in slot 0 of the device history before the update.
    const std::vector<float> history = test::download(cpu_, recipe.forward_history());
    const int64_t tensors = recipe.forward_history().cols();
    EXPECT_EQ(history[static_cast<size_t>(2 * 2)], forward.history(0, 0));
    EXPECT_EQ(history[static_cast<size_t>(2 * 2 + 1)], forward.history(0, 1));
    recipe.finish_step();
    forward.update();
    backward.update();
    const std::vector<float> rolled = test::download(cpu_, recipe.forward_history());
    for (int slot = 0; slot < 4; ++slot) {
      EXPECT_EQ(rolled[static_cast<size_t>(slot * tensors + 4)], forward.history(slot, 0)) << "slot " << slot;
      EXPECT_EQ(rolled[static_cast<size_t>(slot * tensors + 5)], forward.history(slot, 1)) << "slot " << slot;
    }
    EXPECT_EQ(test::download(cpu_, recipe.forward_scale())[4], forward.scale(0));
    EXPECT_EQ(test::download(cpu_, recipe.forward_scale())[5], forward.scale(1));
    EXPECT_EQ(test::download(cpu_, recipe.backward_scale())[2], backward.scale(0));
  }
  // After the first update the scales are no longer the initial 1: the test compared real scaling.
  EXPECT_NE(forward.scale(0), 1.0f);
  EXPECT_NE(backward.scale(0), 1.0f);
  EXPECT_EQ(recipe.steps(), 3);
}

TEST_F(LinearRecipeTest, CurrentScalingUsesEachTensorsOwnAmax) {
  const Linear l;
  LinearRecipe recipe(options_for(LinearFormat::fp8_current), cpu_, 1);
  const Results got = run(recipe, l);
  numerics::CurrentScalingConfig config;
  auto values = [&](const std::vector<float>& x, numerics::TensorDirection direction) {
    const numerics::Fp8Tensor q = numerics::quantize_fp8_current_scaling(x, direction, config);
    std::vector<float> result(x.size());
    numerics::dequantize_fp8(q.data, q.scale_inverse, q.format, result);
    return result;
  };
  const auto xq = values(l.x, numerics::TensorDirection::forward), wq = values(l.w, numerics::TensorDirection::forward);
  const auto dyq = values(l.dy, numerics::TensorDirection::backward);
  EXPECT_LE(test::relative_l2_error(got.out, product(xq, wq, l.n, l.m, l.k)), kTolerance);
  EXPECT_LE(test::relative_l2_error(got.dw, product(transpose(dyq, l.n, l.m), transpose(xq, l.n, l.k), l.m, l.k, l.n)),
            kTolerance);
  EXPECT_LE(test::relative_l2_error(got.dx, product(dyq, transpose(wq, l.m, l.k), l.n, l.k, l.m)), kTolerance);
}

TEST_F(LinearRecipeTest, Mxfp8GemmsUseRowwiseAndColumnwiseBlocks) {
  const Linear l;
  LinearRecipe recipe(options_for(LinearFormat::mxfp8), cpu_, 1);
  const Results got = run(recipe, l);
  numerics::Mxfp8Options rows, columns;
  columns.axis = numerics::BlockAxis::columnwise;
  auto mx = [](const std::vector<float>& x, int64_t r, int64_t c, const numerics::Mxfp8Options& o) {
    return numerics::dequantize_mxfp8(numerics::quantize_mxfp8(x, r, c, o));
  };
  // Columnwise blocks run down the columns: the wgrad operands, and the weight in dgrad.
  EXPECT_LE(test::relative_l2_error(got.out, product(mx(l.x, l.n, l.k, rows), mx(l.w, l.m, l.k, rows), l.n, l.m, l.k)),
            kTolerance);
  const auto dy_cols = transpose(mx(l.dy, l.n, l.m, columns), l.n, l.m);
  const auto x_cols = transpose(mx(l.x, l.n, l.k, columns), l.n, l.k);
  EXPECT_LE(test::relative_l2_error(got.dw, product(dy_cols, x_cols, l.m, l.k, l.n)), kTolerance);
  const auto w_cols = transpose(mx(l.w, l.m, l.k, columns), l.m, l.k);
  EXPECT_LE(test::relative_l2_error(got.dx, product(mx(l.dy, l.n, l.m, rows), w_cols, l.n, l.k, l.m)), kTolerance);
}

TEST_F(LinearRecipeTest, Nvfp4GemmsFollowTheRecipeRoles) {
  const Linear l;
  LinearRecipeOptions options = options_for(LinearFormat::nvfp4);
  options.seed = 77;
  LinearRecipe recipe(options, cpu_, 1);
  const Results got = run(recipe, l);
  using numerics::BlockAxis;
  using numerics::Nvfp4Role;
  auto nv = [](const std::vector<float>& x, int64_t r, int64_t c, const numerics::Nvfp4Options& o, bool transposed) {
    return numerics::dequantize_nvfp4(transposed ? numerics::quantize_nvfp4_transposed(x, r, c, o)
                                                 : numerics::quantize_nvfp4(x, r, c, o));
  };
  // Forward: activations 1x16 without RHT, weights in 16x16 tiles.
  const auto xq = nv(l.x, l.n, l.k, numerics::nvfp4_recipe_options(Nvfp4Role::activation, BlockAxis::rowwise), false);
  const auto wq = nv(l.w, l.m, l.k, numerics::nvfp4_recipe_options(Nvfp4Role::weight, BlockAxis::rowwise), false);
  EXPECT_LE(test::relative_l2_error(got.out, product(xq, wq, l.n, l.m, l.k)), kTolerance);
  // Wgrad: both operands transposed and RHT'd along the tokens (the transforms cancel); the
  // gradient's copies use stochastic rounding with the recipe's streams: its rowwise copy is the
  // first stream (0), its columnwise copy the second (1).
  const auto dyt = nv(l.dy, l.n, l.m, numerics::nvfp4_recipe_options(Nvfp4Role::gradient, BlockAxis::columnwise, 77, 1), true);
  const auto xt = nv(l.x, l.n, l.k, numerics::nvfp4_recipe_options(Nvfp4Role::activation, BlockAxis::columnwise), true);
  EXPECT_LE(test::relative_l2_error(got.dw, product(dyt, xt, l.m, l.k, l.n)), kTolerance);
  // Dgrad: the gradient's rowwise copy (stream 0), the weight's tiles transposed.
  const auto dyq = nv(l.dy, l.n, l.m, numerics::nvfp4_recipe_options(Nvfp4Role::gradient, BlockAxis::rowwise, 77, 0), false);
  const auto wt = nv(l.w, l.m, l.k, numerics::nvfp4_recipe_options(Nvfp4Role::weight, BlockAxis::columnwise), true);
  EXPECT_LE(test::relative_l2_error(got.dx, product(dyq, wt, l.n, l.k, l.m)), kTolerance);
}

TEST_F(LinearRecipeTest, EmulatedPathMatchesTheQuantizedGemms) {
  const Linear l;
  for (LinearFormat format : {LinearFormat::fp8_delayed, LinearFormat::fp8_current, LinearFormat::mxfp8,
                              LinearFormat::nvfp4}) {
    LinearRecipeOptions native = options_for(format), emulated = options_for(format);
    emulated.allow_native = false;
    LinearRecipe a(native, cpu_, 1), b(emulated, cpu_, 1);
    EXPECT_TRUE(a.native());
    EXPECT_FALSE(b.native());
    const Results x = run(a, l), y = run(b, l);
    EXPECT_LE(test::relative_l2_error(y.out, x.out), kTolerance) << linear_format_name(format);
    EXPECT_LE(test::relative_l2_error(y.dw, x.dw), kTolerance) << linear_format_name(format);
    EXPECT_LE(test::relative_l2_error(y.dx, x.dx), kTolerance) << linear_format_name(format);
  }
}

// Counts the quantize ops and the high-precision linear ops per phase.
class OpCounter final : public TraceObserver {
 public:
  void on_op(const OpRecord& op) override { ++counts[op.kind]; }
  std::map<OpKind, int> counts;
};

TEST_F(LinearRecipeTest, FirstAndLastLayersStayInHighPrecision) {
  LinearRecipeOptions options = options_for(LinearFormat::fp8_current);
  options.bf16_first_layers = 1;
  options.bf16_last_layers = 2;
  const int64_t layers = 5;
  std::vector<bool> quantized;
  for (int64_t layer = 0; layer < layers; ++layer) quantized.push_back(options.quantized(layer, layers));
  EXPECT_EQ(quantized, (std::vector<bool>{false, true, true, false, false}));
  LinearRecipe recipe(options, cpu_, layers);
  const Linear l;
  Buffer x = test::upload(cpu_, l.x, Shape{l.n, l.k});
  Buffer w = test::upload(cpu_, l.w, Shape{l.m, l.k});
  Buffer out = cpu_.allocate("out", Shape{l.n, l.m}, DType::f32, Lifetime::scratch);
  for (int64_t layer = 0; layer < layers; ++layer) {
    OpCounter counter;
    cpu_.set_observer(&counter);
    recipe.gemm(layer, LinearKind::qkv, {.role = GemmRole::forward, .a = x, .b = w, .out = out});
    cpu_.set_observer(nullptr);
    EXPECT_EQ(counter.counts[OpKind::quantize], quantized[static_cast<size_t>(layer)] ? 2 : 0) << "layer " << layer;
    // The quantized GEMM is recorded as the linear op it replaces (with FP8 operands).
    EXPECT_EQ(counter.counts[OpKind::linear_forward], 1) << "layer " << layer;
  }
  options.bf16_last_layers = 5;
  EXPECT_THROW(LinearRecipe(options, cpu_, layers), Error);
}

TEST_F(LinearRecipeTest, BlockFormatsRejectShapesTheyCannotQuantize) {
  LinearRecipe mx(options_for(LinearFormat::mxfp8), cpu_, 1);
  EXPECT_NO_THROW(mx.check_shapes(64, 96, 32, LinearKind::up));
  EXPECT_THROW(mx.check_shapes(48, 96, 32, LinearKind::up), Error);  // tokens not a multiple of 32
  LinearRecipe nv(options_for(LinearFormat::nvfp4), cpu_, 1);
  EXPECT_NO_THROW(nv.check_shapes(48, 96, 32, LinearKind::up));
  EXPECT_THROW(nv.check_shapes(48, 100, 32, LinearKind::up), Error);
  LinearRecipe high(options_for(LinearFormat::high_precision), cpu_, 1);
  EXPECT_NO_THROW(high.check_shapes(7, 5, 3, LinearKind::up));
}

// A session captures its step in a CUDA graph only where every step launches the same casts with
// the same arguments: every format but NVFP4 with stochastic rounding, whose gradient casts draw
// a new stream offset on the host each step (the GPU test CudaStep.QuantizedRecipesReplay... runs
// the replay against op by op).
TEST_F(LinearRecipeTest, StepGraphsWhereNoCastChangesBetweenSteps) {
  for (LinearFormat format :
       {LinearFormat::high_precision, LinearFormat::fp8_delayed, LinearFormat::fp8_current, LinearFormat::mxfp8})
    EXPECT_TRUE(LinearRecipe(options_for(format), cpu_, 1).step_graph_capturable()) << linear_format_name(format);
  LinearRecipeOptions nvfp4 = options_for(LinearFormat::nvfp4);
  EXPECT_FALSE(LinearRecipe(nvfp4, cpu_, 1).step_graph_capturable());
  nvfp4.nvfp4_stochastic_rounding = false;
  EXPECT_TRUE(LinearRecipe(nvfp4, cpu_, 1).step_graph_capturable());
}

}  // namespace
}  // namespace mxtrain
