#include "mxtrain/numerics/scaling.hpp"

#include <cmath>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/scale_rules.hpp"

namespace mxtrain::numerics {

Fp8Format fp8_format_for(Fp8FormatPolicy policy, TensorDirection direction) {
  switch (policy) {
    case Fp8FormatPolicy::hybrid: return direction == TensorDirection::forward ? Fp8Format::e4m3 : Fp8Format::e5m2;
    case Fp8FormatPolicy::e4m3: return Fp8Format::e4m3;
  }
  return Fp8Format::e4m3;
}

DelayedScaling::DelayedScaling(const DelayedScalingConfig& config, std::vector<TensorDirection> tensors)
    : config_(config) {
  MXTRAIN_REQUIRE(config.amax_history_length >= 1, config,
                  strf("amax_history_length is %d; it must be at least 1", config.amax_history_length),
                  "set precision.amax_history_length to a positive count (TE's default is 1024)");
  // 2^-margin must stay a normal float so that scaled_max is exact.
  MXTRAIN_REQUIRE(config.margin >= -100 && config.margin <= 100, config,
                  strf("margin is %d; it must lie in [-100, 100]", config.margin),
                  "set precision.margin to a small integer such as 0");
  formats_.reserve(tensors.size());
  for (TensorDirection direction : tensors) formats_.push_back(fp8_format_for(config.formats, direction));
  history_.assign(static_cast<size_t>(config.amax_history_length) * formats_.size(), 0.0f);
  scales_.assign(formats_.size(), 1.0f);
}

Fp8Format DelayedScaling::format(int tensor) const {
  MXTRAIN_ASSERT(tensor >= 0 && tensor < tensor_count(), "tensor %d of %d", tensor, tensor_count());
  return formats_[static_cast<size_t>(tensor)];
}

float DelayedScaling::scale(int tensor) const {
  MXTRAIN_ASSERT(tensor >= 0 && tensor < tensor_count(), "tensor %d of %d", tensor, tensor_count());
  return scales_[static_cast<size_t>(tensor)];
}

float DelayedScaling::scale_inverse(int tensor) const { return 1.0f / scale(tensor); }

void DelayedScaling::record_amax(int tensor, float amax) {
  MXTRAIN_ASSERT(tensor >= 0 && tensor < tensor_count(), "tensor %d of %d", tensor, tensor_count());
  float& newest = history_[static_cast<size_t>(tensor)];
  newest = nan_propagating_max(newest, amax);
}

std::span<float> DelayedScaling::newest_amaxes() { return {history_.data(), formats_.size()}; }

float DelayedScaling::history(int slot, int tensor) const {
  MXTRAIN_ASSERT(slot >= 0 && slot < config_.amax_history_length, "slot %d of %d", slot, config_.amax_history_length);
  MXTRAIN_ASSERT(tensor >= 0 && tensor < tensor_count(), "tensor %d of %d", tensor, tensor_count());
  return history_[static_cast<size_t>(slot) * formats_.size() + static_cast<size_t>(tensor)];
}

float DelayedScaling::scaled_max(int tensor) const {
  return std::ldexp(fp8_max(format(tensor)), -config_.margin);
}

void DelayedScaling::update() {
  const size_t tensors = formats_.size();
  const size_t length = static_cast<size_t>(config_.amax_history_length);
  for (size_t tensor = 0; tensor < tensors; ++tensor) {
    float window_amax = history_[tensor];
    if (config_.algorithm == AmaxAlgorithm::max) {
      for (size_t slot = 1; slot < length; ++slot) {
        window_amax = nan_propagating_max(window_amax, history_[slot * tensors + tensor]);
      }
    }
    scales_[tensor] = delayed_scale_from_amax(window_amax, scaled_max(static_cast<int>(tensor)), scales_[tensor]);
  }
  for (size_t slot = length - 1; slot >= 1; --slot) {
    for (size_t tensor = 0; tensor < tensors; ++tensor) {
      history_[slot * tensors + tensor] = history_[(slot - 1) * tensors + tensor];
    }
  }
  for (size_t tensor = 0; tensor < tensors; ++tensor) history_[tensor] = 0.0f;
}

float amax_of(std::span<const float> values) {
  float amax = 0.0f;
  for (float value : values) amax = nan_propagating_max(amax, abs_value(value));
  return amax;
}

float quantize_fp8(std::span<const float> input, float scale, Fp8Format format, std::span<uint8_t> output) {
  MXTRAIN_ASSERT(input.size() == output.size(), "input has %zu values, output %zu", input.size(), output.size());
  for (size_t i = 0; i < input.size(); ++i) output[i] = float_to_fp8(mul_rn(input[i], scale), format);
  return amax_of(input);
}

void dequantize_fp8(std::span<const uint8_t> input, float scale_inverse, Fp8Format format, std::span<float> output) {
  MXTRAIN_ASSERT(input.size() == output.size(), "input has %zu values, output %zu", input.size(), output.size());
  for (size_t i = 0; i < input.size(); ++i) output[i] = mul_rn(fp8_to_float(input[i], format), scale_inverse);
}

Fp8Tensor quantize_fp8_current_scaling(std::span<const float> input, TensorDirection direction,
                                       const CurrentScalingConfig& config) {
  Fp8Tensor result;
  result.format = fp8_format_for(config.formats, direction);
  result.amax = amax_of(input);
  result.scale = current_scale_from_amax(result.amax, fp8_max(result.format), config.epsilon, config.power_of_2_scales);
  result.scale_inverse = 1.0f / result.scale;
  result.data.resize(input.size());
  quantize_fp8(input, result.scale, result.format, result.data);
  return result;
}

}  // namespace mxtrain::numerics
