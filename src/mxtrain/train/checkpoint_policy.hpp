// When the training loop saves: every checkpoint.every steps, once checkpoint.every_minutes have
// passed since the last save, and on SIGTERM/SIGINT (then it also stops). The final step is
// left to the loop's closing save. A timed checkpoint or a signal seen by any rank is taken by
// every rank at the same step: the decision is one max all-reduce a step. A rank that cannot
// write its outputs (a full disk) stops the run the same way.
#pragma once
#include <chrono>
#include <cstdint>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/train/rank_group.hpp"

namespace mxtrain {

enum class CheckpointAction { none, save, save_and_stop };

class CheckpointPolicy {
 public:
  // last_step: train.steps, whose checkpoint the loop writes when it ends.
  CheckpointPolicy(const CheckpointConfig& config, int64_t last_step, const RankGroup& ranks);

  // After step `step`. Collective: every rank calls it after every step. must_stop: this rank
  // cannot go on (its outputs cannot be written): all ranks save and stop, as on a signal.
  CheckpointAction after_step(int64_t step, bool must_stop = false);
  // A checkpoint was just written: the timed interval starts again.
  void saved() { last_save_ = Clock::now(); }

 private:
  using Clock = std::chrono::steady_clock;
  CheckpointConfig config_;
  int64_t last_step_;
  const RankGroup& ranks_;
  Clock::time_point last_save_ = Clock::now();
};

}  // namespace mxtrain
