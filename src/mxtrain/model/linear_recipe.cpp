#include "mxtrain/model/linear_recipe.hpp"

#include <algorithm>
#include <cmath>

#include "mxtrain/core/error.hpp"

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
  // Only Hopper (an H200) has run mxtrain: on sm_100 and later these paths are compiled, not measured.
  const std::string unmeasured =
      props.compute_capability >= 100 ? "; compiled, never run on Blackwell hardware: unmeasured" : "";
  if (per_tensor(options.format))
    return "FP8 GEMMs through cuBLASLt on " + device +
           " (TN; fast accumulation in the forward GEMM, split accumulation in dgrad and wgrad" + unmeasured + ")";
  return "native cuBLASLt block-scaled GEMMs on " + device + " (compiled, never run on Blackwell hardware: unmeasured)";
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

struct LinearRecipe::GradientStash {
  int64_t linear = -1;
  const void* source = nullptr;  // the gradient tensor the copy was made from
  Operand operand;
};

namespace {

// The one place a format becomes its quantizer.
std::unique_ptr<Quantizer> make_quantizer(const LinearRecipeOptions& options, Backend& backend, int64_t linears,
                                          bool native) {
  const DType gradient_element = hybrid(options) ? DType::e5m2 : DType::e4m3;
  switch (options.format) {
    case LinearFormat::high_precision: return nullptr;
    case LinearFormat::fp8_delayed:
      return std::make_unique<Fp8DelayedQuantizer>(backend, linears, gradient_element, options.amax_history_length,
                                                   options.amax_algorithm, options.margin);
    case LinearFormat::fp8_current:
      return std::make_unique<Fp8CurrentQuantizer>(backend, linears, gradient_element, options.producer_amaxes);
    case LinearFormat::mxfp8:
      return std::make_unique<Mxfp8Quantizer>(backend, gradient_element, options.mx_round_up, native);
    case LinearFormat::nvfp4: {
      Nvfp4Quantizer::Options nvfp4;
      nvfp4.hadamard = options.nvfp4_hadamard;
      nvfp4.stochastic_rounding = options.nvfp4_stochastic_rounding;
      nvfp4.weight_tiles = options.nvfp4_weight_tiles;
      nvfp4.seed = options.seed;
      nvfp4.swizzled_scales = native;
      return std::make_unique<Nvfp4Quantizer>(backend, nvfp4);
    }
  }
  return nullptr;
}

QuantizedRole input_or_gradient(bool gradient) { return gradient ? QuantizedRole::gradient : QuantizedRole::input; }

const Tensor kUndefined;

}  // namespace

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
  native_ = runs_native(options, backend);
  const DType format = format_dtype(options.format);
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
  quantizer_ = make_quantizer(options, backend, linears, native_);
  if (quantizer_->per_tensor()) saved_inputs_.resize(static_cast<size_t>(linears));
}

LinearRecipe::~LinearRecipe() = default;

std::string LinearRecipe::name_of(int64_t layer, LinearKind kind) const {
  return "layers." + std::to_string(layer) + "." + linear_kind_name(kind);
}

void LinearRecipe::check_shapes(int64_t rows, int64_t in_features, int64_t out_features, LinearKind kind) const {
  if (!quantizer_) return;
  // Block formats need whole blocks along every contracted dimension (tokens included, for the
  // weight gradient); cuBLASLt's FP8 GEMMs need multiples of 16.
  const int64_t multiple = std::max<int64_t>(quantizer_->block_multiple(), native_ ? 16 : 0);
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

LinearRecipe::Operand LinearRecipe::quantize(const Tensor& x, int64_t linear, QuantizedRole role, bool rowwise,
                                             bool columnwise, const std::string& name, bool reuse_scale,
                                             Lifetime columnwise_lifetime, const CastProducer& producer) {
  return quantizer_->quantize(x, {.linear = linear,
                                  .role = role,
                                  .rowwise = rowwise,
                                  .columnwise = columnwise,
                                  .name = name,
                                  .reuse_scale = reuse_scale,
                                  .columnwise_lifetime = columnwise_lifetime,
                                  .producer = producer});
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
  if (!quantized(layer) || !x.defined()) return Tensor();
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  return quantizer_->amax_record(linear, input_or_gradient(gradient), x);
}

std::vector<LinearRecipe::WeightAmax> LinearRecipe::weight_amaxes() {
  return quantizer_ ? quantizer_->weight_amaxes() : std::vector<WeightAmax>();
}

void LinearRecipe::weight_amax_recorded(const WeightAmax& weight) {
  if (quantizer_) quantizer_->weight_amax_recorded(weight);
}

std::vector<LinearRecipe::WeightCast> LinearRecipe::weight_casts() {
  if (!quantizer_ || !options_.optimizer_weight_casts || weight_casts_stopped_) return {};
  return quantizer_->weight_casts();
}

void LinearRecipe::prepare_weight_cast(WeightCast& cast) {
  if (quantizer_) quantizer_->prepare_weight_cast(cast);
}

void LinearRecipe::weight_cast_written(WeightCast&& cast) {
  if (quantizer_) quantizer_->weight_cast_written(std::move(cast));
}

void LinearRecipe::stop_weight_casts() {
  weight_casts_stopped_ = true;
  if (quantizer_) quantizer_->drop_weight_casts();
}

bool LinearRecipe::saves_inputs(int64_t layer) const { return quantized(layer) && quantizer_->per_tensor(); }

bool LinearRecipe::has_saved_input(int64_t layer, LinearKind kind) const {
  const size_t linear = static_cast<size_t>(layer * kLinearKinds + static_cast<int64_t>(kind));
  return linear < saved_inputs_.size() && saved_inputs_[linear] != nullptr;
}

bool LinearRecipe::fuses_producers(int64_t layer) const {
  return options_.fuse_producers && quantized(layer) && quantizer_->fuses_producers();
}

void LinearRecipe::produce_input_copy(int64_t layer, LinearKind kind, const Tensor& x, CastProducer& producer) {
  MXTRAIN_ASSERT(fuses_producers(layer) && !has_saved_input(layer, kind),
                 "produce_input_copy: layer %lld's casts take no fused producer, or its input is saved already",
                 static_cast<long long>(layer));
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  // The request backward_weight's cast of the input makes (columnwise only).
  Operand operand = quantizer_->copies_for_producer(x,
                                                    {.linear = linear,
                                                     .role = QuantizedRole::input,
                                                     .columnwise = true,
                                                     .name = name_of(layer, kind) + ".input",
                                                     .reuse_scale = true},
                                                    &producer.act_scale, &producer.act_amax);
  producer.act_columnwise = operand.columnwise;
  saved_inputs_[static_cast<size_t>(linear)] = std::make_unique<Operand>(std::move(operand));
}

namespace {

// What identifies the tensor a gradient stash was cast from: a produced gradient has no data of
// its own, so its producer's inputs name it.
const void* source_of(const Tensor& x, const CastProducer& producer) {
  if (!producer.defined()) return x.data;
  if (producer.dout.defined()) return producer.dout.data;
  return producer.gate_up.defined() ? producer.gate_up.data : producer.input.data;
}

}  // namespace

void LinearRecipe::gemm(int64_t layer, LinearKind kind, const GemmArgs& args, const LinearGemmOptions& options) {
  MXTRAIN_ASSERT(!args.a.is_quantized() && !args.b.is_quantized(),
                 "LinearRecipe::gemm takes high-precision operands; it quantizes them itself");
  MXTRAIN_ASSERT(!options.save_input || (args.role == GemmRole::forward && args.epilogue == GemmEpilogue::none),
                 "LinearRecipe::gemm: only a forward without GELU saves its input");
  MXTRAIN_ASSERT(!options.out_amax.defined() || args.epilogue != GemmEpilogue::none,
                 "LinearRecipe::gemm: an out_amax is recorded by a GELU epilogue");
  const CastProducer& producer = options.producer;
  MXTRAIN_ASSERT(!producer.defined() || (fuses_producers(layer) && args.epilogue == GemmEpilogue::none &&
                                         !args.bias_gradient.defined()),
                 "LinearRecipe::gemm: layer %lld's casts take no fused producer here", static_cast<long long>(layer));
  MXTRAIN_ASSERT(!options.input_producer.defined() ||
                     (fuses_producers(layer) && args.role == GemmRole::backward_weight && !has_saved_input(layer, kind)),
                 "LinearRecipe::gemm: layer %lld's input cast takes no fused producer here",
                 static_cast<long long>(layer));
  MXTRAIN_ASSERT(!options.keep_gradient_columnwise ||
                     (args.role == GemmRole::backward_input && args.epilogue == GemmEpilogue::none),
                 "LinearRecipe::gemm: only a backward_input without DGELU keeps its gradient's columnwise copy");
  const Tensor &a = args.a.tensor, &b = args.b.tensor;
  switch (args.role) {
    case GemmRole::forward:
      MXTRAIN_ASSERT(!args.accumulate, "LinearRecipe::gemm: a forward overwrites its output");
      if (args.epilogue == GemmEpilogue::gelu_aux_bias) {
        forward_gelu(layer, kind, a, b, args.bias, args.aux, args.out, options.out_amax);
      } else if (args.epilogue == GemmEpilogue::swiglu_aux) {
        forward_swiglu(layer, kind, a, b, args.aux, args.out, options.out_amax);
      } else {
        // The residual rides on the GEMM's epilogue, quantized or not (out = x · Wᵀ + b + residual).
        forward(layer, kind, a, b, args.bias, args.out, options.save_input, producer, args.residual);
      }
      return;
    case GemmRole::backward_input:
      if (args.epilogue == GemmEpilogue::dgelu) {
        MXTRAIN_ASSERT(!args.bias_gradient.defined() || (!quantized(layer) && !options.out_amax.defined()),
                       "LinearRecipe::gemm: a DGELU GEMM sums a bias gradient only in high precision");
        backward_input_gelu(layer, kind, a, b, args.aux, args.out, options.out_amax, args.bias_gradient,
                            args.bias_gradient_accumulate);
      } else {
        backward_input(layer, kind, a, b, args.out, args.accumulate, producer, options.keep_gradient_columnwise);
      }
      return;
    case GemmRole::backward_weight:
      backward_weight(layer, kind, a, b, args.out, args.bias_gradient, args.accumulate, producer,
                      options.input_producer);
      return;
  }
}

void LinearRecipe::forward(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& out, bool save_input, const CastProducer& producer, const Tensor& residual) {
  if (!quantized(layer)) {
    MXTRAIN_ASSERT(!save_input, "forward: layer %lld keeps no quantized input", static_cast<long long>(layer));
    backend_.gemm({.role = GemmRole::forward, .a = x, .b = weight, .out = out, .bias = bias, .residual = residual});
    return;
  }
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  const std::string name = name_of(layer, kind);
  Buffer bias_storage;
  const Tensor b = bias_as(bias, out.dtype, bias_storage);
  MXTRAIN_ASSERT(!save_input || saves_inputs(layer), "forward: layer %lld keeps no quantized input",
                 static_cast<long long>(layer));
  Operand xq = quantize(x, linear, QuantizedRole::input, true, save_input, name + ".input", false,
                        Lifetime::activation, producer);
  if (save_input) saved_inputs_[static_cast<size_t>(linear)] = std::make_unique<Operand>(xq.take_columnwise());
  Operand wq = quantize(weight, linear, QuantizedRole::weight, true, false, name + ".weight", true);
  if (native_) {
    backend_.gemm(
        {.role = GemmRole::forward, .a = xq.rowwise, .b = wq.rowwise, .out = out, .bias = b, .residual = residual});
    return;
  }
  Buffer xd = dequantized(xq.rowwise, out.dtype, name + ".input.dequantized");
  xq = Operand{};
  Buffer wd = dequantized(wq.rowwise, out.dtype, name + ".weight.dequantized");
  wq = Operand{};
  backend_.gemm({.role = GemmRole::forward, .a = xd, .b = wd, .out = out, .bias = b, .residual = residual});
}

void LinearRecipe::backward_weight(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& x,
                                   const Tensor& dweight, const Tensor& dbias, bool accumulate,
                                   const CastProducer& producer, const CastProducer& input_producer) {
  if (!quantized(layer)) {
    backend_.gemm({.role = GemmRole::backward_weight, .a = dout, .b = x, .out = dweight, .accumulate = accumulate,
                   .bias_gradient = dbias});
    return;
  }
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  const std::string name = name_of(layer, kind);
  // Both copies of the gradient in one pass; the rowwise one waits for backward_input. Unless
  // that came first and kept the columnwise copy (keep_gradient_columnwise).
  Operand dq;
  if (column_stash_ && column_stash_->linear == linear && column_stash_->source == source_of(dout, producer)) {
    dq = std::move(column_stash_->operand);
    column_stash_.reset();
  } else {
    dq = quantize(dout, linear, QuantizedRole::gradient, true, true, name + ".grad", false, Lifetime::scratch,
                  producer);
  }
  {
    Operand xq;
    if (has_saved_input(layer, kind)) {
      std::unique_ptr<Operand>& saved = saved_inputs_[static_cast<size_t>(linear)];
      xq = std::move(*saved);
      saved.reset();
    } else {
      xq = quantize(x, linear, QuantizedRole::input, false, true, name + ".input", true, Lifetime::scratch,
                    input_producer);
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
  if (!dq.rowwise.data.defined()) return;  // backward_input came first
  stash_ = std::make_unique<GradientStash>();
  stash_->linear = linear;
  stash_->source = source_of(dout, producer);
  stash_->operand = std::move(dq);
}

void LinearRecipe::backward_input(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& weight,
                                  const Tensor& dx, bool accumulate, const CastProducer& producer,
                                  bool keep_gradient_columnwise) {
  if (!quantized(layer)) {
    backend_.gemm({.role = GemmRole::backward_input, .a = dout, .b = weight, .out = dx, .accumulate = accumulate});
    return;
  }
  const int64_t linear = layer * kLinearKinds + static_cast<int64_t>(kind);
  const std::string name = name_of(layer, kind);
  Operand dq;
  if (stash_ && stash_->linear == linear && stash_->source == source_of(dout, producer)) {
    dq = std::move(stash_->operand);
  } else {
    // A produced gradient's rowwise copy comes from its backward_weight's cast: the caller may
    // free what produced it after that cast.
    MXTRAIN_ASSERT(!producer.defined(), "backward_input: %s's produced gradient has no stashed copy (its "
                   "backward_weight must come first)", name.c_str());
    // Both copies in one pass where the backward_weight after this takes the columnwise one
    // (per-tensor FP8: its scale and amax record are the tensor's, whichever cast makes it).
    const bool keep = keep_gradient_columnwise && quantizer_->per_tensor();
    dq = quantize(dout, linear, QuantizedRole::gradient, true, keep, name + ".grad");
    if (keep) {
      column_stash_ = std::make_unique<GradientStash>();
      column_stash_->linear = linear;
      column_stash_->source = dout.data;
      column_stash_->operand = dq.take_columnwise();
    }
  }
  stash_.reset();
  Operand wq = quantize(weight, linear, QuantizedRole::weight, false, true, name + ".weight", true);
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

void LinearRecipe::forward_gelu(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight,
                                const Tensor& bias, const Tensor& pre, const Tensor& out, const Tensor& out_amax) {
  if (!quantized(layer) && !out_amax.defined()) {
    backend_.gemm({.role = GemmRole::forward, .a = x, .b = weight, .out = out, .epilogue = GemmEpilogue::gelu_aux_bias,
                   .bias = bias, .aux = pre});
    return;
  }
  forward(layer, kind, x, weight, bias, pre, false);
  backend_.gelu_forward(pre, out, out_amax);
}

void LinearRecipe::forward_swiglu(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight,
                                  const Tensor& pre, const Tensor& out, const Tensor& out_amax) {
  if (!quantized(layer) && !out_amax.defined()) {
    backend_.gemm({.role = GemmRole::forward, .a = x, .b = weight, .out = out, .epilogue = GemmEpilogue::swiglu_aux,
                   .aux = pre});
    return;
  }
  forward(layer, kind, x, weight, Tensor(), pre, false);
  backend_.swiglu_forward(pre, out, out_amax);
}

void LinearRecipe::backward_input_gelu(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& weight,
                                       const Tensor& pre, const Tensor& dx, const Tensor& dx_amax,
                                       const Tensor& dbias, bool accumulate_dbias) {
  if (!quantized(layer) && !dx_amax.defined()) {
    backend_.gemm({.role = GemmRole::backward_input, .a = dout, .b = weight, .out = dx,
                   .epilogue = GemmEpilogue::dgelu, .bias_gradient = dbias,
                   .bias_gradient_accumulate = accumulate_dbias, .aux = pre});
    return;
  }
  Buffer product = backend_.allocate(name_of(layer, kind) + ".input_grad", dx.shape, dx.dtype, Lifetime::scratch);
  backward_input(layer, kind, dout, weight, product, false);
  backend_.gelu_backward(product, pre, dx, dx_amax);
}

void LinearRecipe::finish_step() {
  stash_.reset();
  column_stash_.reset();
  for (std::unique_ptr<Operand>& saved : saved_inputs_) saved.reset();
  if (quantizer_) quantizer_->end_step();
  ++steps_;
}

namespace {

template <typename Format>
const Format* as(const std::unique_ptr<Quantizer>& quantizer) {
  return dynamic_cast<const Format*>(quantizer.get());
}

}  // namespace

const Tensor& LinearRecipe::forward_history() const {
  const auto* delayed = as<Fp8DelayedQuantizer>(quantizer_);
  return delayed ? delayed->forward_history() : kUndefined;
}

const Tensor& LinearRecipe::backward_history() const {
  const auto* delayed = as<Fp8DelayedQuantizer>(quantizer_);
  return delayed ? delayed->backward_history() : kUndefined;
}

const Tensor& LinearRecipe::forward_scale() const {
  const auto* delayed = as<Fp8DelayedQuantizer>(quantizer_);
  return delayed ? delayed->forward_scale() : kUndefined;
}

const Tensor& LinearRecipe::backward_scale() const {
  const auto* delayed = as<Fp8DelayedQuantizer>(quantizer_);
  return delayed ? delayed->backward_scale() : kUndefined;
}

std::vector<std::pair<std::string, Tensor>> LinearRecipe::resume_state() const {
  return quantizer_ ? quantizer_->resume_state() : std::vector<std::pair<std::string, Tensor>>{};
}

const Tensor& LinearRecipe::current_amax() const {
  const auto* current = as<Fp8CurrentQuantizer>(quantizer_);
  return current ? current->amaxes() : kUndefined;
}

}  // namespace mxtrain
