#include "mxtrain/train/schedule.hpp"

#include <algorithm>
#include <cmath>

namespace mxtrain {

double learning_rate(const OptimizerConfig& optimizer, const ScheduleConfig& schedule, int64_t step, int64_t steps) {
  const double peak = optimizer.lr;
  if (step <= schedule.warmup_steps && schedule.warmup_steps > 0)
    return peak * static_cast<double>(step) / static_cast<double>(schedule.warmup_steps);
  const double floor = peak * schedule.min_lr_ratio;
  const int64_t decay_steps = steps - schedule.warmup_steps;
  if (schedule.decay == "constant" || decay_steps <= 0) return peak;
  double progress = static_cast<double>(step - schedule.warmup_steps) / static_cast<double>(decay_steps);
  progress = std::clamp(progress, 0.0, 1.0);
  double shape = schedule.decay == "linear" ? 1.0 - progress : 0.5 * (1.0 + std::cos(M_PI * progress));
  return floor + (peak - floor) * shape;
}

}  // namespace mxtrain
