// The planner's stand-in for a rank's world communicator: a FakeCommunicator (which moves no data
// and knows the sizes of the groups FSDP splits off) wrapped so that every collective's issue and
// every wait reach a listener with the communicator they belong to. The planner replays those
// dependencies to find how much communication the FSDP schedule hides behind compute.
#pragma once
#include <memory>

#include "mxtrain/distributed/communicator.hpp"

namespace mxtrain {

class CommunicationListener {
 public:
  virtual ~CommunicationListener() = default;
  virtual void on_communicator_created(int channel) = 0;
  // Collective `id` of communicator `channel` was issued (after all compute queued so far).
  virtual void on_issue(int channel, WorkId id, const CollectiveRecord& record) = 0;
  // Later compute waits for collective `id` of `channel` and everything issued before it there.
  virtual void on_wait(int channel, WorkId id) = 0;
};

class TimelineCommunicator final : public Communicator, private CollectiveObserver {
 public:
  // Takes ownership of `inner`; `next_channel` numbers the communicators of one world.
  TimelineCommunicator(std::unique_ptr<Communicator> inner, CommunicationListener& listener,
                       std::shared_ptr<int> next_channel);

  std::string_view name() const override { return inner_->name(); }
  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  std::string_view group() const override { return inner_->group(); }
  WorkId all_gather(const Tensor& shard, const Tensor& gathered) override;
  WorkId reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp op) override;
  WorkId all_reduce(const Tensor& data, ReduceOp op) override;
  WorkId broadcast(const Tensor& data, int root) override;
  void wait(WorkId id) override;
  void barrier() override;
  double all_reduce_scalar(double value, ReduceOp op) override { return inner_->all_reduce_scalar(value, op); }
  std::unique_ptr<Communicator> split(int color, int key, std::string group_name) override;

 private:
  void on_collective(const CollectiveRecord& record) override { last_ = record; }
  WorkId issued(WorkId id);

  std::unique_ptr<Communicator> inner_;
  CommunicationListener& listener_;
  std::shared_ptr<int> next_channel_;
  int channel_;
  CollectiveRecord last_{};
};

}  // namespace mxtrain
