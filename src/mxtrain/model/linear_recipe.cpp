#include "mxtrain/model/linear_recipe.hpp"

#include <algorithm>
#include <cmath>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/fp8.hpp"

namespace mxtrain {

const char* linear_format_name(LinearFormat format) {
  switch (format) {
    case LinearFormat::high_precision: return "high precision";
    case LinearFormat::fp8_delayed: return "fp8 (delayed scaling)";
    case LinearFormat::fp8_current: return "fp8 (current scaling)";
    case LinearFormat::mxfp8: return "mxfp8";
    case LinearFormat::nvfp4: return "nvfp4";
  }
  return "?";
}

const char* linear_kind_name(LinearKind kind) {
  switch (kind) {
    case LinearKind::qkv: return "attn.qkv";
    case LinearKind::out: return "attn.out";
    case LinearKind::up: return "mlp.up";
    case LinearKind::down: return "mlp.down";
  }
  return "?";
}

bool LinearRecipeOptions::quantized(int64_t layer, int64_t layers) const {
  return format != LinearFormat::high_precision && layer >= bf16_first_layers && layer < layers - bf16_last_layers;
}

std::string precision_label(DType dtype) {
  switch (dtype) {
    case DType::bf16: return "BF16";
    case DType::f16: return "FP16";
    default: return "FP32";
  }
}

namespace {

bool per_tensor(LinearFormat format) {
  return format == LinearFormat::fp8_delayed || format == LinearFormat::fp8_current;
}

// The dtype supports() is asked with for the quantized GEMM and the quantizer (backend.hpp).
DType format_dtype(LinearFormat format) {
  switch (format) {
    case LinearFormat::mxfp8: return DType::e8m0;
    case LinearFormat::nvfp4: return DType::e2m1;
    default: return DType::e4m3;
  }
}

bool hybrid(const LinearRecipeOptions& options) {
  if (options.fp8_formats == Fp8Formats::automatic) return per_tensor(options.format);
  return options.fp8_formats == Fp8Formats::hybrid;
}

bool runs_native(const LinearRecipeOptions& options, const Backend& backend) {
  return options.allow_native && backend.supports(OpKind::linear_forward, format_dtype(options.format));
}

std::string where_it_runs(const LinearRecipeOptions& options, const Backend& backend, DType activation) {
  const bool native = runs_native(options, backend);
  const std::string compute = precision_label(activation);
  const DeviceProperties props = backend.properties();
  std::string device = strf("sm_%d", props.compute_capability);
  if (backend.device() == Device::cpu) device = "the cpu";
  if (backend.device() == Device::none) device = "the simulated GPU";
  if (!native)
    return "emulated on " + device + ": quantize, dequantize, " + compute + " GEMM";
  if (backend.device() == Device::cpu) return "quantized GEMMs computed on the cpu as FP32 products of the dequantized operands";
  if (per_tensor(options.format))
    return "FP8 GEMMs through cuBLASLt on " + device +
           " (TN; fast accumulation in the forward GEMM, split accumulation in dgrad and wgrad)";
  return "native cuBLASLt block-scaled GEMMs on " + device +
         " (compiled, not yet run on Blackwell hardware before this release)";
}

}  // namespace

std::string describe_linear_recipe(const LinearRecipeOptions& options, const Backend& backend, int64_t layers,
                                   DType activation) {
  const std::string formats = hybrid(options) ? "HYBRID" : "E4M3";
  std::string head;
  switch (options.format) {
    case LinearFormat::high_precision: return "";
    case LinearFormat::fp8_delayed:
      head = strf("Using FP8 recipe: DelayedScaling(format=%s, amax_history_len=%d, amax_compute_algo=%s, margin=%d)",
                  formats.c_str(), options.amax_history_length,
                  options.amax_algorithm == numerics::AmaxAlgorithm::max ? "max" : "most_recent", options.margin);
      break;
    case LinearFormat::fp8_current:
      head = strf("Using FP8 recipe: Float8CurrentScaling(format=%s)", formats.c_str());
      break;
    case LinearFormat::mxfp8:
      head = strf("MXFP8 enabled (block 32, E8M0 scales, %s rounding, %s elements", options.mx_round_up ? "RCEIL" : "OCP floor",
                  formats == "HYBRID" ? "E4M3 forward / E5M2 gradient" : "E4M3");
      break;
    case LinearFormat::nvfp4:
      head = strf("NVFP4 enabled (E2M1, block 16, E4M3 scales and an FP32 tensor scale, %s weights%s%s",
                  options.nvfp4_weight_tiles ? "16x16-tile" : "1x16-block",
                  options.nvfp4_hadamard ? ", RHT on the wgrad operands" : "",
                  options.nvfp4_stochastic_rounding ? ", stochastic rounding of gradients" : "");
      break;
  }
  const std::string where = where_it_runs(options, backend, activation);
  if (per_tensor(options.format)) head += "; " + where;
  else head += ", " + where + ")";
  int64_t quantized = 0;
  for (int64_t l = 0; l < layers; ++l) quantized += options.quantized(l, layers) ? 1 : 0;
  head += strf("; %lld of %lld blocks quantized", static_cast<long long>(quantized), static_cast<long long>(layers));
  if (options.bf16_first_layers > 0 || options.bf16_last_layers > 0)
    head += strf(" (first %lld and last %lld in %s)", static_cast<long long>(options.bf16_first_layers),
                 static_cast<long long>(options.bf16_last_layers), precision_label(activation).c_str());
  head += "; embeddings, head, attention and norms stay in " + precision_label(activation);
  return head;
}

// ---- the recipe ------------------------------------------------------------------------------------

struct LinearRecipe::Operand {
  Buffer row_data, row_scales, row_amax, col_data, col_scales, col_amax;
  QuantizedTensor rowwise, columnwise;
};

struct LinearRecipe::GradientStash {
  int64_t linear = -1;
  const void* source = nullptr;  // the gradient tensor the copy was made from
  Operand operand;
};

LinearRecipe::LinearRecipe(const LinearRecipeOptions& options, Backend& backend, int64_t layers)
    : options_(options), backend_(backend), layers_(layers) {
  MXTRAIN_REQUIRE(options.bf16_first_layers >= 0 && options.bf16_last_layers >= 0 &&
                      options.bf16_first_layers + options.bf16_last_layers <= layers,
                  config,
                  strf("precision.bf16_first_layers = %lld and bf16_last_layers = %lld, but the model has %lld layers",
                       static_cast<long long>(options.bf16_first_layers),
                       static_cast<long long>(options.bf16_last_layers), static_cast<long long>(layers)),
                  "keep first + last at most model.layers");
  if (options.format == LinearFormat::high_precision) return;
  if (options.format == LinearFormat::nvfp4) {
    forward_element_ = gradient_element_ = DType::e2m1;
  } else {
    forward_element_ = DType::e4m3;
    gradient_element_ = hybrid(options) ? DType::e5m2 : DType::e4m3;
  }
  native_ = runs_native(options, backend);
  const DType format = per_tensor(options.format) ? forward_element_ : format_dtype(options.format);
  std::vector<OpKind> needed{OpKind::amax, OpKind::quantize};
  if (!native_) needed.push_back(OpKind::dequantize);
  for (OpKind kind : needed) {
    if (!backend.supports(kind, format))
      throw Error(ErrorKind::unsupported,
                  strf("the %s backend has no %s op for %s tensors, which the %s recipe needs",
                       std::string(backend.name()).c_str(), op_kind_name(kind),
                       std::string(dtype_name(format)).c_str(), linear_format_name(options.format)),
                  "choose a precision this backend runs (train.precision = bf16 or fp32), or another backend");
  }
  const int64_t linears = layers * kLinearKinds;
  if (per_tensor(options.format)) saved_inputs_.resize(static_cast<size_t>(linears));
  if (options.format == LinearFormat::fp8_delayed) {
    MXTRAIN_REQUIRE(options.amax_history_length >= 1, config,
                    strf("precision.amax_history_len is %d; it must be at least 1", options.amax_history_length),
                    "set precision.amax_history_len to a positive count (TransformerEngine's default is 1024)");
    const int64_t length = options.amax_history_length;
    forward_history_ = backend.allocate("fp8.forward.amax_history", Shape{length, 2 * linears}, DType::f32,
                                        Lifetime::parameter);
    forward_scale_ = backend.allocate("fp8.forward.scale", Shape{2 * linears}, DType::f32, Lifetime::parameter);
    forward_scale_inverse_ =
        backend.allocate("fp8.forward.scale_inverse", Shape{2 * linears}, DType::f32, Lifetime::parameter);
    backward_history_ = backend.allocate("fp8.backward.amax_history", Shape{length, linears}, DType::f32,
                                         Lifetime::parameter);
    backward_scale_ = backend.allocate("fp8.backward.scale", Shape{linears}, DType::f32, Lifetime::parameter);
    backward_scale_inverse_ =
        backend.allocate("fp8.backward.scale_inverse", Shape{linears}, DType::f32, Lifetime::parameter);
    // §2.1: the history starts at zeros and every scale at 1.
    backend.fill(forward_history_, 0.0f);
    backend.fill(backward_history_, 0.0f);
    for (const Buffer* one : {&forward_scale_, &forward_scale_inverse_, &backward_scale_, &backward_scale_inverse_})
      backend.fill(*one, 1.0f);
  }
  if (options.format == LinearFormat::fp8_current) {
    current_amax_ = backend.allocate("fp8.current.amax", Shape{1, 3 * linears}, DType::f32, Lifetime::parameter);
    current_scale_ = backend.allocate("fp8.current.scale", Shape{3 * linears}, DType::f32, Lifetime::parameter);
    current_source_.assign(static_cast<size_t>(3 * linears), Tensor());
    recorded_amax_.assign(static_cast<size_t>(3 * linears), nullptr);
  }
}

LinearRecipe::~LinearRecipe() = default;

std::string LinearRecipe::name_of(int64_t layer, LinearKind kind) const {
  return "layers." + std::to_string(layer) + "." + linear_kind_name(kind);
}

void LinearRecipe::check_shapes(int64_t rows, int64_t in_features, int64_t out_features, LinearKind kind) const {
  if (options_.format == LinearFormat::high_precision) return;
  // Block formats need whole blocks along every contracted dimension (tokens included, for the
  // weight gradient); cuBLASLt's FP8 GEMMs need multiples of 16.
  int64_t multiple = 0;
  if (options_.format == LinearFormat::mxfp8) multiple = 32;
  if (options_.format == LinearFormat::nvfp4 || native_) multiple = std::max<int64_t>(multiple, 16);
  if (multiple == 0) return;
  if (rows % multiple == 0 && in_features % multiple == 0 && out_features % multiple == 0) return;
  throw Error(ErrorKind::unsupported,
              strf("%s linear layers need every GEMM dimension divisible by %lld, but %s has %lld tokens per "
                   "micro-batch, %lld inputs and %lld outputs",
                   linear_format_name(options_.format), static_cast<long long>(multiple), linear_kind_name(kind),
                   static_cast<long long>(rows), static_cast<long long>(in_features),
                   static_cast<long long>(out_features)),
              strf("choose train.micro_batch_size x train.seq_len and the model's hidden/FFN sizes as multiples of "
                   "%lld, or use precision bf16",
                   static_cast<long long>(multiple)));
}

QuantizeSpec LinearRecipe::spec_for(Role role, bool columnwise) {
  QuantizeSpec spec;
  spec.element = role == Role::gradient ? gradient_element_ : forward_element_;
  spec.swizzled_scales = native_ && !per_tensor(options_.format);
  switch (options_.format) {
    case LinearFormat::fp8_delayed:
    case LinearFormat::fp8_current:
    case LinearFormat::high_precision: spec.mode = ScalingMode::per_tensor; break;
    case LinearFormat::mxfp8:
      spec.mode = ScalingMode::mxfp8;
      spec.mx_round_up = options_.mx_round_up;
      break;
    case LinearFormat::nvfp4:
      // §2.5: weights in 16x16 tiles; the RHT on the columnwise (wgrad) copies of inputs and
      // gradients; stochastic rounding of gradients.
      spec.mode = ScalingMode::nvfp4;
      spec.nvfp4_tiles = role == Role::weight && options_.nvfp4_weight_tiles;
      spec.hadamard = columnwise && role != Role::weight && options_.nvfp4_hadamard;
      spec.stochastic_rounding = role == Role::gradient && options_.nvfp4_stochastic_rounding;
      spec.seed = options_.seed;
      if (spec.stochastic_rounding) spec.offset = stochastic_streams_++;
      break;
  }
  return spec;
}

void LinearRecipe::per_tensor_scales(const Tensor& x, int64_t linear, Role role, bool reuse_scale, Tensor* scale,
                                     Tensor* amax_record, ScaleFromAmax* from) {
  if (options_.format == LinearFormat::fp8_delayed) {
    // This step's scale (from the history up to the last step); the cast records its amax in
    // history slot 0, which is the first row of the slot-major history.
    const bool forward = role != Role::gradient;
    const int64_t index = forward ? 2 * linear + (role == Role::weight ? 1 : 0) : linear;
    *scale = (forward ? forward_scale_ : backward_scale_).tensor().slice_flat(index, Shape{1});
    *amax_record = (forward ? forward_history_ : backward_history_).tensor().slice_flat(index, Shape{1});
    return;
  }
  // Current scaling: this tensor's amax, then its scale, before the cast (§2.2); the cast forms
  // the scale from the amax itself (ScaleFromAmax) and stores it for a reuse.
  const int64_t index = 3 * linear + static_cast<int64_t>(role);
  const Tensor amax = current_amax_.tensor().slice_flat(index, Shape{1, 1});
  *scale = current_scale_.tensor().slice_flat(index, Shape{1});
  *amax_record = Tensor();
  Tensor& source = current_source_[static_cast<size_t>(index)];
  if (reuse_scale && source.defined() && source.data == x.data) return;
  source = role == Role::gradient ? Tensor() : x;
  // The kernel that wrote x may have recorded its amax in this slot already (amax_record).
  const void*& recorded = recorded_amax_[static_cast<size_t>(index)];
  if (recorded != x.data) backend_.amax(x, amax, false);
  recorded = nullptr;
  from->amax = amax;
  from->args.rule = ScaleUpdateArgs::Rule::current;
  from->args.scaled_max =
      role == Role::gradient && gradient_element_ == DType::e5m2 ? numerics::kE5m2Max : numerics::kE4m3Max;
}

LinearRecipe::Operand LinearRecipe::quantize(const Tensor& x, int64_t linear, Role role, bool rowwise,
                                             bool columnwise, const std::string& name, bool reuse_scale,
                                             Lifetime columnwise_lifetime) {
  Operand operand;
  Tensor scale, amax_record;
  ScaleFromAmax from;
  const bool tensor_scaled = per_tensor(options_.format);
  if (tensor_scaled) per_tensor_scales(x, linear, role, reuse_scale, &scale, &amax_record, &from);
  auto make = [&](bool transposed, Buffer& data, Buffer& scales, Buffer& amax, QuantizedTensor& q) {
    q.spec = spec_for(role, transposed);
    q.transposed = transposed;
    const int64_t rows = transposed ? x.cols() : x.rows(), k = transposed ? x.rows() : x.cols();
    const std::string copy = name + (transposed ? ".columnwise" : ".rowwise");
    const Lifetime lifetime = transposed ? columnwise_lifetime : Lifetime::scratch;
    data = backend_.allocate(copy, Shape{rows, k}, q.spec.element, lifetime);
    q.data = data;
    scales = backend_.allocate(copy + ".scale_inverse", block_scale_shape(q.spec, rows, k),
                               block_scale_dtype(q.spec.mode), lifetime);
    q.scale_inverse = scales;
    if (q.spec.mode != ScalingMode::nvfp4) return;
    // The global NVFP4 scale comes from the amax of the matrix this copy quantizes (after its
    // RHT); copies without an RHT share the tensor's own amax.
    if (transposed && !q.spec.hadamard && operand.row_amax.defined()) {
      q.amax = operand.row_amax;
      return;
    }
    amax = backend_.allocate(copy + ".amax", Shape{1}, DType::f32, Lifetime::scratch);
    backend_.amax(x, amax, false, transposed && q.spec.hadamard);
    q.amax = amax;
  };
  if (rowwise) make(false, operand.row_data, operand.row_scales, operand.row_amax, operand.rowwise);
  if (columnwise) make(true, operand.col_data, operand.col_scales, operand.col_amax, operand.columnwise);
  backend_.quantize(x, scale, operand.rowwise, operand.columnwise, amax_record, from);
  return operand;
}

Buffer LinearRecipe::dequantized(const QuantizedTensor& q, DType dtype, const std::string& name) {
  const Shape shape = q.transposed ? Shape{q.k(), q.rows()} : Shape{q.rows(), q.k()};
  Buffer values = backend_.allocate(name, shape, dtype, Lifetime::scratch);
  backend_.dequantize(q, values);
  return values;
}

Tensor LinearRecipe::bias_as(const Tensor& bias, DType dtype, Buffer& storage) {
  if (!bias.defined() || bias.dtype == dtype) return bias;
  // quantized_weights hands over FP32 master biases; GEMM epilogues take the output's dtype.
  storage = backend_.allocate("linear.bias_converted", bias.shape, dtype, Lifetime::scratch);
  backend_.copy(bias, storage);
  return storage;
}

Tensor LinearRecipe::amax_record(int64_t layer, LinearKind kind, bool gradient, const Tensor& x) {
  if (!options_.producer_amaxes || options_.format != LinearFormat::fp8_current || !quantized(layer) ||
      !x.defined())
    return Tensor();
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  const int64_t index = 3 * linear + static_cast<int64_t>(gradient ? Role::gradient : Role::input);
  recorded_amax_[static_cast<size_t>(index)] = x.data;
  return current_amax_.tensor().slice_flat(index, Shape{1});
}

std::vector<LinearRecipe::WeightAmax> LinearRecipe::weight_amaxes() {
  std::vector<WeightAmax> weights;
  if (!options_.producer_amaxes || options_.format != LinearFormat::fp8_current) return weights;
  for (int64_t linear = 0; 3 * linear < static_cast<int64_t>(current_source_.size()); ++linear) {
    const int64_t index = 3 * linear + static_cast<int64_t>(Role::weight);
    const Tensor& weight = current_source_[static_cast<size_t>(index)];
    if (weight.defined()) weights.push_back({linear, weight, current_amax_.tensor().slice_flat(index, Shape{1})});
  }
  if (weights.empty()) return weights;
  // Every amax of this step has been taken by its cast: one fill zeroes the records to come.
  backend_.fill(current_amax_, 0.0f);
  std::fill(recorded_amax_.begin(), recorded_amax_.end(), nullptr);
  return weights;
}

void LinearRecipe::weight_amax_recorded(const WeightAmax& weight) {
  const int64_t index = 3 * weight.linear + static_cast<int64_t>(Role::weight);
  recorded_amax_[static_cast<size_t>(index)] = weight.weight.data;
}

bool LinearRecipe::saves_inputs(int64_t layer) const {
  return quantized(layer) && per_tensor(options_.format);
}

bool LinearRecipe::has_saved_input(int64_t layer, LinearKind kind) const {
  const size_t linear = static_cast<size_t>(layer * kLinearKinds + static_cast<int64_t>(kind));
  return linear < saved_inputs_.size() && saved_inputs_[linear] != nullptr;
}

void LinearRecipe::forward(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& out, bool save_input) {
  if (!quantized(layer)) {
    MXTRAIN_ASSERT(!save_input, "forward: layer %lld keeps no quantized input", static_cast<long long>(layer));
    backend_.gemm({.role = GemmRole::forward, .a = x, .b = weight, .out = out, .bias = bias});
    return;
  }
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  const std::string name = name_of(layer, kind);
  Buffer bias_storage;
  const Tensor b = bias_as(bias, out.dtype, bias_storage);
  MXTRAIN_ASSERT(!save_input || saves_inputs(layer), "forward: layer %lld keeps no quantized input",
                 static_cast<long long>(layer));
  Operand xq = quantize(x, linear, Role::input, true, save_input, name + ".input", false, Lifetime::activation);
  if (save_input) {
    auto saved = std::make_unique<Operand>();
    saved->col_data = std::move(xq.col_data);
    saved->col_scales = std::move(xq.col_scales);
    saved->col_amax = std::move(xq.col_amax);
    saved->columnwise = xq.columnwise;
    xq.columnwise = QuantizedTensor{};
    saved_inputs_[static_cast<size_t>(linear)] = std::move(saved);
  }
  Operand wq = quantize(weight, linear, Role::weight, true, false, name + ".weight", true);
  if (native_) {
    backend_.gemm({.role = GemmRole::forward, .a = xq.rowwise, .b = wq.rowwise, .out = out, .bias = b});
    return;
  }
  Buffer xd = dequantized(xq.rowwise, out.dtype, name + ".input.dequantized");
  xq = Operand{};
  Buffer wd = dequantized(wq.rowwise, out.dtype, name + ".weight.dequantized");
  wq = Operand{};
  backend_.gemm({.role = GemmRole::forward, .a = xd, .b = wd, .out = out, .bias = b});
}

void LinearRecipe::backward_weight(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& x,
                                   const Tensor& dweight, const Tensor& dbias, bool accumulate) {
  if (!quantized(layer)) {
    backend_.gemm({.role = GemmRole::backward_weight, .a = dout, .b = x, .out = dweight, .accumulate = accumulate,
                   .bias_gradient = dbias});
    return;
  }
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  const std::string name = name_of(layer, kind);
  // Both copies of the gradient in one pass; the rowwise one waits for backward_input.
  Operand dq = quantize(dout, linear, Role::gradient, true, true, name + ".grad");
  {
    Operand xq;
    if (has_saved_input(layer, kind)) {
      std::unique_ptr<Operand>& saved = saved_inputs_[static_cast<size_t>(linear)];
      xq = std::move(*saved);
      saved.reset();
    } else {
      xq = quantize(x, linear, Role::input, false, true, name + ".input", true);
    }
    if (native_) {
      backend_.gemm({.role = GemmRole::backward_weight, .a = dq.columnwise, .b = xq.columnwise, .out = dweight,
                     .accumulate = accumulate});
    } else {
      Buffer dd = dequantized(dq.columnwise, dout.dtype, name + ".grad.dequantized");
      Buffer xd = dequantized(xq.columnwise, dout.dtype, name + ".input.dequantized");
      xq = Operand{};
      backend_.gemm({.role = GemmRole::backward_weight, .a = dd, .b = xd, .out = dweight, .accumulate = accumulate});
    }
  }
  // The bias gradient from the high-precision gradient, as TE does.
  if (dbias.defined()) backend_.column_sum(dout, dbias, accumulate);
  dq.col_data.reset();
  dq.col_scales.reset();
  dq.col_amax.reset();
  dq.columnwise = QuantizedTensor{};
  stash_ = std::make_unique<GradientStash>();
  stash_->linear = linear;
  stash_->source = dout.data;
  stash_->operand = std::move(dq);
}

void LinearRecipe::backward_input(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& weight,
                                  const Tensor& dx, bool accumulate) {
  if (!quantized(layer)) {
    backend_.gemm({.role = GemmRole::backward_input, .a = dout, .b = weight, .out = dx, .accumulate = accumulate});
    return;
  }
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  const std::string name = name_of(layer, kind);
  Operand dq;
  if (stash_ && stash_->linear == linear && stash_->source == dout.data) dq = std::move(stash_->operand);
  else dq = quantize(dout, linear, Role::gradient, true, false, name + ".grad");
  stash_.reset();
  Operand wq = quantize(weight, linear, Role::weight, false, true, name + ".weight", true);
  if (native_) {
    backend_.gemm({.role = GemmRole::backward_input, .a = dq.rowwise, .b = wq.columnwise, .out = dx,
                   .accumulate = accumulate});
    return;
  }
  Buffer dd = dequantized(dq.rowwise, dout.dtype, name + ".grad.dequantized");
  dq = Operand{};
  Buffer wd = dequantized(wq.columnwise, dout.dtype, name + ".weight.dequantized");
  wq = Operand{};
  backend_.gemm({.role = GemmRole::backward_input, .a = dd, .b = wd, .out = dx, .accumulate = accumulate});
}

void LinearRecipe::forward_residual(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight,
                                    const Tensor& bias, const Tensor& residual, const Tensor& out, bool save_input) {
  if (!quantized(layer)) {
    MXTRAIN_ASSERT(!save_input, "forward_residual: layer %lld keeps no quantized input", static_cast<long long>(layer));
    backend_.gemm({.role = GemmRole::forward, .a = x, .b = weight, .out = out, .bias = bias, .residual = residual});
    return;
  }
  forward(layer, kind, x, weight, bias, out, save_input);
  backend_.add(out, residual, out);
}

void LinearRecipe::forward_gelu(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight,
                                const Tensor& bias, const Tensor& pre, const Tensor& out, const Tensor& out_amax) {
  if (!quantized(layer) && !out_amax.defined()) {
    backend_.gemm({.role = GemmRole::forward, .a = x, .b = weight, .out = out, .epilogue = GemmEpilogue::gelu_aux_bias,
                   .bias = bias, .aux = pre});
    return;
  }
  forward(layer, kind, x, weight, bias, pre);
  backend_.gelu_forward(pre, out, out_amax);
}

void LinearRecipe::backward_input_gelu(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& weight,
                                       const Tensor& pre, const Tensor& dx, const Tensor& dx_amax) {
  if (!quantized(layer) && !dx_amax.defined()) {
    backend_.gemm({.role = GemmRole::backward_input, .a = dout, .b = weight, .out = dx,
                   .epilogue = GemmEpilogue::dgelu, .aux = pre});
    return;
  }
  Buffer product = backend_.allocate(name_of(layer, kind) + ".input_grad", dx.shape, dx.dtype, Lifetime::scratch);
  backward_input(layer, kind, dout, weight, product, false);
  backend_.gelu_backward(product, pre, dx, dx_amax);
}

void LinearRecipe::finish_step() {
  stash_.reset();
  for (std::unique_ptr<Operand>& saved : saved_inputs_) saved.reset();
  // The optimizer has changed the weights: their current scales are stale.
  for (size_t i = 1; i < current_source_.size(); i += 3) current_source_[i] = Tensor();
  if (options_.format == LinearFormat::fp8_delayed) {
    ScaleUpdateArgs args;
    args.rule = ScaleUpdateArgs::Rule::delayed;
    args.most_recent = options_.amax_algorithm == numerics::AmaxAlgorithm::most_recent;
    args.scaled_max = std::ldexp(numerics::kE4m3Max, -options_.margin);
    backend_.fp8_scale_update(forward_history_, forward_scale_, forward_scale_inverse_, args);
    args.scaled_max =
        std::ldexp(gradient_element_ == DType::e5m2 ? numerics::kE5m2Max : numerics::kE4m3Max, -options_.margin);
    backend_.fp8_scale_update(backward_history_, backward_scale_, backward_scale_inverse_, args);
  }
  ++steps_;
}

}  // namespace mxtrain
