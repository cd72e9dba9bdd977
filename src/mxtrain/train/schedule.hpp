// Learning-rate schedule: linear warm-up from lr/warmup to lr, then cosine (or linear) decay to
// lr * min_lr_ratio at the last step, or constant.
#pragma once
#include <cstdint>

#include "mxtrain/config/run_config.hpp"

namespace mxtrain {

// step is 1-based: the first optimizer step uses learning_rate(1).
double learning_rate(const OptimizerConfig& optimizer, const ScheduleConfig& schedule, int64_t step, int64_t steps);

}  // namespace mxtrain
