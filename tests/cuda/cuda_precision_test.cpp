// The precision recipes on the GPU. Quantizers: the CUDA kernels against the CPU op (which is
// numerics/, the reference) on large random tensors with special values mixed in — codes, block
// scales and amaxes must be bit-identical, stochastic rounding included (same seed and offset),
// and so must dequantization. GEMMs: cuBLASLt's FP8 GEMMs against the FP32 product of the same
// dequantized operands. Steps: one training step per recipe against the BF16 step.
//
// Tolerances (relative L2). FP8 GEMMs: the operands are identical, so only accumulation and
// output rounding differ: bf16 outputs round each element by up to 2^-9 (about 1.5e-3 relative
// L2 over a matrix), fast accumulation adds about 1e-4; an FP32 output with split accumulation
// differs by FP32 rounding only. A wrong scale or operand layout is an O(1) error.
//   forward (bf16, fast accumulation)     6e-3
//   dgrad (bf16, split accumulation)      6e-3
//   wgrad (FP32 accumulate, split)        1e-4
// Steps against bf16: per-element quantization error is ~3.6% RMS for E4M3, ~7% for E5M2, ~14%
// for E2M1; gradients are sums of many such products, so their relative errors stay well below
// the per-element ones. Loss: the forward alone, small.
//   fp8 (second pass), fp8-current, mxfp8: loss 2e-2, every gradient 0.25; nvfp4: loss 5e-2,
//   gradients 0.6
#include <algorithm>
#include <cstring>

#include "cuda/cuda_test_support.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/model/transformer.hpp"
#include "mxtrain/numerics/fp8.hpp"
#include "mxtrain/numerics/host_device.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain::test {
namespace {

std::vector<uint8_t> raw_bytes(Backend& backend, const Tensor& tensor) {
  std::vector<uint8_t> host(tensor.bytes());
  const Tensor raw(tensor.data, Shape{static_cast<int64_t>(tensor.bytes())}, DType::u8, tensor.device);
  backend.copy_to_host(raw, host.data());
  return host;
}

void upload_bytes(Backend& backend, const std::vector<uint8_t>& bytes, const Tensor& tensor) {
  const Tensor raw(tensor.data, Shape{static_cast<int64_t>(tensor.bytes())}, DType::u8, tensor.device);
  backend.copy_from_host(bytes.data(), raw);
}

// Random values with special ones in the first rows: ±0, FP32 subnormals, huge and tiny
// magnitudes, and (when `nonfinite`) ±inf and NaN.
std::vector<float> inputs(int64_t rows, int64_t cols, uint64_t seed, bool nonfinite) {
  std::vector<float> values = random_vector(static_cast<size_t>(rows * cols), seed, -3.0f, 3.0f);
  const float specials[] = {0.0f, -0.0f, 1e-40f, -3e-39f, 1e5f, -7e4f, 1e-8f, 448.0f, 57344.0f, 6.0f, -6.5f};
  for (size_t i = 0; i < sizeof specials / sizeof specials[0]; ++i) values[i * 37 % values.size()] = specials[i];
  for (size_t i = 0; i < static_cast<size_t>(cols); i += 7) values[i] *= 1e-6f;  // a tiny block in row 0
  if (nonfinite) {
    values[static_cast<size_t>(cols + 3)] = INFINITY;
    values[static_cast<size_t>(2 * cols + 40)] = -INFINITY;
    values[static_cast<size_t>(3 * cols + 77)] = NAN;
  }
  return values;
}

struct Copy {
  Buffer data, scales, amax;
  QuantizedTensor q;
};

Copy allocate_copy(Backend& backend, const QuantizeSpec& spec, bool transposed, int64_t rows, int64_t cols) {
  Copy copy;
  copy.q.spec = spec;
  copy.q.transposed = transposed;
  const int64_t r = transposed ? cols : rows, k = transposed ? rows : cols;
  copy.data = backend.allocate("q", Shape{r, k}, spec.element, Lifetime::scratch);
  copy.q.data = copy.data;
  copy.scales = backend.allocate("s", block_scale_shape(spec, r, k), block_scale_dtype(spec.mode), Lifetime::scratch);
  copy.q.scale_inverse = copy.scales;
  copy.amax = backend.allocate("a", Shape{1}, DType::f32, Lifetime::scratch);
  copy.q.amax = copy.amax;
  return copy;
}

struct QuantizeCase {
  const char* name;
  QuantizeSpec spec;
  bool transposed;
  DType input;
  bool nonfinite;
};

QuantizeSpec spec_of(ScalingMode mode, DType element) {
  QuantizeSpec spec;
  spec.mode = mode;
  spec.element = element;
  return spec;
}

std::vector<QuantizeCase> quantize_cases() {
  std::vector<QuantizeCase> cases;
  for (DType input : {DType::bf16, DType::f32}) {
    cases.push_back({"fp8_e4m3", spec_of(ScalingMode::per_tensor, DType::e4m3), false, input, true});
    cases.push_back({"fp8_e5m2", spec_of(ScalingMode::per_tensor, DType::e5m2), false, input, true});
    cases.push_back({"mxfp8_e4m3_rows", spec_of(ScalingMode::mxfp8, DType::e4m3), false, input, true});
    cases.push_back({"mxfp8_e4m3_columns", spec_of(ScalingMode::mxfp8, DType::e4m3), true, input, true});
    QuantizeSpec floor = spec_of(ScalingMode::mxfp8, DType::e5m2);
    floor.mx_round_up = false;
    cases.push_back({"mxfp8_e5m2_floor_columns", floor, true, input, true});
    QuantizeSpec swizzled = spec_of(ScalingMode::mxfp8, DType::e4m3);
    swizzled.swizzled_scales = true;
    cases.push_back({"mxfp8_swizzled_columns", swizzled, true, input, false});
    cases.push_back({"nvfp4_rows", spec_of(ScalingMode::nvfp4, DType::e2m1), false, input, false});
    QuantizeSpec tiles = spec_of(ScalingMode::nvfp4, DType::e2m1);
    tiles.nvfp4_tiles = true;
    cases.push_back({"nvfp4_tiles_columns", tiles, true, input, false});
    QuantizeSpec gradient = spec_of(ScalingMode::nvfp4, DType::e2m1);
    gradient.hadamard = true;
    gradient.stochastic_rounding = true;
    gradient.seed = 1234;
    gradient.offset = 99;
    gradient.swizzled_scales = true;
    cases.push_back({"nvfp4_rht_sr_swizzled_columns", gradient, true, input, false});
    QuantizeSpec sr_rows = gradient;
    sr_rows.hadamard = false;
    sr_rows.swizzled_scales = false;
    cases.push_back({"nvfp4_sr_rows", sr_rows, false, input, false});
  }
  return cases;
}

class CudaQuantize : public CudaTest {
 protected:
  // A cast with `producer` fused in against the op's output `op_output` cast apart: both copies,
  // their decode scales and the recorded amax byte for byte, and the columnwise copy alone (a
  // weight gradient's input cast) against the pair's; the fused codes are mostly neither zero
  // nor NaN (they carry the op's values). Returns the fused rowwise codes.
  std::vector<uint8_t> expect_fused_cast_is_op_then_cast(const std::string& what, const Tensor& op_output,
                                                         const Tensor& scale, DType element,
                                                         const CastProducer& producer, float amax_start) {
    const int64_t rows = op_output.rows(), cols = op_output.cols();
    const QuantizeSpec spec = spec_of(ScalingMode::per_tensor, element);
    Copy r[2] = {allocate_copy(cuda(), spec, false, rows, cols), allocate_copy(cuda(), spec, false, rows, cols)};
    Copy c[2] = {allocate_copy(cuda(), spec, true, rows, cols), allocate_copy(cuda(), spec, true, rows, cols)};
    Buffer amax[2] = {upload(cuda(), {amax_start}, Shape{1}), upload(cuda(), {amax_start}, Shape{1})};
    cuda().quantize(op_output, scale, r[0].q, c[0].q, amax[0]);
    // Fused: the op's output is never written (its tensor gives only shape and dtype).
    const Tensor shape_only(nullptr, op_output.shape, op_output.dtype, Device::cuda);
    cuda().quantize(shape_only, scale, r[1].q, c[1].q, amax[1], ScaleFromAmax{}, producer);
    EXPECT_EQ(raw_bytes(cuda(), r[0].data), raw_bytes(cuda(), r[1].data)) << what;
    EXPECT_EQ(raw_bytes(cuda(), c[0].data), raw_bytes(cuda(), c[1].data)) << what;
    EXPECT_EQ(raw_bytes(cuda(), r[0].scales), raw_bytes(cuda(), r[1].scales)) << what;
    EXPECT_EQ(raw_bytes(cuda(), c[0].scales), raw_bytes(cuda(), c[1].scales)) << what;
    EXPECT_EQ(raw_bytes(cuda(), amax[0]), raw_bytes(cuda(), amax[1])) << what;
    Copy alone = allocate_copy(cuda(), spec, true, rows, cols);
    cuda().quantize(shape_only, scale, QuantizedTensor{}, alone.q, Tensor(), ScaleFromAmax{}, producer);
    EXPECT_EQ(raw_bytes(cuda(), c[0].data), raw_bytes(cuda(), alone.data)) << what << " columnwise alone";
    const std::vector<uint8_t> codes = raw_bytes(cuda(), r[1].data);
    EXPECT_GT(std::count_if(codes.begin(), codes.end(), [](uint8_t b) { return (b & 0x7f) != 0; }),
              static_cast<std::ptrdiff_t>(codes.size() / 2))
        << what;
    return codes;
  }
};

// Current scaling with the scale formed in the cast (ScaleFromAmax): the scale it stores, both
// copies' codes and decode scales are the reference's, and the codes those of the two-op path (a
// scale update, then the cast).
TEST_F(CudaQuantize, CurrentScaleFormedInTheCastIsTheReferences) {
  const int64_t rows = 768, cols = 1536;
  for (DType input : {DType::f32, DType::bf16}) {
    for (DType element : {DType::e4m3, DType::e5m2}) {
      const std::string name = dtype_text(input) + " -> " + dtype_text(element);
      const std::vector<float> values = rounded(inputs(rows, cols, 11, false), input);
      Buffer x_cpu = upload(cpu(), values, Shape{rows, cols}, DType::f32);
      Buffer x_gpu = upload(cuda(), values, Shape{rows, cols}, input);
      Buffer amax_cpu = upload(cpu(), {0.0f}, Shape{1, 1}), amax_gpu = upload(cuda(), {0.0f}, Shape{1, 1});
      cpu().amax(x_cpu, amax_cpu, false);
      cuda().amax(x_gpu, amax_gpu, false);
      ScaleFromAmax from_cpu, from_gpu;
      from_cpu.amax = amax_cpu;
      from_gpu.amax = amax_gpu;
      for (ScaleFromAmax* from : {&from_cpu, &from_gpu}) {
        from->args.rule = ScaleUpdateArgs::Rule::current;
        from->args.scaled_max = element == DType::e5m2 ? numerics::kE5m2Max : numerics::kE4m3Max;
      }
      Buffer scale_cpu = upload(cpu(), {123.0f}, Shape{1}), scale_gpu = upload(cuda(), {123.0f}, Shape{1});
      const QuantizeSpec spec = spec_of(ScalingMode::per_tensor, element);
      Copy row_a = allocate_copy(cpu(), spec, false, rows, cols), col_a = allocate_copy(cpu(), spec, true, rows, cols);
      Copy row_b = allocate_copy(cuda(), spec, false, rows, cols), col_b = allocate_copy(cuda(), spec, true, rows, cols);
      cpu().quantize(x_cpu, scale_cpu, row_a.q, col_a.q, Tensor(), from_cpu);
      cuda().quantize(x_gpu, scale_gpu, row_b.q, col_b.q, Tensor(), from_gpu);
      EXPECT_EQ(raw_bytes(cpu(), scale_cpu), raw_bytes(cuda(), scale_gpu)) << name << ": scale";
      EXPECT_NE(download(cuda(), scale_gpu)[0], 123.0f) << name << ": the cast stores the scale";
      for (auto [a, b] : {std::pair<Copy*, Copy*>{&row_a, &row_b}, {&col_a, &col_b}}) {
        EXPECT_EQ(raw_bytes(cpu(), a->data), raw_bytes(cuda(), b->data)) << name << ": codes";
        EXPECT_EQ(raw_bytes(cpu(), a->scales), raw_bytes(cuda(), b->scales)) << name << ": decode scale";
      }
      // The two-op path on the GPU gives the same codes.
      Buffer scale_two = cuda().allocate("scale", Shape{1}, DType::f32, Lifetime::scratch);
      Buffer inverse_two = cuda().allocate("inverse", Shape{1}, DType::f32, Lifetime::scratch);
      cuda().fp8_scale_update(amax_gpu, scale_two, inverse_two, from_gpu.args);
      Copy row_c = allocate_copy(cuda(), spec, false, rows, cols), col_c = allocate_copy(cuda(), spec, true, rows, cols);
      cuda().quantize(x_gpu, scale_two, row_c.q, col_c.q, Tensor());
      EXPECT_EQ(raw_bytes(cuda(), row_c.data), raw_bytes(cuda(), row_b.data)) << name << ": two-op rowwise";
      EXPECT_EQ(raw_bytes(cuda(), col_c.data), raw_bytes(cuda(), col_b.data)) << name << ": two-op columnwise";
    }
  }
}

TEST_F(CudaQuantize, KernelsAreBitIdenticalToTheReference) {
  const int64_t rows = 768, cols = 1536;  // 1.2M elements per case
  for (const QuantizeCase& c : quantize_cases()) {
    const std::string name = std::string(c.name) + "_" + dtype_text(c.input);
    const std::vector<float> values = rounded(inputs(rows, cols, 7, c.nonfinite), c.input);
    Buffer x_cpu = upload(cpu(), values, Shape{rows, cols}, DType::f32);
    Buffer x_gpu = upload(cuda(), values, Shape{rows, cols}, c.input);
    const float finite_amax = 1e5f;
    Buffer scale_cpu = upload(cpu(), {448.0f / finite_amax}, Shape{1});
    Buffer scale_gpu = upload(cuda(), {448.0f / finite_amax}, Shape{1});
    Copy a = allocate_copy(cpu(), c.spec, c.transposed, rows, cols);
    Copy b = allocate_copy(cuda(), c.spec, c.transposed, rows, cols);
    Buffer amax_cpu = upload(cpu(), {0.0f}, Shape{1});
    Buffer amax_gpu = upload(cuda(), {0.0f}, Shape{1});
    if (c.spec.mode == ScalingMode::nvfp4) {
      const bool rht = c.transposed && c.spec.hadamard;
      cpu().amax(x_cpu, a.amax, false, rht);
      cuda().amax(x_gpu, b.amax, false, rht);
    }
    const QuantizedTensor none;
    cpu().quantize(x_cpu, scale_cpu, c.transposed ? none : a.q, c.transposed ? a.q : none, amax_cpu);
    cuda().quantize(x_gpu, scale_gpu, c.transposed ? none : b.q, c.transposed ? b.q : none, amax_gpu);
    const std::vector<uint8_t> want = raw_bytes(cpu(), a.data), got = raw_bytes(cuda(), b.data);
    size_t differing = 0;
    for (size_t i = 0; i < want.size(); ++i) differing += want[i] != got[i];
    std::printf("[ info ] quantize %-40s %zu of %zu code bytes differ\n", name.c_str(), differing, want.size());
    EXPECT_EQ(differing, 0u) << name;
    // Block scales, or the per-tensor decode scale each copy carries.
    EXPECT_EQ(raw_bytes(cpu(), a.scales), raw_bytes(cuda(), b.scales)) << name;
    std::vector<std::pair<Buffer*, Buffer*>> amaxes{{&amax_cpu, &amax_gpu}};
    if (c.spec.mode == ScalingMode::nvfp4) amaxes.push_back({&a.amax, &b.amax});
    for (const auto& [left, right] : amaxes) {
      const float l = download(cpu(), *left)[0], r = download(cuda(), *right)[0];
      EXPECT_TRUE(numerics::is_nan(l) ? numerics::is_nan(r) : l == r) << name << ": amax " << l << " vs " << r;
    }
    // Dequantization, in x's layout, from the same codes: the same bits, except that the GPU's
    // NaNs carry the canonical payload.
    Buffer back_cpu = cpu().allocate("back", Shape{rows, cols}, DType::f32, Lifetime::scratch);
    Buffer back_gpu = cuda().allocate("back", Shape{rows, cols}, DType::f32, Lifetime::scratch);
    cpu().dequantize(a.q, back_cpu);
    cuda().dequantize(b.q, back_gpu);
    const std::vector<float> want_values = download(cpu(), back_cpu), got_values = download(cuda(), back_gpu);
    size_t mismatched = 0;
    for (size_t i = 0; i < want_values.size(); ++i) {
      const bool nan = numerics::is_nan(want_values[i]);
      mismatched += nan ? !numerics::is_nan(got_values[i])
                        : numerics::float_to_bits(want_values[i]) != numerics::float_to_bits(got_values[i]);
    }
    EXPECT_EQ(mismatched, 0u) << name << ": dequantized values differ";
  }
}

TEST_F(CudaQuantize, CastTransposeWritesBothCopiesInOnePass) {
  const int64_t rows = 1000, cols = 264;  // not multiples of the 64x64 tile
  const std::vector<float> values = rounded(inputs(rows, cols, 3, true), DType::bf16);
  Buffer x_cpu = upload(cpu(), values, Shape{rows, cols}, DType::f32);
  Buffer x_gpu = upload(cuda(), values, Shape{rows, cols}, DType::bf16);
  Buffer scale_cpu = upload(cpu(), {0.004f}, Shape{1});
  Buffer scale_gpu = upload(cuda(), {0.004f}, Shape{1});
  const QuantizeSpec spec = spec_of(ScalingMode::per_tensor, DType::e5m2);
  Copy ra = allocate_copy(cpu(), spec, false, rows, cols), ca = allocate_copy(cpu(), spec, true, rows, cols);
  Copy rb = allocate_copy(cuda(), spec, false, rows, cols), cb = allocate_copy(cuda(), spec, true, rows, cols);
  Buffer amax_cpu = upload(cpu(), {0.0f}, Shape{1});
  Buffer amax_gpu = upload(cuda(), {0.0f}, Shape{1});
  cpu().quantize(x_cpu, scale_cpu, ra.q, ca.q, amax_cpu);
  cuda().quantize(x_gpu, scale_gpu, rb.q, cb.q, amax_gpu);
  EXPECT_EQ(raw_bytes(cpu(), ra.data), raw_bytes(cuda(), rb.data));
  EXPECT_EQ(raw_bytes(cpu(), ca.data), raw_bytes(cuda(), cb.data));
  EXPECT_TRUE(numerics::is_nan(download(cuda(), amax_gpu)[0]));
}

// A cast with SwiGLU fused in (CastProducer) writes the codes, decode scales and amax of
// SwiGLU's kernel followed by the cast, bit for bit: forward (E4M3) and backward (E5M2, both
// halves; and with the activation's own columnwise copy beside), both copies, on a shape off the 128x64 tiles and the 8-wide vectors (scalar loads
// and stores) and on a model-like one (the vector path), with non-finite inputs mixed in.
TEST_F(CudaQuantize, FusedSwigluCastsAreTheOpThenTheCast) {
  struct Shape2 {
    int64_t rows, ffn;
  };
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (const Shape2 shape : {Shape2{1000, 132}, Shape2{256, 704}}) {
      const int64_t rows = shape.rows, ffn = shape.ffn;
      const std::string label = std::string(dtype_name(dtype)) + " " + std::to_string(rows) + "x" + std::to_string(ffn);
      Buffer gate_up = upload(cuda(), inputs(rows, 2 * ffn, 7, true), Shape{rows, 2 * ffn}, dtype);
      Buffer dout = upload(cuda(), inputs(rows, ffn, 8, false), Shape{rows, ffn}, dtype);
      Buffer scale = upload(cuda(), {0.37f}, Shape{1});
      for (const bool backward : {false, true}) {
        const int64_t cols = backward ? 2 * ffn : ffn;
        Buffer x = cuda().allocate("x", Shape{rows, cols}, dtype, Lifetime::scratch);
        if (backward) cuda().swiglu_backward(dout, gate_up, x);
        else cuda().swiglu_forward(gate_up, x);
        CastProducer producer;
        producer.op = backward ? CastProducer::Op::swiglu_backward : CastProducer::Op::swiglu_forward;
        producer.gate_up = gate_up;
        if (backward) producer.dout = dout;
        expect_fused_cast_is_op_then_cast(label + (backward ? " backward" : " forward"), x, scale,
                                          backward ? DType::e5m2 : DType::e4m3, producer, 0.5f);
        if (!backward) continue;
        // With the activation's copy beside (CastProducer::act_columnwise): the gradient's copies
        // as before, and the activation's E4M3 columnwise codes, decode scale and amax those of
        // swiglu_forward followed by its cast with its own scale.
        Buffer act = cuda().allocate("act", Shape{rows, ffn}, dtype, Lifetime::scratch);
        cuda().swiglu_forward(gate_up, act);
        Buffer act_scale = upload(cuda(), {0.81f}, Shape{1});
        const QuantizeSpec e4m3 = spec_of(ScalingMode::per_tensor, DType::e4m3);
        Copy apart = allocate_copy(cuda(), e4m3, true, rows, ffn), side = allocate_copy(cuda(), e4m3, true, rows, ffn);
        Buffer amax_apart = upload(cuda(), {0.25f}, Shape{1}), amax_side = upload(cuda(), {0.25f}, Shape{1});
        cuda().quantize(act, act_scale, QuantizedTensor{}, apart.q, amax_apart);
        CastProducer with_act = producer;
        with_act.act_scale = act_scale;
        with_act.act_amax = amax_side;
        with_act.act_columnwise = side.q;
        expect_fused_cast_is_op_then_cast(label + " backward with the activation's copy", x, scale, DType::e5m2,
                                          with_act, 0.5f);
        EXPECT_EQ(raw_bytes(cuda(), apart.data), raw_bytes(cuda(), side.data)) << label;
        EXPECT_EQ(raw_bytes(cuda(), apart.scales), raw_bytes(cuda(), side.scales)) << label;
        EXPECT_EQ(raw_bytes(cuda(), amax_apart), raw_bytes(cuda(), amax_side)) << label;
        const std::vector<uint8_t> codes = raw_bytes(cuda(), side.data);
        EXPECT_GT(std::count_if(codes.begin(), codes.end(), [](uint8_t b) { return (b & 0x7f) != 0; }),
                  static_cast<std::ptrdiff_t>(codes.size() / 2))
            << label << " activation codes";
      }
    }
  }
}

// A cast with a norm fused in (its stats-only pass, then CastFromNorm) writes the codes, decode
// scales and amax of the norm kernel followed by the cast, bit for bit, and the stats-only pass
// saves the statistics (and the residual sum) the full norm saves: RMSNorm and LayerNorm (with
// its bias), plain and with the residual add, bf16 and f32 rows, weights stored as
// the rows' type or as FP32 masters, on a shape off the tiles and the 8-wide vectors and on a
// model-like one, with non-finite inputs mixed in.
TEST_F(CudaQuantize, FusedNormCastsAreTheNormThenTheCast) {
  struct Shape2 {
    int64_t rows, cols;
  };
  int cases = 0;
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (const Shape2 shape : {Shape2{1000, 132}, Shape2{256, 2048}}) {
      const int64_t rows = shape.rows, cols = shape.cols;
      Buffer a = upload(cuda(), inputs(rows, cols, 21, true), Shape{rows, cols}, dtype);
      Buffer b = upload(cuda(), inputs(rows, cols, 22, false), Shape{rows, cols}, dtype);
      Buffer scale = upload(cuda(), {0.61f}, Shape{1});
      const std::vector<DType> weight_dtypes =
          dtype == DType::f32 ? std::vector<DType>{DType::f32} : std::vector<DType>{dtype, DType::f32};
      for (const DType weight_dtype : weight_dtypes) {
        Buffer weight = upload(cuda(), random_vector(static_cast<size_t>(cols), 23, -2.0f, 2.0f), Shape{cols},
                               weight_dtype);
        Buffer bias = upload(cuda(), random_vector(static_cast<size_t>(cols), 24, -1.0f, 1.0f), Shape{cols},
                             weight_dtype);
        for (const NormKind kind : {NormKind::rms, NormKind::layer}) {
          for (const bool add : {false, true}) {
            const bool with_bias = kind == NormKind::layer;  // the backend's LayerNorm has a bias
            ++cases;
            const std::string what = std::string(dtype_name(dtype)) + " " + std::to_string(rows) + "x" +
                                     std::to_string(cols) + " weight " + std::string(dtype_name(weight_dtype)) +
                                     (kind == NormKind::rms ? " rms" : " layer") + (add ? " add" : "") +
                                     (with_bias ? " bias" : "");
            const Tensor bias_t = with_bias ? Tensor(bias) : Tensor();
            auto stats = [&](const char* name) {
              return cuda().allocate(name, Shape{rows}, DType::f32, Lifetime::scratch);
            };
            Buffer mean[2] = {stats("mean0"), stats("mean1")}, rstd[2] = {stats("rstd0"), stats("rstd1")};
            Buffer sum[2] = {cuda().allocate("sum0", Shape{rows, cols}, dtype, Lifetime::scratch),
                             cuda().allocate("sum1", Shape{rows, cols}, dtype, Lifetime::scratch)};
            const Tensor mean_t[2] = {kind == NormKind::layer ? Tensor(mean[0]) : Tensor(),
                                      kind == NormKind::layer ? Tensor(mean[1]) : Tensor()};
            // The norm apart (its output then cast by the helper), and the stats-only pass
            // whose statistics (and sum) the fused cast reads.
            Buffer y = cuda().allocate("y", Shape{rows, cols}, dtype, Lifetime::scratch);
            if (add) cuda().add_norm_forward(kind, a, b, sum[0], weight, bias_t, y, mean_t[0], rstd[0], 1e-5f);
            else cuda().norm_forward(kind, a, weight, bias_t, y, mean_t[0], rstd[0], 1e-5f);
            if (add) cuda().add_norm_forward(kind, a, b, sum[1], weight, bias_t, Tensor(), mean_t[1], rstd[1], 1e-5f);
            else cuda().norm_forward(kind, a, weight, bias_t, Tensor(), mean_t[1], rstd[1], 1e-5f);
            EXPECT_EQ(raw_bytes(cuda(), rstd[0]), raw_bytes(cuda(), rstd[1])) << what;
            if (kind == NormKind::layer) EXPECT_EQ(raw_bytes(cuda(), mean[0]), raw_bytes(cuda(), mean[1])) << what;
            if (add) EXPECT_EQ(raw_bytes(cuda(), sum[0]), raw_bytes(cuda(), sum[1])) << what;
            CastProducer producer;
            producer.op = CastProducer::Op::norm_forward;
            producer.norm = kind;
            producer.input = add ? Tensor(sum[1]) : Tensor(a);
            producer.weight = weight;
            producer.bias = bias_t;
            producer.mean = mean_t[1];
            producer.rstd = rstd[1];
            producer.eps = 1e-5f;
            expect_fused_cast_is_op_then_cast(what, y, scale, DType::e4m3, producer, 0.5f);
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 24);
}

// A cast with RoPE's backward fused in writes the codes, decode scales and amax of the rope
// kernel's inverse rotation followed by the cast, bit for bit, and leaves its input as it was:
// grouped-query shapes with head_dim 64 (the partner in the same tile) and 128 (the next one),
// a position offset, bf16 and f32, both copies and the columnwise copy alone; and the rotation
// itself equals the CPU oracle's.
TEST_F(CudaQuantize, FusedRopeBackwardCastsAreTheOpThenTheCast) {
  const AttentionShape shapes[] = {
      {.batch = 2, .seq = 160, .heads = 8, .kv_heads = 2, .head_dim = 64, .softmax_scale = 1.0f},
      {.batch = 3, .seq = 64, .heads = 4, .kv_heads = 1, .head_dim = 128, .softmax_scale = 1.0f, .position_offset = 7}};
  for (DType dtype : {DType::bf16, DType::f32}) {
    for (const AttentionShape& shape : shapes) {
      const RopeSpec rope(500000.0f);
      const int64_t rows = shape.batch * shape.seq, cols = shape.qkv_cols();
      const std::string what = std::string(dtype_name(dtype)) + " d" + std::to_string(shape.head_dim);
      const std::vector<float> values = rounded(inputs(rows, cols, 31, false), dtype);
      Buffer dqkv = upload(cuda(), values, Shape{rows, cols}, dtype);
      Buffer rotated = upload(cuda(), values, Shape{rows, cols}, dtype);
      cuda().rope_backward(rotated, shape, rope);
      // The rotation against the CPU oracle's (explicit roundings on both).
      if (dtype == DType::f32) {
        Buffer on_cpu = upload(cpu(), values, Shape{rows, cols});
        cpu().rope_backward(on_cpu, shape, rope);
        EXPECT_EQ(raw_bytes(cpu(), on_cpu), raw_bytes(cuda(), rotated)) << what << " rotation";
      }
      Buffer scale = upload(cuda(), {3.5f}, Shape{1});
      CastProducer producer;
      producer.op = CastProducer::Op::rope_backward;
      producer.input = dqkv;
      producer.shape = shape;
      producer.rope = rope;
      const std::vector<uint8_t> before = raw_bytes(cuda(), dqkv);
      const std::vector<uint8_t> codes = expect_fused_cast_is_op_then_cast(what, rotated, scale, DType::e5m2, producer,
                                                                           0.0f);
      EXPECT_EQ(before, raw_bytes(cuda(), dqkv)) << what << ": the input changed";
      // The rotation moved the codes (the fused cast did not cast the unrotated gradient).
      Copy unrotated = allocate_copy(cuda(), spec_of(ScalingMode::per_tensor, DType::e5m2), false, rows, cols);
      cuda().quantize(dqkv, scale, unrotated.q, QuantizedTensor{}, Tensor());
      EXPECT_NE(raw_bytes(cuda(), unrotated.data), codes) << what;
    }
  }
}

TEST_F(CudaQuantize, ScaleUpdatesMatchTheReference) {
  const int64_t length = 16, tensors = 300;
  std::vector<float> history = random_vector(static_cast<size_t>(length * tensors), 5, 0.0f, 100.0f);
  history[3] = NAN;
  for (int64_t slot = 0; slot < length; ++slot) history[static_cast<size_t>(slot * tensors + 7)] = 0.0f;
  history[11] = INFINITY;
  const std::vector<float> scales = random_vector(static_cast<size_t>(tensors), 6, 0.5f, 2.0f);
  for (int rule = 0; rule < 3; ++rule) {
    ScaleUpdateArgs args;
    args.rule = rule == 2 ? ScaleUpdateArgs::Rule::current : ScaleUpdateArgs::Rule::delayed;
    args.most_recent = rule == 1;
    args.scaled_max = rule == 2 ? 57344.0f : 112.0f;  // 448 · 2^-2 (margin 2)
    args.power_of_2_scales = rule == 2;
    const int64_t slots = rule == 2 ? 1 : length;
    const std::vector<float> h(history.begin(), history.begin() + slots * tensors);
    Buffer hc = upload(cpu(), h, Shape{slots, tensors}), hg = upload(cuda(), h, Shape{slots, tensors});
    Buffer sc = upload(cpu(), scales, Shape{tensors}), sg = upload(cuda(), scales, Shape{tensors});
    Buffer ic = upload(cpu(), scales, Shape{tensors}), ig = upload(cuda(), scales, Shape{tensors});
    cpu().fp8_scale_update(hc, sc, ic, args);
    cuda().fp8_scale_update(hg, sg, ig, args);
    EXPECT_EQ(raw_bytes(cpu(), hc), raw_bytes(cuda(), hg)) << "rule " << rule;
    EXPECT_EQ(raw_bytes(cpu(), sc), raw_bytes(cuda(), sg)) << "rule " << rule;
    EXPECT_EQ(raw_bytes(cpu(), ic), raw_bytes(cuda(), ig)) << "rule " << rule;
  }
}

// cuBLASLt FP8 GEMMs on quantized operands against the CPU's FP32 product of the same values.
TEST_F(CudaQuantize, Fp8GemmsMatchTheDequantizedProduct) {
  if (!cuda().supports(OpKind::linear_forward, DType::e4m3)) GTEST_SKIP() << "no FP8 tensor cores";
  const int64_t n = 512, k = 1024, m = 768;
  auto quantize_both = [&](const std::vector<float>& values, int64_t rows, int64_t cols, DType element, bool transposed,
                           float scale, Copy& on_cpu, Copy& on_gpu) {
    const QuantizeSpec spec = spec_of(ScalingMode::per_tensor, element);
    on_gpu = allocate_copy(cuda(), spec, transposed, rows, cols);
    on_cpu = allocate_copy(cpu(), spec, transposed, rows, cols);
    Buffer x = upload(cuda(), values, Shape{rows, cols}, DType::bf16);
    Buffer s = upload(cuda(), {scale}, Shape{1});
    const QuantizedTensor none;
    cuda().quantize(x, s, transposed ? none : on_gpu.q, transposed ? on_gpu.q : none, Tensor());
    EXPECT_EQ(download(cuda(), on_gpu.scales)[0], 1.0f / scale);  // the cast wrote the decode scale
    upload_bytes(cpu(), raw_bytes(cuda(), on_gpu.data), on_cpu.data);
    upload_bytes(cpu(), raw_bytes(cuda(), on_gpu.scales), on_cpu.scales);
  };
  const std::vector<float> x = rounded(random_vector(static_cast<size_t>(n * k), 11, -2.0f, 2.0f), DType::bf16);
  const std::vector<float> w = rounded(random_vector(static_cast<size_t>(m * k), 12, -0.05f, 0.05f), DType::bf16);
  const std::vector<float> dy = rounded(random_vector(static_cast<size_t>(n * m), 13, -1e-4f, 1e-4f), DType::bf16);
  const std::vector<float> bias = rounded(random_vector(static_cast<size_t>(m), 14, -1.0f, 1.0f), DType::bf16);
  Copy xr_c, xr_g, xc_c, xc_g, wr_c, wr_g, wc_c, wc_g, dr_c, dr_g, dc_c, dc_g;
  quantize_both(x, n, k, DType::e4m3, false, 200.0f, xr_c, xr_g);
  quantize_both(x, n, k, DType::e4m3, true, 200.0f, xc_c, xc_g);
  quantize_both(w, m, k, DType::e4m3, false, 8000.0f, wr_c, wr_g);
  quantize_both(w, m, k, DType::e4m3, true, 8000.0f, wc_c, wc_g);
  quantize_both(dy, n, m, DType::e5m2, false, 4e8f, dr_c, dr_g);
  quantize_both(dy, n, m, DType::e5m2, true, 4e8f, dc_c, dc_g);

  // forward: out[n, m] = x · wᵀ + bias (bf16 on the GPU)
  Buffer bias_cpu = upload(cpu(), bias, Shape{m}), bias_gpu = upload(cuda(), bias, Shape{m}, DType::bf16);
  Buffer out_cpu = cpu().allocate("out", Shape{n, m}, DType::f32, Lifetime::scratch);
  Buffer out_gpu = cuda().allocate("out", Shape{n, m}, DType::bf16, Lifetime::scratch);
  cpu().gemm({.role = GemmRole::forward, .a = xr_c.q, .b = wr_c.q, .out = out_cpu, .bias = bias_cpu});
  cuda().gemm({.role = GemmRole::forward, .a = xr_g.q, .b = wr_g.q, .out = out_gpu, .bias = bias_gpu});
  EXPECT_LE(report_error("fp8 gemm forward e4m3 x e4m3 (fast accumulation)", download(cuda(), out_gpu),
                         download(cpu(), out_cpu)),
            6e-3);
  // forward with a residual in the epilogue: out = x · wᵀ + bias + residual, against the CPU's
  // product plus the residual (the GPU rounds the sum once; the tolerance is the forward's).
  const std::vector<float> residual = rounded(random_vector(static_cast<size_t>(n * m), 16, -3.0f, 3.0f), DType::bf16);
  Buffer residual_cpu = upload(cpu(), residual, Shape{n, m});
  Buffer residual_gpu = upload(cuda(), residual, Shape{n, m}, DType::bf16);
  cpu().gemm({.role = GemmRole::forward, .a = xr_c.q, .b = wr_c.q, .out = out_cpu, .bias = bias_cpu,
              .residual = residual_cpu});
  cuda().gemm({.role = GemmRole::forward, .a = xr_g.q, .b = wr_g.q, .out = out_gpu, .bias = bias_gpu,
               .residual = residual_gpu});
  EXPECT_LE(report_error("fp8 gemm forward + residual (epilogue)", download(cuda(), out_gpu), download(cpu(), out_cpu)),
            6e-3);
  // dgrad: dx[n, k] = dy · w = dy rowwise with wᵀ (w's columnwise copy)
  Buffer dx_cpu = cpu().allocate("dx", Shape{n, k}, DType::f32, Lifetime::scratch);
  Buffer dx_gpu = cuda().allocate("dx", Shape{n, k}, DType::bf16, Lifetime::scratch);
  cpu().gemm({.role = GemmRole::backward_input, .a = dr_c.q, .b = wc_c.q, .out = dx_cpu});
  cuda().gemm({.role = GemmRole::backward_input, .a = dr_g.q, .b = wc_g.q, .out = dx_gpu});
  EXPECT_LE(report_error("fp8 gemm dgrad e5m2 x e4m3", download(cuda(), dx_gpu), download(cpu(), dx_cpu)), 6e-3);
  // wgrad: dw[m, k] += dyᵀ · x from the two columnwise copies, FP32 accumulation into dw
  const std::vector<float> start = random_vector(static_cast<size_t>(m * k), 15, -1e-3f, 1e-3f);
  Buffer dw_cpu = upload(cpu(), start, Shape{m, k}), dw_gpu = upload(cuda(), start, Shape{m, k});
  cpu().gemm({.role = GemmRole::backward_weight, .a = dc_c.q, .b = xc_c.q, .out = dw_cpu, .accumulate = true});
  cuda().gemm({.role = GemmRole::backward_weight, .a = dc_g.q, .b = xc_g.q, .out = dw_gpu, .accumulate = true});
  EXPECT_LE(report_error("fp8 gemm wgrad e5m2 x e4m3 (f32 accumulate)", download(cuda(), dw_gpu), download(cpu(), dw_cpu)),
            1e-4);
  // Why every copy owns its decode scale: a scale pointer inside a larger array (4-byte aligned).
  Buffer packed = upload(cuda(), {0.0f, 1.0f / 200.0f, 0.0f, 0.0f}, Shape{4});
  QuantizedTensor offset = xr_g.q;
  offset.scale_inverse = packed.tensor().slice_flat(1, Shape{1});
  try {
    cuda().gemm({.role = GemmRole::forward, .a = offset, .b = wr_g.q, .out = out_gpu});
    cuda().synchronize();
    std::printf("[ info ] fp8 gemm with a 4-byte-aligned scale pointer: runs\n");
  } catch (const Error& error) {
    std::printf("[ info ] fp8 gemm with a 4-byte-aligned scale pointer: %s\n", error.what());
  }
}

// ---- whole steps ------------------------------------------------------------------------------

struct Gradients {
  double loss = 0;
  std::vector<std::string> names;
  std::vector<std::vector<float>> values;
  std::vector<bool> block;  // a block's parameter (its gradient block_grads), not the embedding's or head's
};

Gradients step(Backend& backend, const ModelConfig& config, const LinearRecipeOptions& linear,
               const std::string& recompute = "none", DType block_grads = DType::f32) {
  LocalParameterStore store(backend, config, DType::bf16, DType::f32, {}, block_grads);
  store.initialize(11);
  TransformerOptions options;
  options.activation_dtype = DType::bf16;
  options.linear = linear;
  options.recompute = RecomputePolicy::parse(recompute);
  Transformer model(config, options, backend, store);
  const int64_t batch = 2, seq = 64, rows = batch * seq;
  model.check_batch(rows);
  std::vector<int32_t> tokens(static_cast<size_t>(rows)), targets(static_cast<size_t>(rows));
  const std::vector<float> noise = random_vector(static_cast<size_t>(2 * rows), 99, 0.0f, 1.0f);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(noise[i] * static_cast<float>(config.vocab_size)) % config.vocab_size;
    targets[i] = static_cast<int32_t>(noise[rows + i] * static_cast<float>(config.vocab_size)) % config.vocab_size;
  }
  Buffer t = upload_i32(backend, tokens, Shape{rows}, "tokens");
  Buffer y = upload_i32(backend, targets, Shape{rows}, "targets");
  Buffer loss = backend.allocate("loss", Shape{1}, DType::f32, Lifetime::scratch);
  if (linear.format == LinearFormat::fp8_delayed) {
    // Delayed scaling's first pass casts with scale 1 and only fills the amax history; compare
    // the pass after the scale update (no optimizer step in between: the same weights).
    backend.fill(loss, 0);
    model.forward_backward(t, y, batch, seq, 1.0f / static_cast<float>(rows), loss);
    model.linears().finish_step();
    store.zero_grads();
  }
  backend.fill(loss, 0);
  model.forward_backward(t, y, batch, seq, 1.0f / static_cast<float>(rows), loss);
  Gradients result;
  result.loss = backend.read_scalar(loss) / static_cast<double>(rows);
  const ModelLayout& layout = store.layout();
  for (size_t g = 0; g < layout.groups.size(); ++g)
    for (size_t p = 0; p < layout.groups[g].params.size(); ++p) {
      result.names.push_back(layout.groups[g].params[p].name);
      result.values.push_back(download(backend, store.grad(static_cast<int>(g), static_cast<int>(p))));
      result.block.push_back(layout.is_layer_group(static_cast<int>(g)));
    }
  return result;
}

// The tiny Llama, and with biases on q, k and v (Qwen2's model.qkv_bias) and on every linear
// (model.bias): the quantized paths with and without the bias epilogues and bias gradients.
std::vector<std::pair<std::string, ModelConfig>> tiny_llamas() {
  ModelConfig qkv_bias = model_preset("tiny"), bias = model_preset("tiny");
  qkv_bias.qkv_bias = true;
  bias.bias = true;
  return {{"tiny", model_preset("tiny")}, {"tiny qkv_bias", qkv_bias}, {"tiny bias", bias}};
}

TEST_F(CudaQuantize, OneQuantizedStepTracksTheBf16Step) {
  for (const auto& [name, config] : tiny_llamas()) {
    const Gradients reference = step(cuda(), config, LinearRecipeOptions{});
    struct Case {
      LinearFormat format;
      double loss, gradient;
    };
    for (const Case& c : {Case{LinearFormat::mxfp8, 2e-2, 0.25}, Case{LinearFormat::nvfp4, 5e-2, 0.6},
                          Case{LinearFormat::fp8_current, 2e-2, 0.25}, Case{LinearFormat::fp8_delayed, 2e-2, 0.25}}) {
      const std::string what = name + " " + linear_format_name(c.format);
      LinearRecipeOptions linear;
      linear.format = c.format;
      linear.seed = 5;
      const Gradients got = step(cuda(), config, linear);
      std::printf("[ error ] step %s: loss %.6f vs bf16 %.6f\n", what.c_str(), got.loss, reference.loss);
      EXPECT_NEAR(got.loss, reference.loss, c.loss) << what;
      double worst = 0;
      for (size_t i = 0; i < got.values.size(); ++i) {
        const double error = relative_l2_error(got.values[i], reference.values[i]);
        worst = std::max(worst, error);
        EXPECT_LE(error, c.gradient) << what << " " << got.names[i];
      }
      std::printf("[ error ] step %s: worst gradient rel L2 %.3e\n", what.c_str(), worst);
    }
  }
}

// fp8 and fp8-current with BF16 block gradients (precision.grad_dtype = auto on one GPU with one
// micro-batch a step): each block gradient is one FP8 wgrad GEMM's (or a norm's column sum's)
// FP32 accumulation rounded once, so it is the FP32-gradient step's to BF16 rounding; nothing
// else reads it in the backward, so the loss and the embedding's and head's FP32 gradients keep
// their bits.
TEST_F(CudaQuantize, Fp8StepsWithBf16BlockGradientsRoundTheF32Ones) {
  for (const char* preset : {"tiny", "tiny-gpt2"}) {
    const ModelConfig config = model_preset(preset);
    for (LinearFormat format : {LinearFormat::fp8_delayed, LinearFormat::fp8_current}) {
      const std::string what = std::string(preset) + " " + linear_format_name(format);
      LinearRecipeOptions linear;
      linear.format = format;
      const Gradients f32 = step(cuda(), config, linear, "none", DType::f32);
      const Gradients bf16 = step(cuda(), config, linear, "none", DType::bf16);
      EXPECT_EQ(f32.loss, bf16.loss) << what;
      ASSERT_EQ(f32.values.size(), bf16.values.size());
      double worst = 0;
      for (size_t i = 0; i < f32.values.size(); ++i) {
        if (!f32.block[i]) {
          EXPECT_EQ(0, std::memcmp(f32.values[i].data(), bf16.values[i].data(), f32.values[i].size() * sizeof(float)))
              << what << " " << f32.names[i];
          continue;
        }
        const double error = relative_l2_error(bf16.values[i], f32.values[i]);
        worst = std::max(worst, error);
        EXPECT_LE(error, 4e-3) << what << " " << f32.names[i];  // one BF16 rounding: at most 2^-9 an element
      }
      std::printf("[ error ] %s: BF16 block gradients against f32, worst rel L2 %.3e\n", what.c_str(), worst);
    }
  }
}

// A delayed-scaling step with the norms (and a Llama's SwiGLU) fused into the casts gives the
// bits of the step that runs them apart (the scales are known: the second pass after a scale
// update), with the inputs saved (none) and with the norm outputs and the activation recomputed
// in backward (selective, full): RMSNorm on the Llama, LayerNorm with its bias on GPT-2.
TEST_F(CudaQuantize, FusedProducersGiveTheStepsBits) {
  std::vector<std::pair<std::string, ModelConfig>> models = tiny_llamas();
  models.emplace_back("tiny-gpt2", model_preset("tiny-gpt2"));
  for (const auto& [name, config] : models) {
    for (const char* recompute : {"none", "selective", "full"}) {
      const std::string what = name + " " + recompute;
      LinearRecipeOptions linear;
      linear.format = LinearFormat::fp8_delayed;
      linear.fuse_producers = false;
      const Gradients apart = step(cuda(), config, linear, recompute);
      linear.fuse_producers = true;
      const Gradients fused = step(cuda(), config, linear, recompute);
      EXPECT_EQ(apart.loss, fused.loss) << what;
      ASSERT_EQ(apart.values.size(), fused.values.size());
      for (size_t i = 0; i < apart.values.size(); ++i)
        EXPECT_EQ(0, std::memcmp(apart.values[i].data(), fused.values[i].data(), apart.values[i].size() * sizeof(float)))
            << what << " " << apart.names[i];
    }
  }
}

TEST_F(CudaQuantize, StartupLinesSayHowTheGpuRunsEachRecipe) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = {{"train.precision", "mxfp8"}, {"precision.amax_history_len", "32"}};
  RunConfig config = load_config(sources);
  const bool hopper = cuda().properties().compute_capability < 100;
  const std::string mx = resolve_precision(config, cuda()).startup_line;
  std::printf("[ info ] %s\n", mx.c_str());
  EXPECT_EQ(mx.rfind("MXFP8 enabled (block 32, E8M0 scales", 0), 0u) << mx;
  if (hopper) EXPECT_NE(mx.find("emulated on sm_90"), std::string::npos) << mx;
  config.train.precision = "fp8";
  const std::string fp8 = resolve_precision(config, cuda()).startup_line;
  std::printf("[ info ] %s\n", fp8.c_str());
  EXPECT_EQ(fp8.rfind("Using FP8 recipe: DelayedScaling(format=HYBRID, amax_history_len=32, amax_compute_algo=max, "
                      "margin=0); FP8 GEMMs through cuBLASLt",
                      0),
            0u)
      << fp8;
}

TEST_F(CudaQuantize, Fp16StepsScaleTheLossAndSkipOnOverflow) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = {{"train.precision", "fp16"}, {"train.seq_len", "64"}, {"train.micro_batch_size", "2"},
                       {"train.device", "cuda"}};
  RunConfig config = load_config(sources);
  std::vector<int32_t> tokens(128), targets(128);
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>(i * 7 % 256);
    targets[i] = static_cast<int32_t>(i * 11 % 256);
  }
  const std::vector<TokenBatch> batch(1, TokenBatch{tokens.data(), targets.data(), 2, 64});
  for (double initial : {65536.0, 4294967296.0}) {
    config.precision.loss_scale_init = initial;
    const PrecisionPlan plan = resolve_precision(config, cuda());
    TrainingSession session(config, cuda(), plan, make_parameter_store(cuda(), config, plan, nullptr, 1));
    const StepResult first = session.step(batch, 128, 1e-3, 1);
    const StepResult second = session.step(batch, 128, 1e-3, 2);
    std::printf("[ info ] fp16 initial scale %g: loss %.4f / %.4f, scale %g / %g, skipped %d / %d\n", initial, first.loss,
                second.loss, first.loss_scale, second.loss_scale, first.skipped, second.skipped);
    EXPECT_TRUE(std::isfinite(first.loss));
    if (initial == 65536.0) {
      EXPECT_FALSE(first.skipped);
      EXPECT_EQ(second.loss_scale, 65536.0);
      EXPECT_LT(second.loss, first.loss);
    } else {
      // 2^32 / 128 tokens overflows FP16's 65504 in the logits' gradient: skip and back off.
      EXPECT_TRUE(first.skipped);
      EXPECT_EQ(second.loss_scale, initial / 2);
    }
  }
}

}  // namespace
}  // namespace mxtrain::test
