// Dynamic loss scaling for FP16 training, PyTorch GradScaler's rule: the loss (so every
// gradient) is multiplied by the scale; when the gradients come back with an inf or NaN the
// optimizer step is skipped and the scale shrinks by the backoff factor; after growth_interval
// consecutive clean steps it grows by the growth factor. The session detects overflow through the
// global gradient norm, which it computes on the device anyway.
#pragma once
#include <cstdint>

#include "mxtrain/config/run_config.hpp"

namespace mxtrain {

struct LossScalerOptions {
  double initial_scale = 65536.0;  // 2^16
  int64_t growth_interval = 2000;
  double backoff_factor = 0.5;
  double growth_factor = 2.0;
};

LossScalerOptions loss_scaler_options(const PrecisionConfig& config);

class LossScaler {
 public:
  // Scales never grow beyond 2^32 (an FP16 gradient overflows long before), so the squared
  // scale stays a finite FP32 number.
  static constexpr double kMaxScale = 4294967296.0;
  // Below 2^-24 even FP16's smallest subnormal gradient is scaled to nothing: the model diverged.
  static constexpr double kMinScale = 1.0 / 16777216.0;

  explicit LossScaler(const LossScalerOptions& options);

  float scale() const { return static_cast<float>(scale_); }
  double scale_value() const { return scale_; }  // unrounded (checkpoints keep it)
  // After the backward of step `step`: returns whether the optimizer may apply the update. On
  // overflow, logs the skip and backs off; throws Error(numerics) once the scale falls below
  // kMinScale.
  bool update(bool overflow, int64_t step);

  int64_t skipped_steps() const { return skipped_; }
  int64_t clean_steps() const { return clean_; }  // since the last change of the scale

  // A resumed run continues with the saved scale and count of clean steps (checkpoints keep
  // them), as an uninterrupted one would; throws Error(checkpoint) on a scale no run reaches.
  void restore(double scale, int64_t clean_steps);

 private:
  LossScalerOptions options_;
  double scale_;
  int64_t clean_ = 0;
  int64_t skipped_ = 0;
};

}  // namespace mxtrain
