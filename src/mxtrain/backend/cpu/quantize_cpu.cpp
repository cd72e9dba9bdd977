// The precision recipes' ops on the CPU, computed by numerics/ itself: the reference quantizers
// are the oracle, so these impls only move data between tensors and numerics' vectors. A
// columnwise copy is the rowwise quantization of xᵀ (the same blocks as numerics' columnwise
// MXFP8 blocks, stored transposed: the TN layout). The quantized GEMM multiplies the dequantized
// operands in FP32, so it is exactly the product the formats define, up to FP32 accumulation.
#include <cstring>
#include <vector>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"
#include "mxtrain/numerics/mxfp8.hpp"
#include "mxtrain/numerics/nvfp4.hpp"
#include "mxtrain/numerics/scale_layout.hpp"
#include "mxtrain/numerics/scale_rules.hpp"
#include "mxtrain/numerics/scaling.hpp"

namespace mxtrain {
namespace {

std::vector<float> as_floats(const Tensor& x, const char* op) {
  if (!cpu::is_float_storage(x.dtype)) cpu::throw_unsupported(op, x.dtype);
  std::vector<float> values(static_cast<size_t>(x.numel()));
  for (int64_t i = 0; i < x.numel(); ++i) values[static_cast<size_t>(i)] = cpu::load_as_float(x.data, x.dtype, i);
  return values;
}

void store_floats(const std::vector<float>& values, const Tensor& out, const char* op) {
  if (!cpu::is_float_storage(out.dtype)) cpu::throw_unsupported(op, out.dtype);
  for (size_t i = 0; i < values.size(); ++i) {
    switch (out.dtype) {
      case DType::bf16: out.ptr<uint16_t>()[i] = float_to_bf16(values[i]); break;
      case DType::f16: out.ptr<uint16_t>()[i] = float_to_f16(values[i]); break;
      default: out.ptr<float>()[i] = values[i]; break;
    }
  }
}

std::vector<float> transposed(const std::vector<float>& values, int64_t rows, int64_t cols) {
  std::vector<float> result(values.size());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      result[static_cast<size_t>(c * rows + r)] = values[static_cast<size_t>(r * cols + c)];
  return result;
}

numerics::Fp8Format fp8_format(DType element) {
  return element == DType::e5m2 ? numerics::Fp8Format::e5m2 : numerics::Fp8Format::e4m3;
}

void copy_bytes(const std::vector<uint8_t>& bytes, const Tensor& out) {
  MXTRAIN_ASSERT(bytes.size() == out.bytes(), "%zu bytes for %s", bytes.size(), out.describe().c_str());
  std::memcpy(out.data, bytes.data(), bytes.size());
}

// Compact [rows, blocks] scales into the copy's layout (compact or swizzled).
void store_scales(const std::vector<uint8_t>& scales, int64_t rows, int64_t blocks, const QuantizedTensor& q) {
  copy_bytes(q.spec.swizzled_scales ? numerics::swizzle_scales(scales, rows, blocks) : scales, q.scale_inverse);
}

std::vector<uint8_t> compact_scales(const QuantizedTensor& q, int64_t blocks) {
  const uint8_t* stored = q.scale_inverse.ptr<uint8_t>();
  std::vector<uint8_t> scales(static_cast<size_t>(q.rows() * blocks));
  for (int64_t r = 0; r < q.rows(); ++r) {
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t at = q.spec.swizzled_scales ? numerics::swizzled_scale_offset(r, b, blocks) : r * blocks + b;
      scales[static_cast<size_t>(r * blocks + b)] = stored[at];
    }
  }
  return scales;
}

// Quantizes `matrix` ([q.rows(), q.k()], already transposed for a columnwise copy) into q.
void quantize_copy(const std::vector<float>& matrix, const Tensor& scale, const QuantizedTensor& q) {
  const int64_t rows = q.rows(), k = q.k();
  switch (q.spec.mode) {
    case ScalingMode::per_tensor: {
      numerics::quantize_fp8(matrix, scale.ptr<float>()[0], fp8_format(q.spec.element),
                             {q.data.ptr<uint8_t>(), matrix.size()});
      q.scale_inverse.ptr<float>()[0] = 1.0f / scale.ptr<float>()[0];
      return;
    }
    case ScalingMode::mxfp8: {
      numerics::Mxfp8Options options;
      options.format = fp8_format(q.spec.element);
      options.rounding = q.spec.mx_round_up ? numerics::E8m0Rounding::round_up : numerics::E8m0Rounding::floor;
      const numerics::Mxfp8Tensor result = numerics::quantize_mxfp8(matrix, rows, k, options);
      copy_bytes(result.data, q.data);
      store_scales(result.scales, rows, k / numerics::kMxBlockSize, q);
      return;
    }
    case ScalingMode::nvfp4: {
      numerics::Nvfp4Options options;
      options.two_dimensional_blocks = q.spec.nvfp4_tiles;
      options.random_hadamard = q.spec.hadamard;
      options.stochastic_rounding = q.spec.stochastic_rounding;
      options.seed = q.spec.seed;
      options.offset = q.spec.offset;
      options.tensor_amax = q.amax.ptr<float>()[0];
      const numerics::Nvfp4Tensor result = numerics::quantize_nvfp4(matrix, rows, k, options);
      copy_bytes(result.data, q.data);
      store_scales(result.scales, rows, k / numerics::kNvfp4BlockSize, q);
      return;
    }
  }
}

// The values of q as stored: row-major [q.rows(), q.k()].
std::vector<float> dequantized(const QuantizedTensor& q) {
  const int64_t rows = q.rows(), k = q.k();
  const size_t count = static_cast<size_t>(rows * k);
  switch (q.spec.mode) {
    case ScalingMode::per_tensor: {
      std::vector<float> values(count);
      numerics::dequantize_fp8({q.data.ptr<uint8_t>(), count}, q.scale_inverse.ptr<float>()[0],
                               fp8_format(q.spec.element), values);
      return values;
    }
    case ScalingMode::mxfp8: {
      numerics::Mxfp8Tensor tensor;
      tensor.rows = rows;
      tensor.cols = k;
      tensor.options.format = fp8_format(q.spec.element);
      tensor.data.assign(q.data.ptr<uint8_t>(), q.data.ptr<uint8_t>() + count);
      tensor.scales = compact_scales(q, k / numerics::kMxBlockSize);
      return numerics::dequantize_mxfp8(tensor);
    }
    case ScalingMode::nvfp4: {
      numerics::Nvfp4Tensor tensor;
      tensor.rows = rows;
      tensor.cols = k;
      tensor.amax = q.amax.ptr<float>()[0];
      tensor.data.assign(q.data.ptr<uint8_t>(), q.data.ptr<uint8_t>() + q.data.bytes());
      tensor.scales = compact_scales(q, k / numerics::kNvfp4BlockSize);
      return numerics::dequantize_nvfp4(tensor);
    }
  }
  return {};
}

}  // namespace

void CpuBackend::impl_amax(const Tensor& x, const Tensor& out, bool accumulate, bool hadamard_transposed) {
  cpu::require_f32("amax", {&out});
  std::vector<float> values = as_floats(x, "amax");
  if (hadamard_transposed) {
    values = transposed(values, x.rows(), x.cols());
    numerics::random_hadamard_transform_rows(values, x.cols(), x.rows());
  }
  const float amax = numerics::amax_of(values);
  float& target = out.ptr<float>()[0];
  target = accumulate ? numerics::nan_propagating_max(target, amax) : amax;
}

void CpuBackend::impl_quantize(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                               const QuantizedTensor& columnwise, const Tensor& amax, const ScaleFromAmax& from) {
  if (from.defined()) {
    cpu::require_f32("quantize (scale from amax)", {&from.amax, &scale});
    scale.ptr<float>()[0] = numerics::current_scale_from_amax(from.amax.ptr<float>()[0], from.args.scaled_max,
                                                               from.args.epsilon, from.args.power_of_2_scales);
  }
  const std::vector<float> values = as_floats(x, "quantize");
  if (rowwise.data.defined()) quantize_copy(values, scale, rowwise);
  if (columnwise.data.defined()) quantize_copy(transposed(values, x.rows(), x.cols()), scale, columnwise);
  if (amax.defined()) {
    cpu::require_f32("quantize (amax)", {&amax});
    amax.ptr<float>()[0] = numerics::nan_propagating_max(amax.ptr<float>()[0], numerics::amax_of(values));
  }
}

void CpuBackend::impl_quantize_produced(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                                        const QuantizedTensor& columnwise, const Tensor& amax,
                                        const CastProducer& producer) {
  // The op into a temporary of x's dtype, then the cast: the values the unfused ops make.
  std::vector<uint8_t> storage(x.bytes());
  const Tensor produced(storage.data(), x.shape, x.dtype, Device::cpu);
  switch (producer.op) {
    case CastProducer::Op::swiglu_forward: impl_swiglu_forward(producer.gate_up, produced, Tensor()); break;
    case CastProducer::Op::swiglu_backward: impl_swiglu_backward(producer.dout, producer.gate_up, produced, Tensor()); break;
    case CastProducer::Op::norm_forward: {
      // The norm again into the temporary, with statistics of its own: the same code on the same
      // input gives the saved ones' values.
      std::vector<float> mean(static_cast<size_t>(x.rows())), rstd(static_cast<size_t>(x.rows()));
      const Tensor mean_t = producer.norm == NormKind::layer
                                ? Tensor(mean.data(), Shape{x.rows()}, DType::f32, Device::cpu)
                                : Tensor();
      impl_norm_forward(producer.norm, producer.input, producer.weight, producer.bias, produced, mean_t,
                        Tensor(rstd.data(), Shape{x.rows()}, DType::f32, Device::cpu), producer.eps, Tensor());
      break;
    }
    case CastProducer::Op::rope_backward:
      std::memcpy(produced.data, producer.input.data, x.bytes());
      impl_rope(produced, producer.shape, producer.rope, true, Tensor());
      break;
    case CastProducer::Op::none: MXTRAIN_ASSERT(false, "quantize_produced without a producer");
  }
  impl_quantize(produced, scale, rowwise, columnwise, amax, ScaleFromAmax{});
  if (producer.act_columnwise.data.defined()) {
    // The activation's copy: swiglu_forward into a temporary, then its own cast.
    const Shape act_shape{x.rows(), producer.dout.cols()};
    std::vector<uint8_t> act_storage(dtype_bytes(x.dtype, static_cast<size_t>(act_shape.numel())));
    const Tensor act(act_storage.data(), act_shape, x.dtype, Device::cpu);
    impl_swiglu_forward(producer.gate_up, act, Tensor());
    impl_quantize(act, producer.act_scale, QuantizedTensor{}, producer.act_columnwise, producer.act_amax,
                  ScaleFromAmax{});
  }
}

void CpuBackend::impl_dequantize(const QuantizedTensor& q, const Tensor& out) {
  const std::vector<float> values = dequantized(q);
  store_floats(q.transposed ? transposed(values, q.rows(), q.k()) : values, out, "dequantize");
}

void CpuBackend::gemm_quantized(const QuantizedTensor& a, const QuantizedTensor& b, const Tensor& bias,
                                const Tensor& out, bool accumulate) {
  cpu::require_f32("linear_quantized", {&out, &bias});
  const std::vector<float> left = dequantized(a), right = dequantized(b);
  const int64_t rows = a.rows(), features = b.rows(), k = a.k();
  float* result = out.ptr<float>();
  cpu::sgemm(threads_, false, true, rows, features, k, 1.0f, left.data(), k, right.data(), k, accumulate ? 1.0f : 0.0f,
             result, features);
  if (!bias.defined()) return;
  const float* add = bias.ptr<float>();
  cpu::parallel_rows(threads_, rows, [&](int64_t row) {
    for (int64_t c = 0; c < features; ++c) result[row * features + c] += add[c];
  });
}

void CpuBackend::impl_fp8_scale_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inverse,
                                       const ScaleUpdateArgs& args) {
  cpu::require_f32("fp8_scale_update", {&history, &scale, &scale_inverse});
  const int64_t length = history.rows(), tensors = history.cols();
  float* slots = history.ptr<float>();
  float* scales = scale.ptr<float>();
  float* inverses = scale_inverse.ptr<float>();
  for (int64_t t = 0; t < tensors; ++t) {
    if (args.rule == ScaleUpdateArgs::Rule::current) {
      scales[t] = numerics::current_scale_from_amax(slots[t], args.scaled_max, args.epsilon, args.power_of_2_scales);
    } else {
      float window = slots[t];
      if (!args.most_recent)
        for (int64_t slot = 1; slot < length; ++slot) window = numerics::nan_propagating_max(window, slots[slot * tensors + t]);
      scales[t] = numerics::delayed_scale_from_amax(window, args.scaled_max, scales[t]);
      for (int64_t slot = length - 1; slot >= 1; --slot) slots[slot * tensors + t] = slots[(slot - 1) * tensors + t];
      slots[t] = 0.0f;
    }
    inverses[t] = 1.0f / scales[t];
  }
}

void CpuBackend::impl_column_sum(const Tensor& x, const Tensor& out, bool accumulate) {
  cpu::require_f32("column_sum", {&x, &out});
  const int64_t rows = x.rows(), cols = x.cols(), ld = column_sum_row_stride(x);
  const float* values = x.ptr<float>();
  float* sums = out.ptr<float>();
  cpu::parallel_blocks(threads_, cols, 256, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      double total = accumulate ? sums[c] : 0.0;
      for (int64_t r = 0; r < rows; ++r) total += values[r * ld + c];
      sums[c] = static_cast<float>(total);
    }
  });
}

void CpuBackend::impl_qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                                        const Tensor& qkv_bias_grad, bool accumulate) {
  cpu::require_f32("qkv_bias_gradient", {&dqkv, &out_bias_grad, &out_weight, &qkv_bias_grad});
  const int64_t hidden = out_bias_grad.numel();
  const Tensor& bias = qkv_bias_grad;
  impl_column_sum(dqkv.flatten_rows().narrow(1, 0, hidden), bias.narrow(0, 0, hidden), accumulate);
  float* key = bias.ptr<float>() + hidden;
  float* value = key + hidden;
  if (!accumulate) std::fill(key, key + hidden, 0.0f);
  const float* dout = out_bias_grad.ptr<float>();
  const float* w = out_weight.ptr<float>();
  cpu::parallel_blocks(threads_, hidden, 256, [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) {
      double total = 0.0;
      for (int64_t i = 0; i < hidden; ++i) total += static_cast<double>(dout[i]) * w[i * hidden + j];
      value[j] = static_cast<float>(total);
    }
  });
}

}  // namespace mxtrain
