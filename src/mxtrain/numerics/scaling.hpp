// Per-tensor FP8 recipes: delayed scaling (a scale from an amax history, §2.1) and current scaling
// (a scale from this tensor's own amax, §2.2), plus the per-tensor cast itself.
//
// Delayed scaling, step by step. Each cast during step t uses the scale computed at the end of
// step t-1 and records the amax it saw into history slot 0 (the max over all casts of that tensor
// in the step). At the end of the step the caller may all-reduce (MAX) slot 0 of every tensor
// (newest_amaxes()), then update(): new scales come from the full window *before* it rolls — the
// max over all `amax_history_length` slots, or slot 0 alone for most_recent — and then the history
// shifts by one: slot k moves to slot k+1, the oldest entry falls off, slot 0 becomes 0. So slot 0
// is always the newest amax and slot k the one from k steps earlier. The initial scale is 1 and
// the history starts at zeros; an amax window that is 0, inf or NaN keeps the previous scale.
// (TE's kernel keeps the same window in a rotated buffer; the scales are identical.)
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "mxtrain/numerics/fp8.hpp"

namespace mxtrain::numerics {

enum class AmaxAlgorithm : uint8_t {
  max,          // max over the whole history window
  most_recent,  // the amax of the step that just ended
};

enum class Fp8FormatPolicy : uint8_t {
  hybrid,  // E4M3 for forward tensors (inputs, weights, outputs), E5M2 for gradients
  e4m3,    // E4M3 everywhere
};

enum class TensorDirection : uint8_t { forward, backward };

Fp8Format fp8_format_for(Fp8FormatPolicy policy, TensorDirection direction);

struct DelayedScalingConfig {
  int amax_history_length = 1024;
  int margin = 0;  // scaled_max = fp8_max · 2^-margin
  AmaxAlgorithm algorithm = AmaxAlgorithm::max;
  Fp8FormatPolicy formats = Fp8FormatPolicy::hybrid;
};

class DelayedScaling {
 public:
  // One entry per scaled tensor; its direction picks its FP8 format under the policy.
  DelayedScaling(const DelayedScalingConfig& config, std::vector<TensorDirection> tensors);

  int tensor_count() const { return static_cast<int>(formats_.size()); }
  const DelayedScalingConfig& config() const { return config_; }
  Fp8Format format(int tensor) const;
  float scale(int tensor) const;          // multiplies values before the cast
  float scale_inverse(int tensor) const;  // 1 / scale: multiplies FP8 values back (what the GEMM gets)

  // Folds a cast's amax into slot 0 (a NaN sticks, so the window reports it).
  void record_amax(int tensor, float amax);
  // Slot 0 of every tensor, contiguous, for an all-reduce (MAX) across ranks before update().
  std::span<float> newest_amaxes();
  float history(int slot, int tensor) const;  // slot 0 = newest

  // Computes the new scales from the window, then rolls the history.
  void update();

 private:
  float scaled_max(int tensor) const;

  DelayedScalingConfig config_;
  std::vector<Fp8Format> formats_;
  std::vector<float> history_;  // [amax_history_length, tensors], slot-major
  std::vector<float> scales_;   // [tensors]
};

struct CurrentScalingConfig {
  Fp8FormatPolicy formats = Fp8FormatPolicy::hybrid;
  float epsilon = 0.0f;            // amax floor
  bool power_of_2_scales = false;  // round each scale down to a power of two
};

struct Fp8Tensor {
  std::vector<uint8_t> data;  // one FP8 code per element
  Fp8Format format = Fp8Format::e4m3;
  float scale = 1.0f;
  float scale_inverse = 1.0f;
  float amax = 0.0f;  // of the high-precision input
};

// max |x| over the values; NaN if any value is NaN.
float amax_of(std::span<const float> values);

// output[i] = fp8(input[i] · scale) (RNE, satfinite); returns amax_of(input).
float quantize_fp8(std::span<const float> input, float scale, Fp8Format format, std::span<uint8_t> output);
// output[i] = float(input[i]) · scale_inverse.
void dequantize_fp8(std::span<const uint8_t> input, float scale_inverse, Fp8Format format, std::span<float> output);

// Current scaling: amax pass, scale from it (current_scale_from_amax), cast pass.
Fp8Tensor quantize_fp8_current_scaling(std::span<const float> input, TensorDirection direction,
                                       const CurrentScalingConfig& config);

}  // namespace mxtrain::numerics
