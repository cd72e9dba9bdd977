// The CPU's Backend::gemm: linear layers through OpenBLAS cblas_sgemm (row-major; the weight is
// [out_features, in_features] as in PyTorch, so the forward multiplies by its transpose). No
// epilogue is fused: the residual add and GELU run as their own ops after the GEMM
// (Backend::gemm_epilogue_apart), and quantized operands are multiplied as their dequantized
// values (quantize_cpu.cpp). cpu::sgemm cuts every
// product into fixed tiles of single-threaded sgemm calls, so the bits do not depend on the thread
// count. The bias is broadcast into the output first and the product added with beta = 1. dbias
// sums dout over rows by column ranges: each column is summed in double over all rows in row
// order, the serial order, so it is the same for any thread count and needs no partials even for
// vocabulary-wide outputs.
#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"

#include <algorithm>

namespace mxtrain {
namespace {

// Columns per parallel task of the bias gradient.
constexpr int64_t kBiasColumnBlock = 256;

}  // namespace

void CpuBackend::impl_gemm(const GemmArgs& args) {
  // The CPU fuses no epilogue: the residual add and GELU run as their own ops (in FP32, the
  // values of the fused epilogue).
  if (has_separable_epilogue(args)) {
    gemm_epilogue_apart(args);
    return;
  }
  if (args.a.is_quantized()) {
    gemm_quantized(args.a.quantized, args.b.quantized, args.bias, args.out, args.accumulate);
    return;
  }
  switch (args.role) {
    case GemmRole::forward: gemm_forward(args.a.tensor, args.b.tensor, args.bias, args.out); return;
    case GemmRole::backward_input:
      gemm_backward_input(args.a.tensor, args.b.tensor, args.out, args.accumulate);
      return;
    case GemmRole::backward_weight:
      gemm_backward_weight(args.a.tensor, args.b.tensor, args.out, args.bias_gradient, args.accumulate);
      return;
  }
}

void CpuBackend::gemm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  cpu::require_f32("linear_forward", {&x, &weight, &bias, &out});
  const int64_t rows = x.rows(), in_features = x.cols(), out_features = out.cols();
  float* result = out.ptr<float>();
  if (bias.defined()) {
    const float* b = bias.ptr<float>();
    cpu::parallel_rows(threads_, rows, [&](int64_t row) {
      float* out_row = result + row * out_features;
      for (int64_t c = 0; c < out_features; ++c) out_row[c] = b[c];
    });
  }
  if (in_features == 0) {
    if (!bias.defined()) impl_fill(out, 0.0f);
    return;
  }
  cpu::sgemm(threads_, false, true, rows, out_features, in_features, 1.0f, x.ptr<float>(), in_features,
             weight.ptr<float>(), in_features, bias.defined() ? 1.0f : 0.0f, result, out_features);
}

void CpuBackend::gemm_backward_input(const Tensor& dout, const Tensor& weight, const Tensor& dx, bool accumulate) {
  cpu::require_f32("linear_backward_input", {&dout, &weight, &dx});
  const int64_t rows = dout.rows(), out_features = dout.cols(), in_features = dx.cols();
  if (out_features == 0) {
    if (!accumulate) impl_fill(dx, 0.0f);
    return;
  }
  cpu::sgemm(threads_, false, false, rows, in_features, out_features, 1.0f, dout.ptr<float>(), out_features,
             weight.ptr<float>(), in_features, accumulate ? 1.0f : 0.0f, dx.ptr<float>(), in_features);
}

void CpuBackend::gemm_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight,
                                      const Tensor& dbias, bool accumulate) {
  cpu::require_f32("linear_backward_weight", {&dout, &x, &dweight, &dbias});
  MXTRAIN_ASSERT(!dbias.defined() || dbias.numel() == dout.cols(), "linear_backward_weight: dbias %s",
                 dbias.describe().c_str());
  const int64_t rows = x.rows(), in_features = x.cols(), out_features = dout.cols();
  if (rows > 0) {
    cpu::sgemm(threads_, true, false, out_features, in_features, rows, 1.0f, dout.ptr<float>(), out_features,
               x.ptr<float>(), in_features, accumulate ? 1.0f : 0.0f, dweight.ptr<float>(), in_features);
  } else if (!accumulate) {
    std::fill_n(dweight.ptr<float>(), dweight.numel(), 0.0f);
  }
  if (!dbias.defined()) return;
  const float* grad = dout.ptr<float>();
  float* db = dbias.ptr<float>();
  cpu::parallel_blocks(threads_, out_features, kBiasColumnBlock, [&](int64_t begin, int64_t end) {
    double totals[kBiasColumnBlock];
    for (int64_t c = begin; c < end; ++c) totals[c - begin] = accumulate ? db[c] : 0.0;
    for (int64_t row = 0; row < rows; ++row) {
      const float* grad_row = grad + row * out_features;
      for (int64_t c = begin; c < end; ++c) totals[c - begin] += grad_row[c];
    }
    for (int64_t c = begin; c < end; ++c) db[c] = static_cast<float>(totals[c - begin]);
  });
}

}  // namespace mxtrain
