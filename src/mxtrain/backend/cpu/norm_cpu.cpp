// RMSNorm and LayerNorm, forward and backward. Row statistics (mean, mean of squares, the two
// row means of the backward) are accumulated in double, so they carry no error worth naming even
// for rows of 10^4+ columns; the saved mean and rstd are rounded to f32 and the forward output is
// computed from those rounded values, so the backward and a recompute see exactly what the
// forward used. dweight/dbias sum over rows: each fixed 32-row chunk sums in double into its own
// partial, and the partials are added in chunk order, so the result does not depend on the
// thread count.
#include <cmath>
#include <vector>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"

namespace mxtrain {

void CpuBackend::impl_norm_forward(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                   const Tensor& out, const Tensor& mean, const Tensor& rstd, float eps,
                                   const Tensor&) {
  cpu::require_f32("norm_forward", {&x, &weight, &bias, &out, &mean, &rstd});
  const bool layer = kind == NormKind::layer;
  // Also reached from add_norm_forward, so the shapes the pointers below rely on are checked here.
  MXTRAIN_ASSERT(weight.numel() == x.cols() && rstd.numel() == x.rows() && (!layer || mean.numel() == x.rows()),
                 "norm_forward: weight %s, mean %s, rstd %s for x %s", weight.describe().c_str(),
                 mean.describe().c_str(), rstd.describe().c_str(), x.describe().c_str());
  MXTRAIN_ASSERT(!bias.defined() || bias.numel() == x.cols(), "norm_forward: bias %s", bias.describe().c_str());
  const int64_t cols = x.cols();
  const float* input = x.ptr<float>();
  const float* w = weight.ptr<float>();
  const float* b = bias.defined() ? bias.ptr<float>() : nullptr;
  float* output = out.ptr<float>();
  float* means = layer ? mean.ptr<float>() : nullptr;
  float* rstds = rstd.ptr<float>();
  cpu::parallel_rows(threads_, x.rows(), [&](int64_t row) {
    const float* x_row = input + row * cols;
    float* out_row = output + row * cols;
    double center = 0;
    if (layer) {
      double total = 0;
      for (int64_t c = 0; c < cols; ++c) total += x_row[c];
      center = total / static_cast<double>(cols);
    }
    double squares = 0;
    for (int64_t c = 0; c < cols; ++c) {
      double centered = x_row[c] - center;
      squares += centered * centered;
    }
    const float row_mean = static_cast<float>(center);
    const float row_rstd = static_cast<float>(1.0 / std::sqrt(squares / static_cast<double>(cols) + eps));
    if (layer) means[row] = row_mean;
    rstds[row] = row_rstd;
    if (output == nullptr) return;  // statistics only
    for (int64_t c = 0; c < cols; ++c) {
      float value = (x_row[c] - row_mean) * row_rstd * w[c];
      out_row[c] = b ? value + b[c] : value;
    }
  });
}

void CpuBackend::impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                                    const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                                    const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams,
                                    const Tensor&, const DxColumnSums& dx_sums) {
  cpu::require_f32("norm_backward", {&dout, &x, &weight, &mean, &rstd, &dx, &dweight, &dbias});
  // The oracle takes dx's column sums as their own passes, before and after the norm's.
  if (dx_sums.in.defined()) impl_column_sum(dx, dx_sums.in, dx_sums.accumulate_in);
  const bool layer = kind == NormKind::layer;
  MXTRAIN_ASSERT(rstd.numel() == x.rows() && (!layer || mean.numel() == x.rows()), "norm_backward: mean/rstd");
  MXTRAIN_ASSERT(!dbias.defined() || dbias.numel() == x.cols(), "norm_backward: dbias %s", dbias.describe().c_str());
  const int64_t rows = x.rows();
  const int64_t cols = x.cols();
  const float* grad = dout.ptr<float>();
  const float* input = x.ptr<float>();
  const float* w = weight.ptr<float>();
  const float* means = layer ? mean.ptr<float>() : nullptr;
  const float* rstds = rstd.ptr<float>();
  float* dinput = dx.ptr<float>();
  const bool with_bias = dbias.defined();

  // partials[chunk] holds [dweight (cols) | dbias (cols)] of that chunk's rows.
  const int64_t chunks = (rows + cpu::kReductionChunkRows - 1) / cpu::kReductionChunkRows;
  const int64_t stride = 2 * cols;
  std::vector<double> partials(static_cast<size_t>(chunks * stride), 0.0);

  cpu::parallel_blocks(threads_, rows, cpu::kReductionChunkRows, [&](int64_t begin, int64_t end) {
    double* dweight_partial = partials.data() + (begin / cpu::kReductionChunkRows) * stride;
    double* dbias_partial = dweight_partial + cols;
    for (int64_t row = begin; row < end; ++row) {
      const float* g_row = grad + row * cols;
      const float* x_row = input + row * cols;
      float* dx_row = dinput + row * cols;
      const float row_mean = layer ? means[row] : 0.0f;
      const float row_rstd = rstds[row];
      // Row means of g = dout·w and of g·x̂, with x̂ = (x - mean)·rstd as the forward computed it.
      double g_total = 0, gx_total = 0;
      for (int64_t c = 0; c < cols; ++c) {
        const float x_hat = (x_row[c] - row_mean) * row_rstd;
        const double g = static_cast<double>(g_row[c]) * w[c];
        g_total += g;
        gx_total += g * x_hat;
        dweight_partial[c] += static_cast<double>(g_row[c]) * x_hat;
        dbias_partial[c] += g_row[c];
      }
      const float g_mean = layer ? static_cast<float>(g_total / static_cast<double>(cols)) : 0.0f;
      const float gx_mean = static_cast<float>(gx_total / static_cast<double>(cols));
      for (int64_t c = 0; c < cols; ++c) {
        const float x_hat = (x_row[c] - row_mean) * row_rstd;
        const float value = row_rstd * (g_row[c] * w[c] - g_mean - x_hat * gx_mean);
        dx_row[c] = accumulate_dx ? dx_row[c] + value : value;
      }
    }
  });

  float* dw = dweight.ptr<float>();
  float* db = with_bias ? dbias.ptr<float>() : nullptr;
  cpu::parallel_blocks(threads_, cols, 64, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double weight_total = accumulate_dparams ? dw[c] : 0.0;
      double bias_total = db && accumulate_dparams ? db[c] : 0.0;
      for (int64_t chunk = 0; chunk < chunks; ++chunk) {
        weight_total += partials[static_cast<size_t>(chunk * stride + c)];
        bias_total += partials[static_cast<size_t>(chunk * stride + cols + c)];
      }
      dw[c] = static_cast<float>(weight_total);
      if (db) db[c] = static_cast<float>(bias_total);
    }
  });
  if (dx_sums.out.defined()) impl_column_sum(dx, dx_sums.out, dx_sums.accumulate_out);
}

}  // namespace mxtrain
