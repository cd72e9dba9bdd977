// Every memory-bound op and GEMM of the cuda backend against the cpu oracle on the same
// inputs, for f32 and bf16 activations, on a shape that takes the 16-byte vector path and on
// one that takes the scalar path (a row length that is not a multiple of 8).
//
// Tolerances are relative L2 errors, one per op and dtype, each with its reason:
//   f32, elementwise and row ops     1e-5  same f32 formulas; only libm ulps and the order of
//                                          row sums differ
//   bf16, one output rounding        4e-3  inputs are identical (pre-rounded); the output passes
//                                          through bf16 once: <= 2^-9 relative per element,
//                                          ~1.1e-3 rms over random data
//   bf16, sum rounded then normed    6e-3  add_norm rounds the residual sum to bf16 (as the model
//                                          stores it) before normalising; the oracle does not
//   GEMM, f32                        1e-5  cuBLASLt f32 (TF32 off) vs OpenBLAS: order of K sums
//   GEMM, bf16 out                   5e-3  one output rounding plus a different K-sum order
//   f32 gradients from bf16 inputs   1e-4  FP32 accumulation of identical products, other order
#include <cmath>
#include <cstring>

#include "cuda/cuda_test_support.hpp"
#include "mxtrain/backend/private_buffers.hpp"
#include "mxtrain/model/parameters.hpp"
#include "mxtrain/numerics/host_device.hpp"
#include "mxtrain/numerics/split_master.hpp"

namespace mxtrain::test {
namespace {

double tolerance(DType dtype, double f32, double bf16) { return dtype == DType::f32 ? f32 : bf16; }

struct RowShape {
  int64_t rows, cols;
};
const RowShape kRowShapes[] = {{96, 768}, {33, 100}};
// Norms also at GPT-2 1.5B's width (8 vectors per lane in the fused backward: RMSNorm whole,
// LayerNorm split 800 + 800), at 1032 (LayerNorm split 520 + 512, 45 rows: a chunk's pairs take
// unequal counts), at llama-1b's over ten 32-row chunks (the staged backward's two-stage pipeline
// across rows), at 2056 (the forward's 16-vector held rows with a lane of 9 vectors beside lanes
// of 8; the backward split 1280 + 776), at Llama-3B's (16-bit rows split over a pair of warps, 6
// vectors a lane each; FP32 rows: 12 of the 16-vector variant's, its loads running ahead of their
// use past the row's end), at Llama-8B's (split 8 and 8; FP32: 16 per lane and 64 KB of shared
// memory for RMSNorm, LayerNorm with a bias takes the two-kernel path there) and one too wide for
// the fused backward (the two-kernel path).
const RowShape kNormShapes[] = {{96, 768},  {33, 100},  {64, 1600}, {45, 1032}, {300, 2048},
                                {24, 2056}, {40, 3072}, {8, 4096},  {16, 8200}};

class CudaOps : public CudaTest, public ::testing::WithParamInterface<DType> {
 protected:
  DType dtype() const { return GetParam(); }
  std::string label(const std::string& op, const RowShape& s) const {
    return op + " " + dtype_text(dtype()) + " [" + std::to_string(s.rows) + "x" + std::to_string(s.cols) + "]";
  }
  // The same values on both backends: f32 on the CPU, dtype on the GPU.
  std::pair<Buffer, Buffer> both(const std::vector<float>& values, Shape shape, DType gpu_dtype) {
    return {upload(cpu(), values, shape, DType::f32), upload(cuda(), values, shape, gpu_dtype)};
  }
  std::pair<Buffer, Buffer> both(const std::vector<float>& values, Shape shape) {
    return both(values, shape, dtype());
  }
  std::pair<Buffer, Buffer> zeros(Shape shape, DType gpu_dtype) {
    std::vector<float> values(static_cast<size_t>(shape.numel()), 0.0f);
    return both(values, shape, gpu_dtype);
  }
};

TEST_P(CudaOps, AddScaleGelu) {
  for (const RowShape& s : kRowShapes) {
    const size_t n = static_cast<size_t>(s.rows * s.cols);
    auto a = both(random_as(n, 1, dtype(), -3, 3), Shape{s.rows, s.cols});
    auto b = both(random_as(n, 2, dtype(), -3, 3), Shape{s.rows, s.cols});
    auto out = zeros(Shape{s.rows, s.cols}, dtype());
    cpu().add(a.first, b.first, out.first);
    cuda().add(a.second, b.second, out.second);
    EXPECT_LE(report_error(label("add", s), download(cuda(), out.second), download(cpu(), out.first)),
              tolerance(dtype(), 1e-6, 4e-3));

    cpu().scale(a.first, 0.37f);
    cuda().scale(a.second, 0.37f);
    EXPECT_LE(report_error(label("scale", s), download(cuda(), a.second), download(cpu(), a.first)),
              tolerance(dtype(), 1e-6, 4e-3));

    auto x = both(random_as(n, 3, dtype(), -5, 5), Shape{s.rows, s.cols});
    cpu().gelu_forward(x.first, out.first);
    cuda().gelu_forward(x.second, out.second);
    EXPECT_LE(report_error(label("gelu_forward", s), download(cuda(), out.second), download(cpu(), out.first)),
              tolerance(dtype(), 1e-5, 4e-3));
    auto dout = both(random_as(n, 4, dtype()), Shape{s.rows, s.cols});
    auto dx = zeros(Shape{s.rows, s.cols}, dtype());
    cpu().gelu_backward(dout.first, x.first, dx.first);
    cuda().gelu_backward(dout.second, x.second, dx.second);
    EXPECT_LE(report_error(label("gelu_backward", s), download(cuda(), dx.second), download(cpu(), dx.first)),
              tolerance(dtype(), 1e-5, 4e-3));
  }
}

// Column sums (the bias gradients) of whole rows and of a column range of them (GPT-2's query
// bias gradient: a third of the packed q|k|v rows, transformer.cpp): the vector path (range and
// row stride multiples of 8 elements) and the scalar path (a range starting off 16 bytes).
TEST_P(CudaOps, ColumnSumOfRowsAndOfAColumnRange) {
  const int64_t rows = 300, cols = 2304;
  const size_t n = static_cast<size_t>(rows * cols);
  auto x = both(random_as(n, 5, dtype()), Shape{rows, cols});
  struct Range {
    int64_t begin, width;
  };
  for (const Range& range : {Range{0, cols}, Range{0, 768}, Range{1536, 768}, Range{3, 100}}) {
    auto sums = both(random_as(static_cast<size_t>(range.width), 6, dtype()), Shape{range.width});
    for (bool accumulate : {false, true}) {
      cpu().column_sum(x.first.tensor().narrow(1, range.begin, range.width), sums.first, accumulate);
      cuda().column_sum(x.second.tensor().narrow(1, range.begin, range.width), sums.second, accumulate);
      EXPECT_LE(report_error("column_sum " + dtype_text(dtype()) + " columns " + std::to_string(range.begin) + "+" +
                                 std::to_string(range.width) + (accumulate ? " accumulate" : ""),
                             download(cuda(), sums.second), download(cpu(), sums.first)),
                tolerance(dtype(), 1e-5, 4e-3));
    }
  }
}

// GPT-2's QKV bias gradient (Backend::qkv_bias_gradient) against the oracle: the queries' column
// sums (added to or overwriting), the keys' zeros (or left as they were), the values' out bias
// gradient times Wo (overwritten); with the weight in the activations' dtype and, as under
// gradient accumulation or FSDP, f32 gradients beside a bf16 weight. GPT-2 124M's and 1.5B's
// widths, and one that is not a multiple of 32 (a block of columns straddles the parts).
TEST_P(CudaOps, QkvBiasGradient) {
  for (const int64_t hidden : {int64_t{768}, int64_t{1600}, int64_t{40}}) {
    const int64_t rows = hidden == 40 ? 33 : 1024;
    auto dqkv = both(random_as(static_cast<size_t>(rows * 3 * hidden), 7, dtype()), Shape{rows, 3 * hidden});
    for (const DType grad_dtype : {dtype(), DType::f32}) {
      auto out_bias = both(random_as(static_cast<size_t>(hidden), 8, grad_dtype), Shape{hidden}, grad_dtype);
      auto weight = both(random_as(static_cast<size_t>(hidden * hidden), 9, dtype(), -0.1f, 0.1f),
                         Shape{hidden, hidden});
      const std::vector<float> before = random_as(static_cast<size_t>(3 * hidden), 10, grad_dtype);
      for (bool accumulate : {false, true}) {
        auto bias = both(before, Shape{3 * hidden}, grad_dtype);
        cpu().qkv_bias_gradient(dqkv.first, out_bias.first, weight.first, bias.first, accumulate);
        cuda().qkv_bias_gradient(dqkv.second, out_bias.second, weight.second, bias.second, accumulate);
        const std::vector<float> got = download(cuda(), bias.second), want = download(cpu(), bias.first);
        const std::string what = "qkv_bias_gradient " + dtype_text(dtype()) + " grads " + dtype_text(grad_dtype) +
                                 " hidden " + std::to_string(hidden) + (accumulate ? " accumulate" : "");
        auto part = [&](const std::vector<float>& v, int index) {
          return std::vector<float>(v.begin() + index * hidden, v.begin() + (index + 1) * hidden);
        };
        EXPECT_LE(report_error(what + " queries", part(got, 0), part(want, 0)),
                  tolerance(grad_dtype, 1e-5, 4e-3));
        EXPECT_EQ(part(got, 1), part(want, 1)) << what << ": the keys' part";
        EXPECT_LE(report_error(what + " values", part(got, 2), part(want, 2)), tolerance(grad_dtype, 1e-5, 4e-3));
      }
    }
  }
}

TEST_P(CudaOps, SwiGlu) {
  for (const RowShape& s : kRowShapes) {
    const Shape in{s.rows, 2 * s.cols}, out_shape{s.rows, s.cols};
    auto gate_up = both(random_as(static_cast<size_t>(in.numel()), 5, dtype(), -4, 4), in);
    auto out = zeros(out_shape, dtype());
    cpu().swiglu_forward(gate_up.first, out.first);
    cuda().swiglu_forward(gate_up.second, out.second);
    EXPECT_LE(report_error(label("swiglu_forward", s), download(cuda(), out.second), download(cpu(), out.first)),
              tolerance(dtype(), 1e-5, 4e-3));
    auto dout = both(random_as(static_cast<size_t>(out_shape.numel()), 6, dtype()), out_shape);
    auto dgate_up = zeros(in, dtype());
    cpu().swiglu_backward(dout.first, gate_up.first, dgate_up.first);
    cuda().swiglu_backward(dout.second, gate_up.second, dgate_up.second);
    EXPECT_LE(report_error(label("swiglu_backward", s), download(cuda(), dgate_up.second),
                           download(cpu(), dgate_up.first)),
              tolerance(dtype(), 1e-5, 4e-3));
  }
}

TEST_P(CudaOps, NormForwardAndFusedAdd) {
  for (NormKind kind : {NormKind::rms, NormKind::layer}) {
    const bool layer = kind == NormKind::layer;
    for (const RowShape& s : kNormShapes) {
      const std::string name = layer ? "layer_norm" : "rms_norm";
      const Shape shape{s.rows, s.cols};
      const size_t n = static_cast<size_t>(shape.numel());
      auto x = both(random_as(n, 7, dtype(), -2, 3), shape);
      auto weight = both(random_as(static_cast<size_t>(s.cols), 8, dtype(), 0.5f, 1.5f), Shape{s.cols});
      auto bias = both(random_as(static_cast<size_t>(s.cols), 9, dtype(), -0.5f, 0.5f), Shape{s.cols});
      auto out = zeros(shape, dtype());
      auto mean = zeros(Shape{s.rows}, DType::f32);
      auto rstd = zeros(Shape{s.rows}, DType::f32);
      const Tensor no;
      cpu().norm_forward(kind, x.first, weight.first, layer ? bias.first.tensor() : no, out.first,
                         layer ? mean.first.tensor() : no, rstd.first, 1e-5f);
      cuda().norm_forward(kind, x.second, weight.second, layer ? bias.second.tensor() : no, out.second,
                          layer ? mean.second.tensor() : no, rstd.second, 1e-5f);
      EXPECT_LE(report_error(label(name + "_forward", s), download(cuda(), out.second), download(cpu(), out.first)),
                tolerance(dtype(), 1e-5, 4e-3));
      EXPECT_LE(report_error(label(name + "_forward rstd", s), download(cuda(), rstd.second),
                             download(cpu(), rstd.first)),
                1e-5);
      if (layer)
        EXPECT_LE(report_error(label(name + "_forward mean", s), download(cuda(), mean.second),
                               download(cpu(), mean.first)),
                  1e-5);

      // Fused residual add: sum = a + b, out = norm(sum).
      auto b = both(random_as(n, 10, dtype(), -1, 1), shape);
      auto sum = zeros(shape, dtype());
      cpu().add_norm_forward(kind, x.first, b.first, sum.first, weight.first, layer ? bias.first.tensor() : no,
                             out.first, layer ? mean.first.tensor() : no, rstd.first, 1e-5f);
      cuda().add_norm_forward(kind, x.second, b.second, sum.second, weight.second,
                              layer ? bias.second.tensor() : no, out.second, layer ? mean.second.tensor() : no,
                              rstd.second, 1e-5f);
      EXPECT_LE(report_error(label(name + " add_norm sum", s), download(cuda(), sum.second),
                             download(cpu(), sum.first)),
                tolerance(dtype(), 1e-7, 4e-3));
      EXPECT_LE(report_error(label(name + " add_norm out", s), download(cuda(), out.second),
                             download(cpu(), out.first)),
                tolerance(dtype(), 1e-5, 6e-3));
    }
  }
}

TEST_P(CudaOps, NormBackward) {
  // overwrite, accumulate, and accumulate with dx's column sums in and out (DxColumnSums: the
  // bias gradients of the linears around a GPT-2 block's MLP norm), which the fused kernel takes
  // for 16-bit rows up to 2048 columns whose sums fit its shared memory, and column-sum kernels
  // otherwise.
  enum Mode { overwrite, accumulate, with_dx_sums };
  for (NormKind kind : {NormKind::rms, NormKind::layer}) {
    const bool layer = kind == NormKind::layer;
    for (const RowShape& s : kNormShapes) {
      for (Mode mode : {overwrite, accumulate, with_dx_sums}) {
        const bool accumulate = mode != overwrite;
        // dx and the parameter gradients both add (accumulate) or both overwrite.
        const std::string name = std::string(layer ? "layer_norm" : "rms_norm") + "_backward" +
                                 (mode == overwrite ? " overwrite" : mode == accumulate ? " accumulate" : " dx sums");
        const Shape shape{s.rows, s.cols};
        const size_t n = static_cast<size_t>(shape.numel());
        auto x = both(random_as(n, 11, dtype(), -2, 3), shape);
        auto weight = both(random_as(static_cast<size_t>(s.cols), 12, dtype(), 0.5f, 1.5f), Shape{s.cols});
        auto bias = both(random_as(static_cast<size_t>(s.cols), 13, dtype(), -0.5f, 0.5f), Shape{s.cols});
        auto out = zeros(shape, dtype());
        auto mean = zeros(Shape{s.rows}, DType::f32);
        auto rstd = zeros(Shape{s.rows}, DType::f32);
        const Tensor no;
        // Statistics from the CPU forward, uploaded to both, so backward sees identical inputs.
        cpu().norm_forward(kind, x.first, weight.first, layer ? bias.first.tensor() : no, out.first,
                           layer ? mean.first.tensor() : no, rstd.first, 1e-5f);
        auto mean_both = both(download(cpu(), mean.first), Shape{s.rows}, DType::f32);
        auto rstd_both = both(download(cpu(), rstd.first), Shape{s.rows}, DType::f32);
        auto dout = both(random_as(n, 14, dtype()), shape);
        auto dx = both(random_as(n, 15, dtype()), shape);
        // Gradients start non-zero: the op must add to them, or ignore them when it overwrites.
        auto dweight = both(random_vector(static_cast<size_t>(s.cols), 16), Shape{s.cols}, DType::f32);
        auto dbias = both(random_vector(static_cast<size_t>(s.cols), 17), Shape{s.cols}, DType::f32);
        // The sums in the activations' dtype, as a block's bias gradients are in BF16 training;
        // the incoming one adds, the outgoing one overwrites.
        auto sum_in = both(random_as(static_cast<size_t>(s.cols), 18, dtype()), Shape{s.cols});
        auto sum_out = both(random_as(static_cast<size_t>(s.cols), 19, dtype()), Shape{s.cols});
        DxColumnSums cpu_sums, cuda_sums;
        if (mode == with_dx_sums) {
          cpu_sums = {.in = sum_in.first, .out = sum_out.first, .accumulate_in = true, .accumulate_out = false};
          cuda_sums = {.in = sum_in.second, .out = sum_out.second, .accumulate_in = true, .accumulate_out = false};
          // (A LayerNorm's rows of 1025-2048 columns run split, and split rows keep the sums apart.)
          const bool split = private_buffers::norm_split_columns(s.cols, true, true, layer) > 0;
          const bool fits = s.cols % 8 == 0 && s.cols <= 2048 && !split &&
                            private_buffers::norm_fused_shared_bytes(s.cols, layer, true, true) <=
                                private_buffers::kNormFusedSharedLimit;
          EXPECT_EQ(private_buffers::norm_backward(kind, dout.second, x.second, weight.second, dx.second,
                                                   dweight.second, layer ? dbias.second.tensor() : no, cuda_sums)
                        .dx_sums,
                    fits && dtype() != DType::f32)
              << label(name, s);
        }
        cpu().norm_backward(kind, dout.first, x.first, weight.first, layer ? mean_both.first.tensor() : no,
                            rstd_both.first, dx.first, dweight.first, layer ? dbias.first.tensor() : no, accumulate,
                            accumulate, {}, cpu_sums);
        cuda().norm_backward(kind, dout.second, x.second, weight.second, layer ? mean_both.second.tensor() : no,
                             rstd_both.second, dx.second, dweight.second, layer ? dbias.second.tensor() : no,
                             accumulate, accumulate, {}, cuda_sums);
        EXPECT_LE(report_error(label(name + " dx", s), download(cuda(), dx.second), download(cpu(), dx.first)),
                  tolerance(dtype(), 1e-5, 4e-3));
        EXPECT_LE(report_error(label(name + " dweight", s), download(cuda(), dweight.second),
                               download(cpu(), dweight.first)),
                  1e-4);
        if (layer)
          EXPECT_LE(report_error(label(name + " dbias", s), download(cuda(), dbias.second),
                                 download(cpu(), dbias.first)),
                    1e-4);
        if (mode == with_dx_sums) {
          // The GPU sums the stored (rounded) dx; the oracle the f32 one: the activations' rounding apart.
          EXPECT_LE(report_error(label(name + " dx column sums in", s), download(cuda(), sum_in.second),
                                 download(cpu(), sum_in.first)),
                    tolerance(dtype(), 1e-5, 4e-3));
          EXPECT_LE(report_error(label(name + " dx column sums out", s), download(cuda(), sum_out.second),
                                 download(cpu(), sum_out.first)),
                    tolerance(dtype(), 1e-5, 4e-3));
        }
      }
    }
  }
}

struct GemmShape {
  int64_t rows, in, out;
};
const GemmShape kGemmShapes[] = {{128, 256, 384}, {40, 72, 24}};

TEST_P(CudaOps, Linear) {
  for (bool fused_bias : {false, true}) {
    cuda_backend().set_fused_bias_gradient(fused_bias);
    for (const GemmShape& g : kGemmShapes) {
      for (bool with_bias : {false, true}) {
        const std::string tag = dtype_text(dtype()) + " N" + std::to_string(g.rows) + " K" + std::to_string(g.in) +
                                " M" + std::to_string(g.out) +
                                (with_bias ? (fused_bias ? " bias (BGRADB)" : " bias (column sums)") : "");
        const Tensor no;
        auto x = both(random_as(static_cast<size_t>(g.rows * g.in), 20, dtype()), Shape{g.rows, g.in});
        auto weight =
            both(random_as(static_cast<size_t>(g.out * g.in), 21, dtype(), -0.1f, 0.1f), Shape{g.out, g.in});
        auto bias = both(random_as(static_cast<size_t>(g.out), 22, dtype()), Shape{g.out});
        auto y = zeros(Shape{g.rows, g.out}, dtype());
        cpu().gemm({.role = GemmRole::forward, .a = x.first, .b = weight.first, .out = y.first,
                    .bias = with_bias ? bias.first.tensor() : no});
        cuda().gemm({.role = GemmRole::forward, .a = x.second, .b = weight.second, .out = y.second,
                     .bias = with_bias ? bias.second.tensor() : no});
        EXPECT_LE(report_error("linear_forward " + tag, download(cuda(), y.second), download(cpu(), y.first)),
                  tolerance(dtype(), 1e-5, 5e-3));

        auto dy = both(random_as(static_cast<size_t>(g.rows * g.out), 23, dtype()), Shape{g.rows, g.out});
        for (bool accumulate : {false, true}) {
          auto dx = both(random_as(static_cast<size_t>(g.rows * g.in), 24, dtype()), Shape{g.rows, g.in});
          cpu().gemm({.role = GemmRole::backward_input, .a = dy.first, .b = weight.first, .out = dx.first,
                      .accumulate = accumulate});
          cuda().gemm({.role = GemmRole::backward_input, .a = dy.second, .b = weight.second, .out = dx.second,
                       .accumulate = accumulate});
          EXPECT_LE(report_error("linear_backward_input " + tag + (accumulate ? " accumulate" : ""),
                                 download(cuda(), dx.second), download(cpu(), dx.first)),
                    tolerance(dtype(), 1e-5, 5e-3));
        }
        // Gradients accumulate into non-zero f32 (the model's grads) and bf16 buffers, or
        // overwrite them (a gradient's first write: what was there must not leak in).
        for (DType grad_dtype : {DType::f32, DType::bf16}) {
          for (bool accumulate : {true, false}) {
            auto dweight = both(random_as(static_cast<size_t>(g.out * g.in), 25, grad_dtype), Shape{g.out, g.in},
                                grad_dtype);
            auto dbias = both(random_as(static_cast<size_t>(g.out), 26, grad_dtype), Shape{g.out}, grad_dtype);
            cpu().gemm({.role = GemmRole::backward_weight, .a = dy.first, .b = x.first, .out = dweight.first,
                        .accumulate = accumulate, .bias_gradient = with_bias ? dbias.first.tensor() : no});
            cuda().gemm({.role = GemmRole::backward_weight, .a = dy.second, .b = x.second, .out = dweight.second,
                         .accumulate = accumulate, .bias_gradient = with_bias ? dbias.second.tensor() : no});
            const double grad_tolerance = grad_dtype == DType::f32 ? tolerance(dtype(), 1e-5, 1e-4) : 5e-3;
            const std::string what = tag + (accumulate ? " accumulate " : " overwrite ") + dtype_text(grad_dtype);
            EXPECT_LE(report_error("linear_backward_weight " + what + " dweight", download(cuda(), dweight.second),
                                   download(cpu(), dweight.first)),
                      grad_tolerance);
            if (with_bias)
              EXPECT_LE(report_error("linear_backward_weight " + what + " dbias", download(cuda(), dbias.second),
                                     download(cpu(), dbias.first)),
                        grad_tolerance);
          }
        }
      }
    }
  }
}

// The residual add on the GEMM (beta = 1 with C = residual on the GPU, GEMM + add on the CPU);
// tolerance as the plain GEMM's: the add works on the FP32 accumulator and rounds once.
TEST_P(CudaOps, LinearWithResidual) {
  for (const GemmShape& g : kGemmShapes) {
    for (bool with_bias : {false, true}) {
      const std::string tag = dtype_text(dtype()) + " N" + std::to_string(g.rows) + " K" + std::to_string(g.in) +
                              " M" + std::to_string(g.out) + (with_bias ? " bias" : "");
      const Tensor no;
      auto x = both(random_as(static_cast<size_t>(g.rows * g.in), 40, dtype()), Shape{g.rows, g.in});
      auto weight = both(random_as(static_cast<size_t>(g.out * g.in), 41, dtype(), -0.1f, 0.1f), Shape{g.out, g.in});
      auto bias = both(random_as(static_cast<size_t>(g.out), 42, dtype()), Shape{g.out});
      auto residual = both(random_as(static_cast<size_t>(g.rows * g.out), 43, dtype()), Shape{g.rows, g.out});
      auto y = zeros(Shape{g.rows, g.out}, dtype());
      cpu().gemm({.role = GemmRole::forward, .a = x.first, .b = weight.first, .out = y.first,
                  .bias = with_bias ? bias.first.tensor() : no, .residual = residual.first});
      cuda().gemm({.role = GemmRole::forward, .a = x.second, .b = weight.second, .out = y.second,
                   .bias = with_bias ? bias.second.tensor() : no, .residual = residual.second});
      EXPECT_LE(report_error("linear_forward_residual " + tag, download(cuda(), y.second), download(cpu(), y.first)),
                tolerance(dtype(), 1e-5, 5e-3));
    }
  }
}

// GELU on the GEMM against the CPU's GEMM, then GELU: cuBLASLt's GELU_AUX[_BIAS] and DGELU
// epilogues for 16-bit operands whose rows are multiples of 8 elements, the GEMM and the GELU
// kernel apart otherwise (f32, and the 20-column shape). The epilogues round once.
TEST_P(CudaOps, LinearWithGelu) {
  std::vector<GemmShape> shapes(std::begin(kGemmShapes), std::end(kGemmShapes));
  shapes.push_back({48, 64, 20});
  for (const GemmShape& g : shapes) {
    for (bool with_bias : {false, true}) {
      const std::string tag = dtype_text(dtype()) + " N" + std::to_string(g.rows) + " K" + std::to_string(g.in) +
                              " M" + std::to_string(g.out) + (with_bias ? " bias" : "");
      const Tensor no;
      auto x = both(random_as(static_cast<size_t>(g.rows * g.in), 50, dtype()), Shape{g.rows, g.in});
      auto weight = both(random_as(static_cast<size_t>(g.out * g.in), 51, dtype(), -0.1f, 0.1f), Shape{g.out, g.in});
      auto bias = both(random_as(static_cast<size_t>(g.out), 52, dtype()), Shape{g.out});
      auto pre = zeros(Shape{g.rows, g.out}, dtype());
      auto act = zeros(Shape{g.rows, g.out}, dtype());
      cpu().gemm({.role = GemmRole::forward, .a = x.first, .b = weight.first, .out = act.first,
                  .epilogue = GemmEpilogue::gelu_aux_bias, .bias = with_bias ? bias.first.tensor() : no,
                  .aux = pre.first});
      cuda().gemm({.role = GemmRole::forward, .a = x.second, .b = weight.second, .out = act.second,
                   .epilogue = GemmEpilogue::gelu_aux_bias, .bias = with_bias ? bias.second.tensor() : no,
                   .aux = pre.second});
      EXPECT_LE(report_error("linear_forward_gelu pre " + tag, download(cuda(), pre.second), download(cpu(), pre.first)),
                tolerance(dtype(), 1e-5, 5e-3));
      EXPECT_LE(report_error("linear_forward_gelu out " + tag, download(cuda(), act.second), download(cpu(), act.first)),
                tolerance(dtype(), 1e-5, 5e-3));

      // dx[N,K] = (dout[N,M] · weight[M,K]) ⊙ gelu'(pre[N,K]); dx starts as garbage (overwritten).
      auto dout = both(random_as(static_cast<size_t>(g.rows * g.out), 53, dtype()), Shape{g.rows, g.out});
      auto input_pre = both(random_as(static_cast<size_t>(g.rows * g.in), 54, dtype(), -3.0f, 3.0f), Shape{g.rows, g.in});
      auto dx = both(random_as(static_cast<size_t>(g.rows * g.in), 55, dtype()), Shape{g.rows, g.in});
      cpu().gemm({.role = GemmRole::backward_input, .a = dout.first, .b = weight.first, .out = dx.first,
                  .epilogue = GemmEpilogue::dgelu, .aux = input_pre.first});
      cuda().gemm({.role = GemmRole::backward_input, .a = dout.second, .b = weight.second, .out = dx.second,
                   .epilogue = GemmEpilogue::dgelu, .aux = input_pre.second});
      EXPECT_LE(report_error("linear_backward_input_gelu " + tag, download(cuda(), dx.second), download(cpu(), dx.first)),
                tolerance(dtype(), 1e-5, 5e-3));
    }
  }
}

// The RoPE tests' grouped-query shape: 2 x 48 tokens, 4 query and 2 KV heads.
AttentionShape rope_test_shape(int64_t head_dim) {
  AttentionShape shape;
  shape.batch = 2;
  shape.seq = 48;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = head_dim;
  return shape;
}

TEST_P(CudaOps, RopeForwardAndBackward) {
  for (int64_t head_dim : {64, 128, 20}) {
    const AttentionShape shape = rope_test_shape(head_dim);
    const Shape qkv_shape{shape.batch * shape.seq, shape.qkv_cols()};
    const std::string tag = dtype_text(dtype()) + " head_dim " + std::to_string(head_dim);
    auto qkv = both(random_as(static_cast<size_t>(qkv_shape.numel()), 30, dtype()), qkv_shape);
    cpu().rope_forward(qkv.first, shape, 10000.0f);
    cuda().rope_forward(qkv.second, shape, 10000.0f);
    EXPECT_LE(report_error("rope_forward " + tag, download(cuda(), qkv.second), download(cpu(), qkv.first)),
              tolerance(dtype(), 1e-6, 4e-3));
    auto dqkv = both(random_as(static_cast<size_t>(qkv_shape.numel()), 31, dtype()), qkv_shape);
    cpu().rope_backward(dqkv.first, shape, 500000.0f);
    cuda().rope_backward(dqkv.second, shape, 500000.0f);
    EXPECT_LE(report_error("rope_backward " + tag, download(cuda(), dqkv.second), download(cpu(), dqkv.first)),
              tolerance(dtype(), 1e-6, 4e-3));
  }
}

TEST_P(CudaOps, Embedding) {
  for (bool positions : {false, true}) {
    for (int64_t cols : {256, 36}) {
      const int64_t vocab = 97, seq = 16, batch = 3, rows = batch * seq;
      const std::string tag = dtype_text(dtype()) + " C" + std::to_string(cols) + (positions ? " +positions" : "");
      std::vector<int32_t> ids(static_cast<size_t>(rows));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * i * 7 + 3) % 13);  // repeats
      Buffer cpu_tokens = upload_i32(cpu(), ids, Shape{rows});
      Buffer gpu_tokens = upload_i32(cuda(), ids, Shape{rows});
      const Tensor no;
      auto table = both(random_as(static_cast<size_t>(vocab * cols), 40, dtype()), Shape{vocab, cols});
      auto position = both(random_as(static_cast<size_t>(seq * cols), 41, dtype()), Shape{seq, cols});
      auto out = zeros(Shape{rows, cols}, dtype());
      cpu().embedding_forward(cpu_tokens, table.first, positions ? position.first.tensor() : no, out.first, seq);
      cuda().embedding_forward(gpu_tokens, table.second, positions ? position.second.tensor() : no, out.second, seq);
      EXPECT_LE(report_error("embedding_forward " + tag, download(cuda(), out.second), download(cpu(), out.first)),
                positions ? tolerance(dtype(), 1e-7, 4e-3) : 0.0);

      auto dout = both(random_as(static_cast<size_t>(rows * cols), 42, dtype()), Shape{rows, cols});
      auto dtable = both(random_vector(static_cast<size_t>(vocab * cols), 43), Shape{vocab, cols}, DType::f32);
      auto dposition = both(random_vector(static_cast<size_t>(seq * cols), 44), Shape{seq, cols}, DType::f32);
      cpu().embedding_backward(cpu_tokens, dout.first, dtable.first, positions ? dposition.first.tensor() : no, seq);
      cuda().embedding_backward(gpu_tokens, dout.second, dtable.second, positions ? dposition.second.tensor() : no,
                                seq);
      EXPECT_LE(report_error("embedding_backward dtable " + tag, download(cuda(), dtable.second),
                             download(cpu(), dtable.first)),
                1e-6);
      if (positions)
        EXPECT_LE(report_error("embedding_backward dposition " + tag, download(cuda(), dposition.second),
                               download(cpu(), dposition.first)),
                  1e-6);
    }
  }
}

TEST_P(CudaOps, CrossEntropyInPlace) {
  // valid_vocab < cols: padding columns must be ignored and zeroed. 300 rows of 2048 and 400 of
  // GPT-2's 50304 (bf16): the streamed kernel (a block per SM, two to four rows each, through
  // both row buffers; one and seven vectors a thread), with a vector straddling valid_vocab.
  struct Case {
    int64_t rows, cols, valid;
  };
  for (auto [rows, cols, valid] : {Case{37, 1024, 1000}, Case{37, 264, 257}, Case{37, 50, 50}, Case{300, 2048, 1997},
                                   Case{400, 50304, 50257}}) {
    const std::string tag = dtype_text(dtype()) + " " + std::to_string(rows) + " rows, V" + std::to_string(valid) +
                            "/" + std::to_string(cols);
    std::vector<int32_t> ids(static_cast<size_t>(rows));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 131 + 7) % valid);
    Buffer cpu_targets = upload_i32(cpu(), ids, Shape{rows});
    Buffer gpu_targets = upload_i32(cuda(), ids, Shape{rows});
    std::vector<float> values = random_as(static_cast<size_t>(rows * cols), 50, dtype(), -8, 8);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = valid; c < cols; ++c) values[static_cast<size_t>(r * cols + c)] = 8192.0f;  // must be ignored
    for (float grad_scale : {0.0f, 1.0f / 37.0f}) {
      auto logits = both(values, Shape{rows, cols});
      auto losses = zeros(Shape{rows}, DType::f32);
      cpu().cross_entropy(logits.first, cpu_targets, losses.first, valid, grad_scale);
      cuda().cross_entropy(logits.second, gpu_targets, losses.second, valid, grad_scale);
      EXPECT_LE(report_error("cross_entropy loss " + tag, download(cuda(), losses.second),
                             download(cpu(), losses.first)),
                1e-5);
      const std::vector<float> got = download(cuda(), logits.second);
      EXPECT_LE(report_error("cross_entropy logits/grad " + tag + (grad_scale != 0 ? " grad" : " untouched"), got,
                             download(cpu(), logits.first)),
                grad_scale != 0 ? tolerance(dtype(), 1e-5, 4e-3) : 0.0);
      if (grad_scale != 0)
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t c = valid; c < cols; ++c) ASSERT_EQ(got[static_cast<size_t>(r * cols + c)], 0.0f);
    }
  }
  // A NaN logit makes its row's loss NaN, and only its row's: one in row 3 (the other values of
  // its thread finite), and in row 4 every value of one thread's share (thread 5 of 1024, eight
  // columns every 8192, in every kernel here), where the thread has no finite value to take a
  // max from. The trainer's NaN check stops on such a loss.
  const int64_t rows = 300, cols = 50304, valid = 50257;
  std::vector<float> values = random_as(static_cast<size_t>(rows * cols), 51, dtype(), -8, 8);
  values[static_cast<size_t>(3 * cols + 777)] = NAN;
  for (int64_t c = 8 * 5; c < valid; c += 8 * 1024)
    for (int64_t i = c; i < std::min(c + 8, valid); ++i) values[static_cast<size_t>(4 * cols + i)] = NAN;
  std::vector<int32_t> ids(static_cast<size_t>(rows), 1);
  Buffer targets = upload_i32(cuda(), ids, Shape{rows});
  Buffer logits = upload(cuda(), values, Shape{rows, cols}, dtype());
  auto losses = zeros(Shape{rows}, DType::f32);
  cuda().cross_entropy(logits, targets, losses.second, valid, 1.0f / rows);
  const std::vector<float> loss = download(cuda(), losses.second);
  for (int64_t r = 0; r < rows; ++r)
    EXPECT_EQ(std::isnan(loss[static_cast<size_t>(r)]), r == 3 || r == 4) << "row " << r << " loss " << loss[r];
}

// The amax a norm or activation kernel records for the current-scaling FP8 cast (out_amax) has the
// bits of the amax op over the output it wrote: over dx after the accumulation for the norm's
// backward, over the rounded outputs in bf16; NaN when an output is NaN.
TEST_P(CudaOps, OutputAmaxesAreTheAmaxOfTheOutput) {
  Buffer recorded = cuda().allocate("recorded", Shape{1}, DType::f32, Lifetime::scratch);
  Buffer reference = cuda().allocate("reference", Shape{1}, DType::f32, Lifetime::scratch);
  bool nan_expected = false;
  auto expect_same = [&](const std::string& what, const Tensor& out) {
    cuda().amax(out, reference, false);
    const float got = cuda().read_scalar(recorded), want = cuda().read_scalar(reference);
    uint32_t got_bits, want_bits;
    std::memcpy(&got_bits, &got, 4);
    std::memcpy(&want_bits, &want, 4);
    EXPECT_TRUE(got_bits == want_bits || (std::isnan(got) && std::isnan(want)))
        << what << ": recorded " << got << ", amax op " << want;
    EXPECT_EQ(std::isnan(want), nan_expected) << what << ": amax op " << want;
    EXPECT_TRUE(std::isnan(want) || want > 0.0f) << what;
  };
  const Tensor no;
  for (bool with_nan : {false, true}) {
    const std::string nan_tag = with_nan ? " (a NaN input)" : "";
    nan_expected = with_nan;
    for (const RowShape& s : kNormShapes) {
      const Shape shape{s.rows, s.cols};
      const size_t n = static_cast<size_t>(shape.numel());
      std::vector<float> x_values = random_as(n, 40, dtype(), -2, 3);
      if (with_nan) x_values[n / 2] = std::nanf("");
      Buffer x = upload(cuda(), x_values, shape, dtype());
      Buffer other = upload(cuda(), random_as(n, 41, dtype(), -1, 1), shape, dtype());
      Buffer weight = upload(cuda(), random_as(static_cast<size_t>(s.cols), 42, dtype(), 0.5f, 1.5f), Shape{s.cols},
                             dtype());
      Buffer bias = upload(cuda(), random_as(static_cast<size_t>(s.cols), 43, dtype(), -0.5f, 0.5f), Shape{s.cols},
                           dtype());
      Buffer out = cuda().allocate("out", shape, dtype(), Lifetime::scratch);
      Buffer sum = cuda().allocate("sum", shape, dtype(), Lifetime::scratch);
      Buffer mean = cuda().allocate("mean", Shape{s.rows}, DType::f32, Lifetime::scratch);
      Buffer rstd = cuda().allocate("rstd", Shape{s.rows}, DType::f32, Lifetime::scratch);
      for (NormKind kind : {NormKind::rms, NormKind::layer}) {
        const bool layer = kind == NormKind::layer;
        const std::string name = label(layer ? "layer_norm" : "rms_norm", s) + nan_tag;
        cuda().norm_forward(kind, x, weight, layer ? bias.tensor() : no, out, layer ? mean.tensor() : no, rstd, 1e-5f,
                            recorded);
        expect_same(name + " forward", out);
        cuda().add_norm_forward(kind, x, other, sum, weight, layer ? bias.tensor() : no, out,
                                layer ? mean.tensor() : no, rstd, 1e-5f, recorded);
        expect_same(name + " add_norm", out);
        for (bool accumulate : {false, true}) {
          Buffer dx = upload(cuda(), random_as(n, 44, dtype()), shape, dtype());
          Buffer dweight = cuda().allocate("dweight", Shape{s.cols}, DType::f32, Lifetime::scratch);
          Buffer dbias = cuda().allocate("dbias", Shape{s.cols}, DType::f32, Lifetime::scratch);
          cuda().norm_backward(kind, other, x, weight, layer ? mean.tensor() : no, rstd, dx, dweight,
                               layer ? dbias.tensor() : no, accumulate, false, recorded);
          expect_same(name + " backward" + (accumulate ? " accumulate" : ""), dx);
        }
      }
    }
    for (const RowShape& s : kRowShapes) {
      const Shape in{s.rows, 2 * s.cols}, shape{s.rows, s.cols};
      std::vector<float> gate_up_values = random_as(static_cast<size_t>(in.numel()), 45, dtype(), -4, 4);
      if (with_nan) gate_up_values[7] = std::nanf("");
      Buffer gate_up = upload(cuda(), gate_up_values, in, dtype());
      Buffer dout = upload(cuda(), random_as(static_cast<size_t>(shape.numel()), 46, dtype()), shape, dtype());
      Buffer out = cuda().allocate("out", shape, dtype(), Lifetime::scratch);
      Buffer dgate_up = cuda().allocate("dgate_up", in, dtype(), Lifetime::scratch);
      cuda().swiglu_forward(gate_up, out, recorded);
      expect_same(label("swiglu_forward", s) + nan_tag, out);
      cuda().swiglu_backward(dout, gate_up, dgate_up, recorded);
      expect_same(label("swiglu_backward", s) + nan_tag, dgate_up);
      const Tensor x = gate_up.tensor().slice_flat(0, shape);
      cuda().gelu_forward(x, out, recorded);
      expect_same(label("gelu_forward", s) + nan_tag, out);
      cuda().gelu_backward(dout, x, out, recorded);
      expect_same(label("gelu_backward", s) + nan_tag, out);
    }
    // RoPE's backward records all of dqkv, v heads included (they keep the largest value, or the
    // NaN), and rotates exactly as without a record.
    for (int64_t head_dim : {64, 128, 20}) {
      const AttentionShape shape = rope_test_shape(head_dim);
      const Shape qkv_shape{shape.batch * shape.seq, shape.qkv_cols()};
      std::vector<float> values = random_as(static_cast<size_t>(qkv_shape.numel()), 47, dtype(), -3, 3);
      values[static_cast<size_t>(5 * shape.qkv_cols() + (shape.heads + shape.kv_heads) * head_dim + 3)] =
          with_nan ? std::nanf("") : 7.0f;
      Buffer plain = upload(cuda(), values, qkv_shape, dtype()), dqkv = upload(cuda(), values, qkv_shape, dtype());
      cuda().rope_backward(plain, shape, 500000.0f);
      cuda().rope_backward(dqkv, shape, 500000.0f, recorded);
      const std::string name = "rope_backward head_dim " + std::to_string(head_dim) + nan_tag;
      expect_same(name, dqkv);
      if (!with_nan) EXPECT_EQ(cuda().read_scalar(recorded), 7.0f) << name;
      const std::vector<float> want = download(cuda(), plain), got = download(cuda(), dqkv);
      EXPECT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float))) << name << ": values";
    }
  }
}

TEST_P(CudaOps, SumAndSumOfSquares) {
  for (int64_t n : {int64_t{1} << 20, int64_t{12345}}) {
    auto x = both(random_as(static_cast<size_t>(n), 60, dtype()), Shape{n});
    auto out = both(std::vector<float>{2.5f}, Shape{1}, DType::f32);
    cpu().sum(x.first, out.first, true);
    cuda().sum(x.second, out.second, true);
    EXPECT_LE(report_error("sum accumulate " + dtype_text(dtype()) + " n" + std::to_string(n),
                           download(cuda(), out.second), download(cpu(), out.first)),
              1e-5);
    cpu().sum_of_squares(x.first, out.first, false);
    cuda().sum_of_squares(x.second, out.second, false);
    EXPECT_LE(report_error("sum_of_squares " + dtype_text(dtype()) + " n" + std::to_string(n),
                           download(cuda(), out.second), download(cpu(), out.first)),
              1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaOps, ::testing::Values(DType::f32, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& info) { return dtype_text(info.param); });

// ---- ops whose dtypes are not the activation dtype ---------------------------------------------

class CudaDataOps : public CudaTest {};

TEST_F(CudaDataOps, ConversionsRoundToNearestEven) {
  // Ties, the largest finite values, overflow to infinity, subnormals, NaN and signed zero.
  std::vector<float> values = {0.0f, -0.0f, 1.0f, 1.00390625f /* bf16 tie, even down */,
                               1.01171875f /* tie, even up */, 3.3895314e38f, 65519.0f, 65520.0f,
                               1e-40f, -2.5e-39f, 6.1e-5f, 5.96e-8f, INFINITY, -INFINITY, NAN, 0.1f};
  std::vector<float> more = random_vector(4000, 70, -1000, 1000);
  values.insert(values.end(), more.begin(), more.end());
  const int64_t n = static_cast<int64_t>(values.size());
  Buffer source = upload(cuda(), values, Shape{n});
  for (DType dtype : {DType::bf16, DType::f16}) {
    Buffer converted = cuda().allocate("converted", Shape{n}, dtype, Lifetime::scratch);
    cuda().copy(source, converted);
    std::vector<uint16_t> bits(static_cast<size_t>(n));
    cuda().copy_to_host(converted, bits.data());
    size_t mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      uint16_t want = dtype == DType::bf16 ? float_to_bf16(values[i]) : float_to_f16(values[i]);
      bool both_nan = std::isnan(values[i]) && ((bits[i] & 0x7fff) > (dtype == DType::bf16 ? 0x7f80 : 0x7c00));
      if (bits[i] != want && !both_nan) ++mismatches;
    }
    EXPECT_EQ(mismatches, 0u) << "f32 -> " << dtype_text(dtype);
    // Widening back is exact.
    Buffer back = cuda().allocate("back", Shape{n}, DType::f32, Lifetime::scratch);
    cuda().copy(converted, back);
    std::vector<float> widened(static_cast<size_t>(n));
    cuda().copy_to_host(back, widened.data());
    for (size_t i = 0; i < values.size(); ++i) {
      float want = dtype == DType::bf16 ? bf16_to_float(bits[i]) : f16_to_float(bits[i]);
      if (!std::isnan(want)) ASSERT_EQ(widened[i], want) << i;
    }
  }
}

TEST_F(CudaDataOps, FillCopyAndReadScalar) {
  Buffer a = cuda().allocate("a", Shape{1001}, DType::bf16, Lifetime::scratch);
  cuda().fill(a, 0.3f);
  std::vector<float> got = download(cuda(), a);
  for (float v : got) ASSERT_EQ(v, round_to_bf16(0.3f));
  Buffer i = cuda().allocate("i", Shape{17}, DType::i32, Lifetime::scratch);
  cuda().fill(i, 7.0f);
  std::vector<int32_t> ints(17);
  cuda().copy_to_host(i, ints.data());
  for (int32_t v : ints) ASSERT_EQ(v, 7);
  Buffer f = upload(cuda(), {4.25f, 1.0f}, Shape{2});
  EXPECT_EQ(cuda().read_scalar(f), 4.25f);
}

// AdamW's weight-amax segments (current scaling): each segment's record is the amax op's value
// over the new compute copy (the master without one) there. Boundaries off the 8-element
// vectors, a gap no segment covers (holding the largest value), more segments than one launch
// takes (the rest get passes), both kernel widths.
TEST_F(CudaDataOps, AdamWRecordsEachSegmentsAmax) {
  for (int64_t n : {int64_t{8 * 4099}, int64_t{10007}}) {
    for (bool copy : {true, false}) {
      const std::string tag = "n " + std::to_string(n) + (copy ? " bf16 copy" : " master only");
      std::vector<float> param = random_vector(static_cast<size_t>(n), 90);
      std::vector<AmaxSegment> segments;
      std::vector<Buffer> records;
      for (int i = 0; i < 11; ++i) {
        const int64_t begin = i * n / 11 + (i % 3), end = (i + 1) * n / 11 - (i == 10 ? 0 : (i % 2) * 5);
        if (i == 4) {
          param[static_cast<size_t>(begin + 1)] = 100.0f;  // the gap's value belongs to no record
          continue;
        }
        param[static_cast<size_t>(i % 2 == 0 ? begin : end - 1)] = 10.0f + static_cast<float>(i);
        records.push_back(upload(cuda(), {0.0f}, Shape{1}));
        segments.push_back({begin, end, records.back()});
      }
      AdamWArgs args;
      args.learning_rate = 1e-3f;
      args.weight_decay = 0.1f;
      args.step = 2;
      args.decay_count = n / 2;
      args.weight_amaxes = segments;
      Buffer gp = upload(cuda(), param, Shape{n}), gg = upload(cuda(), random_vector(static_cast<size_t>(n), 91), Shape{n}),
             gm = upload(cuda(), std::vector<float>(static_cast<size_t>(n), 0.0f), Shape{n}),
             gv = upload(cuda(), std::vector<float>(static_cast<size_t>(n), 0.0f), Shape{n});
      Buffer gcopy = copy ? cuda().allocate("copy", Shape{n}, DType::bf16, Lifetime::scratch) : Buffer();
      cuda().adamw(gp, gg, gm, gv, copy ? gcopy.tensor() : Tensor(), Tensor(), args);
      const Tensor written = copy ? gcopy.tensor() : gp.tensor();
      Buffer reference = cuda().allocate("reference", Shape{1}, DType::f32, Lifetime::scratch);
      for (size_t i = 0; i < segments.size(); ++i) {
        const AmaxSegment& segment = segments[i];
        cuda().amax(written.slice_flat(segment.begin, Shape{segment.end - segment.begin}), reference, false);
        const float want = cuda().read_scalar(reference), got = cuda().read_scalar(records[i]);
        EXPECT_EQ(numerics::float_to_bits(got), numerics::float_to_bits(want))
            << tag << " segment " << i << " [" << segment.begin << ", " << segment.end << "): " << got << " vs " << want;
        EXPECT_GE(want, 9.0f) << tag << " segment " << i;  // the planted value, decayed a little
        EXPECT_LT(want, 50.0f) << tag << " segment " << i;
      }
    }
  }
}

// AdamW's weight casts (delayed scaling): each segment's FP8 copy, decode scale and amax record
// are the quantize op's over the new compute copy (the master without one) there, byte for byte.
// Boundaries off the 8-element vectors, more casts than one launch takes (the rest get cast
// passes), both kernel widths, an f32 master, a bf16 copy and a split master.
TEST_F(CudaDataOps, AdamWCastsEachWeightLikeTheQuantizeOp) {
  enum class Master { f32, bf16_copy, split };
  for (int64_t n : {int64_t{8 * 4099}, int64_t{10007}}) {
    for (Master master : {Master::f32, Master::bf16_copy, Master::split}) {
      const std::string tag = "n " + std::to_string(n) +
                              (master == Master::f32 ? " f32 master" : master == Master::bf16_copy ? " bf16 copy" : " split");
      std::vector<float> param = random_vector(static_cast<size_t>(n), 93);
      std::vector<WeightCastSegment> casts;
      std::vector<Buffer> buffers;
      for (int i = 0; i < 10; ++i) {
        const int64_t begin = i * n / 10 + (i % 3 == 1 ? 3 : 0), end = (i + 1) * n / 10 - (i % 4 == 2 ? 5 : 0);
        param[static_cast<size_t>(begin + i)] = 3.0f + static_cast<float>(i);
        casts.push_back(weight_cast_segment(cuda(), begin, end, Shape{1, end - begin}, std::ldexp(0.7f, 2 * i - 6), buffers));
      }
      AdamWArgs args;
      args.learning_rate = 1e-3f;
      args.weight_decay = 0.1f;
      args.step = 2;
      args.decay_count = n / 2;
      args.weight_casts = casts;
      Buffer gg = upload(cuda(), random_vector(static_cast<size_t>(n), 94), Shape{n}),
             gm = upload(cuda(), std::vector<float>(static_cast<size_t>(n), 0.0f), Shape{n}),
             gv = upload(cuda(), std::vector<float>(static_cast<size_t>(n), 0.0f), Shape{n});
      Buffer gp, gcopy, glow;
      if (master == Master::split) {
        gcopy = cuda().allocate("copy", Shape{n}, DType::bf16, Lifetime::scratch);
        glow = cuda().allocate("low", Shape{2 * n}, DType::u8, Lifetime::scratch);
        ParamShard shard;
        shard.count = n;
        shard.compute_copy = gcopy;
        shard.master_low = glow;
        upload_master(cuda(), shard, param.data());
        args.master_low = glow;
      } else {
        gp = upload(cuda(), param, Shape{n});
        if (master == Master::bf16_copy) gcopy = cuda().allocate("copy", Shape{n}, DType::bf16, Lifetime::scratch);
      }
      cuda().adamw(gp.defined() ? gp.tensor() : Tensor(), gg, gm, gv, gcopy.defined() ? gcopy.tensor() : Tensor(),
                   Tensor(), args);
      const Tensor written = gcopy.defined() ? gcopy.tensor() : gp.tensor();
      for (size_t i = 0; i < casts.size(); ++i) {
        const WeightCastSegment& cast = casts[i];
        const int64_t count = cast.end - cast.begin;
        QuantizedTensor want = cast.out;
        Buffer data = cuda().allocate("want", Shape{1, count}, DType::e4m3, Lifetime::scratch);
        Buffer inverse = cuda().allocate("want.scale_inverse", Shape{1}, DType::f32, Lifetime::scratch);
        Buffer amax = upload(cuda(), {0.0f}, Shape{1});
        want.data = data;
        want.scale_inverse = inverse;
        cuda().quantize(written.slice_flat(cast.begin, Shape{1, count}), cast.scale, want, QuantizedTensor{}, amax,
                        ScaleFromAmax{});
        std::vector<uint8_t> got_bytes(static_cast<size_t>(count)), want_bytes(got_bytes.size());
        cuda().copy_to_host(cast.out.data, got_bytes.data());
        cuda().copy_to_host(data, want_bytes.data());
        size_t differ = 0;
        for (size_t j = 0; j < got_bytes.size(); ++j) differ += got_bytes[j] != want_bytes[j];
        EXPECT_EQ(differ, 0u) << tag << " cast " << i << " [" << cast.begin << ", " << cast.end << ")";
        EXPECT_EQ(numerics::float_to_bits(cuda().read_scalar(cast.out.scale_inverse)),
                  numerics::float_to_bits(cuda().read_scalar(inverse)))
            << tag << " cast " << i;
        EXPECT_EQ(numerics::float_to_bits(cuda().read_scalar(cast.amax)), numerics::float_to_bits(cuda().read_scalar(amax)))
            << tag << " cast " << i;
        EXPECT_GT(cuda().read_scalar(amax), 2.5f) << tag << " cast " << i;  // the planted value
      }
    }
  }
}

// Without clipping the update can sum the squared gradients it reads (grad_norm_output): the
// CPU's norm within f32 summation error, the update bit-identical to the one without it. The
// larger size leaves more block partials (1,172) than the final sum's 1,024 threads, so each
// adds several; the odd size takes the scalar kernel; `add` adds to what is there.
TEST_F(CudaDataOps, AdamWSumsTheSquaredGradients) {
  for (int64_t n : {int64_t{8 * 300001}, int64_t{10007}}) {
    for (DType grad_dtype : {DType::f32, DType::bf16}) {
      const std::string tag = "n " + std::to_string(n) + " grad " + dtype_text(grad_dtype);
      const std::vector<float> param = random_vector(static_cast<size_t>(n), 70);
      const std::vector<float> grad = rounded(random_vector(static_cast<size_t>(n), 71), grad_dtype);
      AdamWArgs args;
      args.learning_rate = 3e-3f;
      args.weight_decay = 0.1f;
      args.step = 2;
      args.decay_count = n / 3;
      args.grad_multiplier = 0.5f;
      Buffer cg = upload(cpu(), grad, Shape{n}), cn = upload(cpu(), {0.0f}, Shape{1});
      cpu().sum_of_squares(cg, cn, false);
      const double want = 0.25 * cpu().read_scalar(cn);
      Buffer gg = upload(cuda(), grad, Shape{n}, grad_dtype);
      std::vector<std::vector<float>> masters;
      for (AdamWArgs::NormOutput output :
           {AdamWArgs::NormOutput::none, AdamWArgs::NormOutput::overwrite, AdamWArgs::NormOutput::add}) {
        Buffer gp = upload(cuda(), param, Shape{n});
        Buffer gm = upload(cuda(), std::vector<float>(static_cast<size_t>(n), 0.0f), Shape{n});
        Buffer gv = upload(cuda(), std::vector<float>(static_cast<size_t>(n), 0.0f), Shape{n});
        Buffer gn = upload(cuda(), {5.0f}, Shape{1});
        Buffer gcopy = cuda().allocate("copy", Shape{n}, DType::bf16, Lifetime::scratch);
        args.grad_norm_output = output;
        cuda().adamw(gp, gg, gm, gv, gcopy, gn, args);
        const double got = cuda().read_scalar(gn);
        if (output == AdamWArgs::NormOutput::none) EXPECT_EQ(got, 5.0) << tag;
        if (output == AdamWArgs::NormOutput::overwrite) EXPECT_NEAR(got, want, 1e-5 * want) << tag;
        if (output == AdamWArgs::NormOutput::add) EXPECT_NEAR(got, want + 5.0, 1e-5 * want) << tag;
        masters.push_back(download(cuda(), gp));
      }
      EXPECT_EQ(masters[0], masters[1]) << tag;
      EXPECT_EQ(masters[0], masters[2]) << tag;
    }
  }
}

TEST_F(CudaDataOps, AdamWMatchesOracle) {
  const int64_t n = 10007;  // odd: the scalar path; the vector path runs in the model step
  for (DType grad_dtype : {DType::f32, DType::bf16}) {
    for (float max_norm : {0.0f, 0.5f}) {
      AdamWArgs args;
      args.learning_rate = 3e-3f;
      args.weight_decay = 0.1f;
      args.step = 3;
      args.decay_count = 6000;
      args.grad_multiplier = 0.5f;
      args.max_grad_norm = max_norm;
      std::vector<float> param = random_vector(static_cast<size_t>(n), 80);
      std::vector<float> grad = rounded(random_vector(static_cast<size_t>(n), 81), grad_dtype);
      std::vector<float> m = random_vector(static_cast<size_t>(n), 82, -0.01f, 0.01f);
      std::vector<float> v = random_vector(static_cast<size_t>(n), 83, 0.0f, 1e-4f);
      Buffer cp = upload(cpu(), param, Shape{n}), cg = upload(cpu(), grad, Shape{n}), cm = upload(cpu(), m, Shape{n}),
             cv = upload(cpu(), v, Shape{n}), cn = upload(cpu(), {7.0f}, Shape{1});
      Buffer gp = upload(cuda(), param, Shape{n}), gg = upload(cuda(), grad, Shape{n}, grad_dtype),
             gm = upload(cuda(), m, Shape{n}), gv = upload(cuda(), v, Shape{n}), gn = upload(cuda(), {7.0f}, Shape{1});
      Buffer ccopy = cpu().allocate("copy", Shape{n}, DType::bf16, Lifetime::scratch);
      Buffer gcopy = cuda().allocate("copy", Shape{n}, DType::bf16, Lifetime::scratch);
      cpu().adamw(cp, cg, cm, cv, ccopy, cn, args);
      cuda().adamw(gp, gg, gm, gv, gcopy, gn, args);
      const std::string tag = "adamw grad " + dtype_text(grad_dtype) + (max_norm > 0 ? " clipped" : "");
      // Same f32 operations in the same order (no FMA contraction on the GPU): a few ulps at most.
      EXPECT_LE(report_error(tag + " master", download(cuda(), gp), download(cpu(), cp)), 1e-6);
      EXPECT_LE(report_error(tag + " m", download(cuda(), gm), download(cpu(), cm)), 1e-6);
      EXPECT_LE(report_error(tag + " v", download(cuda(), gv), download(cpu(), cv)), 1e-6);
      std::vector<uint16_t> cpu_bits(static_cast<size_t>(n)), gpu_bits(static_cast<size_t>(n));
      cpu().copy_to_host(ccopy, cpu_bits.data());
      cuda().copy_to_host(gcopy, gpu_bits.data());
      size_t differ = 0;
      for (size_t k = 0; k < cpu_bits.size(); ++k) differ += cpu_bits[k] != gpu_bits[k];
      // A master value within an ulp of a bf16 rounding boundary may round the other way.
      EXPECT_LE(differ, static_cast<size_t>(n / 1000)) << tag << " compute copy";
    }
  }
}

// A split master (AdamWArgs::master_low) on the GPU against the CPU oracle's split update: the
// vector path (n a multiple of 8) and the scalar one.
TEST_F(CudaDataOps, AdamWSplitMasterMatchesOracle) {
  for (int64_t n : {int64_t{10000}, int64_t{10007}}) {
    AdamWArgs args;
    args.learning_rate = 3e-3f;
    args.weight_decay = 0.1f;
    args.step = 3;
    args.decay_count = 6000;
    args.grad_norm_output = AdamWArgs::NormOutput::overwrite;
    const std::vector<float> param = random_vector(static_cast<size_t>(n), 90);
    const std::vector<float> grad = rounded(random_vector(static_cast<size_t>(n), 91), DType::bf16);
    const std::vector<float> m = random_vector(static_cast<size_t>(n), 92, -0.01f, 0.01f);
    const std::vector<float> v = random_vector(static_cast<size_t>(n), 93, 0.0f, 1e-4f);
    std::vector<uint16_t> high(static_cast<size_t>(n)), low(static_cast<size_t>(n));
    for (size_t i = 0; i < high.size(); ++i) {
      const numerics::SplitMaster halves = numerics::split_master(param[i]);
      high[i] = halves.high;
      low[i] = halves.low;
    }
    auto run = [&](Backend& backend, std::vector<float>& master, std::vector<uint16_t>& high_out) {
      Buffer g = upload(backend, grad, Shape{n}, DType::bf16), first = upload(backend, m, Shape{n}),
             second = upload(backend, v, Shape{n}), norm = upload(backend, {0.0f}, Shape{1});
      Buffer copy = backend.allocate("copy", Shape{n}, DType::bf16, Lifetime::parameter);
      Buffer lows = backend.allocate("low", Shape{2 * n}, DType::u8, Lifetime::master_parameter);
      backend.copy_from_host(high.data(), copy);
      backend.copy_from_host(low.data(), lows);
      AdamWArgs split = args;
      split.master_low = lows;
      backend.adamw(Tensor(), g, first, second, copy, norm, split);
      std::vector<uint16_t> lows_out(static_cast<size_t>(n));
      high_out.resize(static_cast<size_t>(n));
      backend.copy_to_host(copy, high_out.data());
      backend.copy_to_host(lows, lows_out.data());
      master.resize(static_cast<size_t>(n));
      for (size_t i = 0; i < master.size(); ++i) master[i] = numerics::join_master(high_out[i], lows_out[i]);
      return std::make_pair(download(backend, first), download(backend, norm)[0]);
    };
    std::vector<float> cpu_master, gpu_master;
    std::vector<uint16_t> cpu_high, gpu_high;
    const auto [cpu_m, cpu_norm] = run(cpu(), cpu_master, cpu_high);
    const auto [gpu_m, gpu_norm] = run(cuda(), gpu_master, gpu_high);
    const std::string tag = "adamw split n=" + std::to_string(n);
    EXPECT_LE(report_error(tag + " master", gpu_master, cpu_master), 1e-6);
    EXPECT_LE(report_error(tag + " m", gpu_m, cpu_m), 1e-6);
    EXPECT_NEAR(gpu_norm, cpu_norm, 1e-5 * cpu_norm) << tag;
    size_t wrong_high = 0;
    for (size_t i = 0; i < gpu_master.size(); ++i) wrong_high += gpu_high[i] != numerics::split_master(gpu_master[i]).high;
    EXPECT_EQ(wrong_high, 0u) << tag << ": the high halves are the split of the joined master";
  }
}

}  // namespace
}  // namespace mxtrain::test
