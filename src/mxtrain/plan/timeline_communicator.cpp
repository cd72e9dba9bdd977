#include "mxtrain/plan/timeline_communicator.hpp"

namespace mxtrain {

TimelineCommunicator::TimelineCommunicator(std::unique_ptr<Communicator> inner, CommunicationListener& listener,
                                           std::shared_ptr<int> next_channel)
    : inner_(std::move(inner)), listener_(listener), next_channel_(std::move(next_channel)),
      channel_((*next_channel_)++) {
  inner_->set_observer(this);
  listener_.on_communicator_created(channel_);
}

WorkId TimelineCommunicator::issued(WorkId id) {
  listener_.on_issue(channel_, id, last_);
  return id;
}

WorkId TimelineCommunicator::all_gather(const Tensor& shard, const Tensor& gathered) {
  return issued(inner_->all_gather(shard, gathered));
}

WorkId TimelineCommunicator::reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp op) {
  return issued(inner_->reduce_scatter(full, shard, op));
}

WorkId TimelineCommunicator::all_reduce(const Tensor& data, ReduceOp op) { return issued(inner_->all_reduce(data, op)); }

WorkId TimelineCommunicator::broadcast(const Tensor& data, int root) { return issued(inner_->broadcast(data, root)); }

void TimelineCommunicator::wait(WorkId id) {
  inner_->wait(id);
  listener_.on_wait(channel_, id);
}

void TimelineCommunicator::barrier() {
  inner_->barrier();
  listener_.on_issue(channel_, 0, last_);
}

std::unique_ptr<Communicator> TimelineCommunicator::split(int color, int key, std::string group_name) {
  return std::make_unique<TimelineCommunicator>(inner_->split(color, key, std::move(group_name)), listener_,
                                                next_channel_);
}

}  // namespace mxtrain
