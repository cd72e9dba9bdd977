// Host values reduced over the ranks of a run (identities for one process). Every decision that
// ends or forks the training loop goes through here, so all ranks take it at the same step.
#pragma once
#include <functional>

#include "mxtrain/distributed/communicator.hpp"

namespace mxtrain {

class RankGroup {
 public:
  explicit RankGroup(Communicator* world) : world_(world) {}
  double sum(double value) const { return world_ ? world_->all_reduce_scalar(value, ReduceOp::sum) : value; }
  double max(double value) const { return world_ ? world_->all_reduce_scalar(value, ReduceOp::max) : value; }
  bool all(bool value) const { return max(value ? 0.0 : 1.0) == 0.0; }
  // Waits for every rank; empty for one process (CheckpointStore's barrier).
  std::function<void()> barrier() const {
    if (!world_) return {};
    Communicator* world = world_;
    return [world] { world->barrier(); };
  }

 private:
  Communicator* world_;
};

}  // namespace mxtrain
