// A communicator that moves no data and only reports what it was asked to do, for the dryrun
// planner: one simulated rank of a `world_size`-rank world. Every collective goes to the
// observer as a CollectiveRecord (kind, dtype, bytes of the full buffer, group and its size).
//
// split() cannot see the other ranks' colors, so the sizes of the groups it creates are given
// up front by name ("shard", "replicate"; unnamed groups get the parent's size), and the new
// rank is the key — callers pass dense keys 0..size-1, as the FSDP store does.
#pragma once
#include <map>

#include "mxtrain/distributed/communicator.hpp"

namespace mxtrain {

class FakeCommunicator final : public Communicator {
 public:
  FakeCommunicator(int world_size, int rank, std::map<std::string, int> group_sizes = {},
                   std::string group_name = "world");

  std::string_view name() const override { return "fake"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view group() const override { return group_; }

  WorkId all_gather(const Tensor& shard, const Tensor& gathered) override;
  WorkId reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp op) override;
  WorkId all_reduce(const Tensor& data, ReduceOp op) override;
  WorkId broadcast(const Tensor& data, int root) override;
  void wait(WorkId id) override;
  void barrier() override { record(CollectiveKind::barrier, Tensor(), 0); }
  // Every simulated rank holds the same value: sum gives size x value, average and max the value.
  double all_reduce_scalar(double value, ReduceOp op) override;
  std::unique_ptr<Communicator> split(int color, int key, std::string group_name) override;

  // Issued collectives not yet waited for (a schedule that never waits for one is a bug).
  size_t outstanding() const { return outstanding_; }

 private:
  int size_, rank_;
  std::map<std::string, int> group_sizes_;
  std::string group_;
  WorkId next_id_ = 1;
  size_t outstanding_ = 0;
  std::map<WorkId, bool> waited_;
};

}  // namespace mxtrain
