// The four quantizers. The base class makes the copies; each format adds its spec and, where it
// has them, its scales (per-tensor FP8) or tensor amaxes (NVFP4).
#include "mxtrain/model/quantizer.hpp"

#include <algorithm>
#include <cmath>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/fp8.hpp"

namespace mxtrain {

QuantizedOperand QuantizedOperand::take_columnwise() {
  QuantizedOperand taken;
  taken.col_data = std::move(col_data);
  taken.col_scales = std::move(col_scales);
  taken.col_amax = std::move(col_amax);
  taken.columnwise = columnwise;
  columnwise = QuantizedTensor{};
  return taken;
}

Quantizer::Quantizer(Backend& backend, DType forward_element, DType gradient_element)
    : backend_(backend), forward_element_(forward_element), gradient_element_(gradient_element) {}

Quantizer::~Quantizer() = default;

Tensor Quantizer::amax_record(int64_t, QuantizedRole, const Tensor&) { return Tensor(); }

void Quantizer::cast_scale(const Tensor&, const QuantizeRequest&, Tensor*, Tensor*, ScaleFromAmax*) {}

void Quantizer::copy_amax(const Tensor&, const std::string&, bool, QuantizedOperand&, Buffer&, QuantizedTensor&) {}

void Quantizer::allocate_copy(const Tensor& x, const QuantizeRequest& request, bool transposed,
                              QuantizedOperand& operand, const void* data_at, const void* scales_at) {
  Buffer& data = transposed ? operand.col_data : operand.row_data;
  Buffer& scales = transposed ? operand.col_scales : operand.row_scales;
  Buffer& amax = transposed ? operand.col_amax : operand.row_amax;
  QuantizedTensor& q = transposed ? operand.columnwise : operand.rowwise;
  q.spec = spec(request.role, transposed);
  q.transposed = transposed;
  const int64_t rows = transposed ? x.cols() : x.rows(), k = transposed ? x.rows() : x.cols();
  const std::string copy = request.name + (transposed ? ".columnwise" : ".rowwise");
  const Lifetime lifetime = transposed ? request.columnwise_lifetime : Lifetime::scratch;
  data = backend_.allocate(copy, Shape{rows, k}, q.spec.element, lifetime, data_at);
  q.data = data;
  scales = backend_.allocate(copy + ".scale_inverse", block_scale_shape(q.spec, rows, k),
                             block_scale_dtype(q.spec.mode), lifetime, scales_at);
  q.scale_inverse = scales;
  copy_amax(x, copy, transposed, operand, amax, q);
}

QuantizedOperand Quantizer::quantize(const Tensor& x, const QuantizeRequest& request) {
  MXTRAIN_ASSERT(!request.producer.defined() || fuses_producers(), "quantize: %s casts no fused producer",
                 std::string(dtype_name(format_dtype())).c_str());
  // A weight's rowwise copy the optimizer step wrote for this forward (weight_casts).
  if (request.role == QuantizedRole::weight && request.rowwise && !request.columnwise) {
    auto ready = ready_.find(request.linear);
    if (ready != ready_.end()) {
      const bool same = ready->second.source == x.data;
      if (same && evaluating_) return quantize_now(x, request);
      QuantizedOperand operand = std::move(ready->second.operand);
      ready_.erase(ready);
      if (same) {
        taken_.push_back({request.linear, operand.rowwise.data, operand.rowwise.scale_inverse, {}});
        return operand;
      }
    }
  }
  return quantize_now(x, request);
}

QuantizedOperand Quantizer::prepare_copies(const Tensor& x, const QuantizeRequest& request, Tensor* scale,
                                           Tensor* amax, ScaleFromAmax* from) {
  QuantizedOperand operand;
  cast_scale(x, request, scale, amax, from);
  if (request.rowwise) allocate_copy(x, request, false, operand);
  if (request.columnwise) allocate_copy(x, request, true, operand);
  return operand;
}

QuantizedOperand Quantizer::quantize_now(const Tensor& x, const QuantizeRequest& request) {
  Tensor scale, amax_out;
  ScaleFromAmax from;
  QuantizedOperand operand = prepare_copies(x, request, &scale, &amax_out, &from);
  backend_.quantize(x, scale, operand.rowwise, operand.columnwise, amax_out, from, request.producer);
  return operand;
}

QuantizedOperand Quantizer::copies_for_producer(const Tensor& x, const QuantizeRequest& request, Tensor* scale,
                                                Tensor* amax) {
  MXTRAIN_ASSERT(fuses_producers() && !request.producer.defined(),
                 "copies_for_producer: %s casts no fused producer", std::string(dtype_name(format_dtype())).c_str());
  ScaleFromAmax from;
  QuantizedOperand operand = prepare_copies(x, request, scale, amax, &from);
  MXTRAIN_ASSERT(!from.defined(), "copies_for_producer: the scale must be known before the pass");
  return operand;
}

void Quantizer::prepare_weight_cast(WeightCast& cast) {
  const QuantizeRequest request{.linear = cast.linear, .role = QuantizedRole::weight, .rowwise = true,
                                .name = cast.name};
  // Where this step's forward took the last copy, if that memory is free again: in a steady run
  // every step then reads its copies where a captured step graph reads them.
  const void *data_at = nullptr, *scales_at = nullptr;
  for (const CopyAddress& taken : taken_)
    if (taken.linear == cast.linear) {
      data_at = taken.data.data;
      scales_at = taken.scale.data;
    }
  allocate_copy(cast.weight, request, false, cast.operand, data_at, scales_at);
  if (data_at != nullptr &&
      (cast.operand.rowwise.data.data != data_at || cast.operand.rowwise.scale_inverse.data != scales_at)) {
    const Tensor at_data(const_cast<void*>(data_at), cast.operand.rowwise.data.shape, cast.operand.rowwise.data.dtype,
                         cast.operand.rowwise.data.device);
    const Tensor at_scale(const_cast<void*>(scales_at), cast.operand.rowwise.scale_inverse.shape,
                          cast.operand.rowwise.scale_inverse.dtype, cast.operand.rowwise.data.device);
    unsettled_.push_back({cast.linear, at_data, at_scale, cast.name + ".rowwise"});
  }
}

void Quantizer::weight_cast_written(WeightCast&& cast) {
  written_.push_back({cast.linear, cast.operand.rowwise.data, cast.operand.rowwise.scale_inverse, {}});
  ready_[cast.linear] = Ready{cast.weight.data, std::move(cast.operand)};
}

void Quantizer::end_step() {
  std::sort(taken_.begin(), taken_.end());
  std::sort(written_.begin(), written_.end());
  weight_casts_repeat_ = taken_ == written_;
  taken_.clear();
  written_.clear();
  finish_step();
}

void Quantizer::drop_weight_casts() { ready_.clear(); }

void Quantizer::settle_weight_casts() {
  // The bytes as f32 words (a copy of one dtype moves the bits).
  auto words = [](const Tensor& t) {
    return Tensor(t.data, Shape{static_cast<int64_t>(t.bytes() / 4)}, DType::f32, t.device);
  };
  // A move frees the copy's old place, which may be where another belongs: again while one moves.
  for (bool moved = true; moved && !unsettled_.empty();) {
    moved = false;
    for (auto home = unsettled_.begin(); home != unsettled_.end();) {
      auto ready = ready_.find(home->linear);
      if (ready == ready_.end()) {
        home = unsettled_.erase(home);
        continue;
      }
      QuantizedOperand& operand = ready->second.operand;
      if (operand.rowwise.data.bytes() % 4 != 0 || operand.rowwise.scale_inverse.bytes() % 4 != 0) {
        ++home;
        continue;
      }
      const std::string& name = home->name;
      Buffer data = backend_.allocate(name, operand.rowwise.data.shape, operand.rowwise.data.dtype, Lifetime::scratch,
                                      home->data.data);
      Buffer scales = backend_.allocate(name + ".scale_inverse", operand.rowwise.scale_inverse.shape,
                                        operand.rowwise.scale_inverse.dtype, Lifetime::scratch, home->scale.data);
      if (data.tensor().data != home->data.data || scales.tensor().data != home->scale.data) {
        ++home;
        continue;
      }
      backend_.copy(words(operand.rowwise.data), words(data));
      backend_.copy(words(operand.rowwise.scale_inverse), words(scales));
      operand.row_data = std::move(data);
      operand.row_scales = std::move(scales);
      operand.rowwise.data = operand.row_data;
      operand.rowwise.scale_inverse = operand.row_scales;
      for (CopyAddress& written : written_)
        if (written.linear == home->linear) {
          written.data = operand.rowwise.data;
          written.scale = operand.rowwise.scale_inverse;
        }
      home = unsettled_.erase(home);
      moved = true;
    }
  }
  unsettled_.clear();
}

// ---- per-tensor FP8, delayed scaling ------------------------------------------------------------

Fp8DelayedQuantizer::Fp8DelayedQuantizer(Backend& backend, int64_t linears, DType gradient_element,
                                         int history_length, numerics::AmaxAlgorithm algorithm, int margin)
    : Quantizer(backend, DType::e4m3, gradient_element), algorithm_(algorithm), margin_(margin) {
  MXTRAIN_REQUIRE(history_length >= 1, config,
                  strf("precision.amax_history_len is %d; it must be at least 1", history_length),
                  "set precision.amax_history_len to a positive count (TransformerEngine's default is 1024)");
  const int64_t length = history_length;
  forward_history_ =
      backend.allocate("fp8.forward.amax_history", Shape{length, 2 * linears}, DType::f32, Lifetime::parameter);
  forward_scale_ = backend.allocate("fp8.forward.scale", Shape{2 * linears}, DType::f32, Lifetime::parameter);
  forward_scale_inverse_ =
      backend.allocate("fp8.forward.scale_inverse", Shape{2 * linears}, DType::f32, Lifetime::parameter);
  backward_history_ =
      backend.allocate("fp8.backward.amax_history", Shape{length, linears}, DType::f32, Lifetime::parameter);
  backward_scale_ = backend.allocate("fp8.backward.scale", Shape{linears}, DType::f32, Lifetime::parameter);
  backward_scale_inverse_ =
      backend.allocate("fp8.backward.scale_inverse", Shape{linears}, DType::f32, Lifetime::parameter);
  // §2.1: the history starts at zeros and every scale at 1.
  backend.fill(forward_history_, 0.0f);
  backend.fill(backward_history_, 0.0f);
  for (const Buffer* one : {&forward_scale_, &forward_scale_inverse_, &backward_scale_, &backward_scale_inverse_})
    backend.fill(*one, 1.0f);
}

QuantizeSpec Fp8DelayedQuantizer::spec(QuantizedRole role, bool) {
  QuantizeSpec spec;
  spec.mode = ScalingMode::per_tensor;
  spec.element = element(role);
  return spec;
}

void Fp8DelayedQuantizer::cast_scale(const Tensor& x, const QuantizeRequest& request, Tensor* scale, Tensor* amax_out,
                                     ScaleFromAmax*) {
  if (request.role == QuantizedRole::weight) weights_[request.linear] = {x, request.name};
  // This step's scale (from the history up to the last step); the cast records its amax in
  // history slot 0, which is the first row of the slot-major history.
  const bool forward = request.role != QuantizedRole::gradient;
  const int64_t index =
      forward ? 2 * request.linear + (request.role == QuantizedRole::weight ? 1 : 0) : request.linear;
  *scale = (forward ? forward_scale_ : backward_scale_).tensor().slice_flat(index, Shape{1});
  *amax_out = (forward ? forward_history_ : backward_history_).tensor().slice_flat(index, Shape{1});
}

std::vector<std::pair<std::string, Tensor>> Fp8DelayedQuantizer::resume_state() const {
  return {{"fp8.forward.amax_history", forward_history_.tensor()},
          {"fp8.forward.scale", forward_scale_.tensor()},
          {"fp8.forward.scale_inverse", forward_scale_inverse_.tensor()},
          {"fp8.backward.amax_history", backward_history_.tensor()},
          {"fp8.backward.scale", backward_scale_.tensor()},
          {"fp8.backward.scale_inverse", backward_scale_inverse_.tensor()}};
}

// Slot 0 is the first row of the slot-major history: the records of the step under way.
Tensor Fp8DelayedQuantizer::newest_forward_slot() const {
  return forward_history_.tensor().slice_flat(0, Shape{forward_history_.tensor().shape[1]});
}

void Fp8DelayedQuantizer::begin_evaluation() {
  const Tensor newest = newest_forward_slot();
  held_slot_.resize(static_cast<size_t>(newest.numel()));
  backend_.copy_to_host(newest, held_slot_.data());
}

void Fp8DelayedQuantizer::end_evaluation() {
  if (held_slot_.empty()) return;
  backend_.copy_from_host(held_slot_.data(), newest_forward_slot());
  held_slot_.clear();
}

std::vector<WeightCast> Fp8DelayedQuantizer::weight_casts() {
  std::vector<WeightCast> casts;
  // The next step's scales first: the copies are cast with them, and record their amaxes in the
  // newest slot of the rolled histories, as the next forward's casts would.
  update_scales();
  scales_updated_ = true;
  for (const auto& [linear, cast_weight] : weights_) {
    WeightCast cast;
    cast.linear = linear;
    cast.weight = cast_weight.weight;
    cast.name = cast_weight.name;
    const int64_t index = 2 * cast.linear + 1;
    cast.scale = forward_scale_.tensor().slice_flat(index, Shape{1});
    cast.amax = forward_history_.tensor().slice_flat(index, Shape{1});
    casts.push_back(std::move(cast));
  }
  return casts;
}

void Fp8DelayedQuantizer::finish_step() {
  if (!scales_updated_) update_scales();
  scales_updated_ = false;
  weights_.clear();
}

void Fp8DelayedQuantizer::update_scales() {
  ScaleUpdateArgs args;
  args.rule = ScaleUpdateArgs::Rule::delayed;
  args.most_recent = algorithm_ == numerics::AmaxAlgorithm::most_recent;
  args.scaled_max = std::ldexp(numerics::kE4m3Max, -margin_);
  backend_.fp8_scale_update(forward_history_, forward_scale_, forward_scale_inverse_, args);
  args.scaled_max =
      std::ldexp(gradient_element_ == DType::e5m2 ? numerics::kE5m2Max : numerics::kE4m3Max, -margin_);
  backend_.fp8_scale_update(backward_history_, backward_scale_, backward_scale_inverse_, args);
}

// ---- per-tensor FP8, current scaling ------------------------------------------------------------

Fp8CurrentQuantizer::Fp8CurrentQuantizer(Backend& backend, int64_t linears, DType gradient_element,
                                         bool producer_amaxes)
    : Quantizer(backend, DType::e4m3, gradient_element), producer_amaxes_(producer_amaxes) {
  amax_ = backend.allocate("fp8.current.amax", Shape{1, 3 * linears}, DType::f32, Lifetime::parameter);
  scale_ = backend.allocate("fp8.current.scale", Shape{3 * linears}, DType::f32, Lifetime::parameter);
  source_.assign(static_cast<size_t>(3 * linears), Tensor());
  recorded_.assign(static_cast<size_t>(3 * linears), nullptr);
}

QuantizeSpec Fp8CurrentQuantizer::spec(QuantizedRole role, bool) {
  QuantizeSpec spec;
  spec.mode = ScalingMode::per_tensor;
  spec.element = element(role);
  return spec;
}

void Fp8CurrentQuantizer::cast_scale(const Tensor& x, const QuantizeRequest& request, Tensor* scale, Tensor* amax_out,
                                     ScaleFromAmax* from) {
  // This tensor's amax, then its scale, before the cast (§2.2); the cast forms the scale from
  // the amax itself (ScaleFromAmax) and stores it for a reuse.
  const int64_t index = 3 * request.linear + static_cast<int64_t>(request.role);
  const Tensor amax = amax_.tensor().slice_flat(index, Shape{1, 1});
  *scale = scale_.tensor().slice_flat(index, Shape{1});
  *amax_out = Tensor();
  Tensor& source = source_[static_cast<size_t>(index)];
  if (request.reuse_scale && source.defined() && source.data == x.data) return;
  source = request.role == QuantizedRole::gradient ? Tensor() : x;
  // The kernel that wrote x may have recorded its amax in this slot already (amax_record).
  const void*& recorded = recorded_[static_cast<size_t>(index)];
  if (recorded != x.data) backend_.amax(x, amax, false);
  recorded = nullptr;
  from->amax = amax;
  from->args.rule = ScaleUpdateArgs::Rule::current;
  from->args.scaled_max = request.role == QuantizedRole::gradient && gradient_element_ == DType::e5m2
                              ? numerics::kE5m2Max
                              : numerics::kE4m3Max;
}

Tensor Fp8CurrentQuantizer::amax_record(int64_t linear, QuantizedRole role, const Tensor& x) {
  if (!producer_amaxes_) return Tensor();
  const int64_t index = 3 * linear + static_cast<int64_t>(role);
  recorded_[static_cast<size_t>(index)] = x.data;
  return amax_.tensor().slice_flat(index, Shape{1});
}

std::vector<WeightAmax> Fp8CurrentQuantizer::weight_amaxes() {
  std::vector<WeightAmax> weights;
  if (!producer_amaxes_) return weights;
  for (int64_t linear = 0; 3 * linear < static_cast<int64_t>(source_.size()); ++linear) {
    const int64_t index = 3 * linear + static_cast<int64_t>(QuantizedRole::weight);
    const Tensor& weight = source_[static_cast<size_t>(index)];
    if (weight.defined()) weights.push_back({linear, weight, amax_.tensor().slice_flat(index, Shape{1})});
  }
  if (weights.empty()) return weights;
  // Every amax of this step has been taken by its cast: one fill zeroes the records to come.
  backend_.fill(amax_, 0.0f);
  std::fill(recorded_.begin(), recorded_.end(), nullptr);
  return weights;
}

void Fp8CurrentQuantizer::weight_amax_recorded(const WeightAmax& weight) {
  const int64_t index = 3 * weight.linear + static_cast<int64_t>(QuantizedRole::weight);
  recorded_[static_cast<size_t>(index)] = weight.weight.data;
}

void Fp8CurrentQuantizer::finish_step() {
  // The optimizer has changed the weights: their scales are stale.
  for (size_t i = 1; i < source_.size(); i += 3) source_[i] = Tensor();
}

// ---- MXFP8 --------------------------------------------------------------------------------------

Mxfp8Quantizer::Mxfp8Quantizer(Backend& backend, DType gradient_element, bool round_up, bool swizzled_scales)
    : Quantizer(backend, DType::e4m3, gradient_element), round_up_(round_up), swizzled_scales_(swizzled_scales) {}

QuantizeSpec Mxfp8Quantizer::spec(QuantizedRole role, bool) {
  QuantizeSpec spec;
  spec.mode = ScalingMode::mxfp8;
  spec.element = element(role);
  spec.mx_round_up = round_up_;
  spec.swizzled_scales = swizzled_scales_;
  return spec;
}

// ---- NVFP4 --------------------------------------------------------------------------------------

Nvfp4Quantizer::Nvfp4Quantizer(Backend& backend, const Options& options)
    : Quantizer(backend, DType::e2m1, DType::e2m1), options_(options) {}

QuantizeSpec Nvfp4Quantizer::spec(QuantizedRole role, bool columnwise) {
  // §2.5: weights in 16x16 tiles; the RHT on the columnwise (wgrad) copies of inputs and
  // gradients; stochastic rounding of gradients.
  QuantizeSpec spec;
  spec.mode = ScalingMode::nvfp4;
  spec.element = DType::e2m1;
  spec.swizzled_scales = options_.swizzled_scales;
  spec.nvfp4_tiles = role == QuantizedRole::weight && options_.weight_tiles;
  spec.hadamard = columnwise && role != QuantizedRole::weight && options_.hadamard;
  spec.stochastic_rounding = role == QuantizedRole::gradient && options_.stochastic_rounding;
  spec.seed = options_.seed;
  if (spec.stochastic_rounding) spec.offset = stochastic_streams_++;
  return spec;
}

void Nvfp4Quantizer::copy_amax(const Tensor& x, const std::string& copy, bool transposed, QuantizedOperand& operand,
                               Buffer& amax, QuantizedTensor& q) {
  // The global NVFP4 scale comes from the amax of the matrix this copy quantizes (after its
  // RHT); copies without an RHT share the tensor's own amax.
  if (transposed && !q.spec.hadamard && operand.row_amax.defined()) {
    q.amax = operand.row_amax;
    return;
  }
  amax = backend_.allocate(copy + ".amax", Shape{1}, DType::f32, Lifetime::scratch);
  backend_.amax(x, amax, false, transposed && q.spec.hadamard);
  q.amax = amax;
}

}  // namespace mxtrain
