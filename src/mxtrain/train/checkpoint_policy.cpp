#include "mxtrain/train/checkpoint_policy.hpp"

#include "mxtrain/train/stop_signal.hpp"

namespace mxtrain {

CheckpointPolicy::CheckpointPolicy(const CheckpointConfig& config, int64_t last_step, const RankGroup& ranks)
    : config_(config), last_step_(last_step), ranks_(ranks) {}

CheckpointAction CheckpointPolicy::after_step(int64_t step, bool must_stop) {
  const bool periodic = config_.every > 0 && step % config_.every == 0;
  const bool timed = config_.every_minutes > 0 &&
                     std::chrono::duration<double>(Clock::now() - last_save_).count() >= 60 * config_.every_minutes;
  // All ranks stop (2) or take a timed checkpoint (1) at the same step, whichever rank saw it.
  const double agreed = ranks_.max(stop_requested() || must_stop ? 2.0 : (timed ? 1.0 : 0.0));
  if (agreed >= 2.0) return CheckpointAction::save_and_stop;
  return (periodic || agreed >= 1.0) && step < last_step_ ? CheckpointAction::save : CheckpointAction::none;
}

}  // namespace mxtrain
