// Host values reduced over the ranks of a run (identities for one process). Every decision that
// ends or forks the training loop goes through here, so all ranks take it at the same step.
#pragma once
#include <functional>
#include <optional>

#include "mxtrain/distributed/communicator.hpp"

namespace mxtrain {

// What every rank learns when some ranks failed at a point all of them reach: how many, the lowest
// of them, and that rank's reason as a number (an errno, say).
struct RankFailures {
  int count = 0;
  int first_rank = -1;
  int first_code = 0;
};

class RankGroup {
 public:
  explicit RankGroup(Communicator* world) : world_(world) {}
  double sum(double value) const { return world_ ? world_->all_reduce_scalar(value, ReduceOp::sum) : value; }
  double max(double value) const { return world_ ? world_->all_reduce_scalar(value, ReduceOp::max) : value; }
  bool all(bool value) const { return max(value ? 0.0 : 1.0) == 0.0; }
  // Collective: `failure` is this rank's reason code (0 to 2^31 - 1) when it failed, none when it
  // did not. One reduction when no rank failed, three when some did.
  RankFailures failures(int rank, int world_size, std::optional<int> failure) const {
    RankFailures result;
    result.count = static_cast<int>(sum(failure ? 1.0 : 0.0));
    if (result.count == 0) return result;
    result.first_rank = world_size - static_cast<int>(max(failure ? world_size - rank : 0));
    result.first_code = static_cast<int>(max(failure && rank == result.first_rank ? *failure : 0));
    return result;
  }
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
