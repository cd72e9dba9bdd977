#include "mxtrain/train/loss_scaler.hpp"

#include <algorithm>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain {

LossScalerOptions loss_scaler_options(const PrecisionConfig& config) {
  LossScalerOptions options;
  options.initial_scale = config.loss_scale_init;
  options.growth_interval = config.loss_scale_growth_interval;
  options.backoff_factor = config.loss_scale_backoff;
  options.growth_factor = config.loss_scale_growth;
  return options;
}

LossScaler::LossScaler(const LossScalerOptions& options) : options_(options), scale_(options.initial_scale) {
  MXTRAIN_REQUIRE(options.initial_scale >= 1.0 && options.initial_scale <= kMaxScale && options.growth_interval >= 1 &&
                      options.backoff_factor > 0.0 && options.backoff_factor < 1.0 && options.growth_factor > 1.0,
                  config,
                  strf("loss scaling needs init in [1, 2^32], growth_interval >= 1, 0 < backoff < 1 < growth; got "
                       "%g, %lld, %g, %g",
                       options.initial_scale, static_cast<long long>(options.growth_interval), options.backoff_factor,
                       options.growth_factor),
                  "fix precision.loss_scale_init / _growth_interval / _backoff / _growth");
}

void LossScaler::restore(double scale, int64_t clean_steps) {
  if (!(scale >= kMinScale && scale <= kMaxScale) || clean_steps < 0)
    throw Error(ErrorKind::checkpoint,
                strf("the checkpoint's fp16 loss scale %g (after %lld clean steps) is not one a run reaches "
                     "(%g to %g)",
                     scale, static_cast<long long>(clean_steps), kMinScale, kMaxScale),
                "the checkpoint was edited by hand; resume from an earlier one, or start the run again");
  scale_ = scale;
  // A shorter precision.loss_scale_growth_interval than the saved run's: grow at the next clean step.
  clean_ = std::min(clean_steps, options_.growth_interval - 1);
}

bool LossScaler::update(bool overflow, int64_t step) {
  if (overflow) {
    const double previous = scale_;
    scale_ *= options_.backoff_factor;
    clean_ = 0;
    ++skipped_;
    log::warn(strf("step %lld: fp16 gradients overflowed (inf/NaN); update skipped, loss scale %g -> %g",
                   static_cast<long long>(step), previous, scale_));
    if (scale_ < kMinScale)
      throw Error(ErrorKind::numerics,
                  strf("fp16 gradients are still inf/NaN at step %lld with a loss scale of %g: the model diverged",
                       static_cast<long long>(step), scale_),
                  "lower optimizer.lr or use --precision bf16; then resume from the last checkpoint");
    return false;
  }
  if (++clean_ >= options_.growth_interval) {
    scale_ = std::min(scale_ * options_.growth_factor, kMaxScale);
    clean_ = 0;
  }
  return true;
}

}  // namespace mxtrain
