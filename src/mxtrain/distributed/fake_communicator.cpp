#include "mxtrain/distributed/fake_communicator.hpp"

#include "mxtrain/core/error.hpp"

namespace mxtrain {

FakeCommunicator::FakeCommunicator(int world_size, int rank, std::map<std::string, int> group_sizes,
                                   std::string group_name)
    : size_(world_size), rank_(rank), group_sizes_(std::move(group_sizes)), group_(std::move(group_name)) {
  MXTRAIN_ASSERT(size_ >= 1 && rank_ >= 0 && rank_ < size_, "fake communicator rank %d of %d", rank_, size_);
}

WorkId FakeCommunicator::all_gather(const Tensor& shard, const Tensor& gathered) {
  MXTRAIN_ASSERT(gathered.numel() == shard.numel() * size_, "all_gather: %s -> %s over %d ranks",
                 shard.describe().c_str(), gathered.describe().c_str(), size_);
  record(CollectiveKind::all_gather, gathered, gathered.bytes());
  waited_[next_id_] = false;
  ++outstanding_;
  return next_id_++;
}

WorkId FakeCommunicator::reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp) {
  MXTRAIN_ASSERT(full.numel() == shard.numel() * size_, "reduce_scatter: %s -> %s over %d ranks",
                 full.describe().c_str(), shard.describe().c_str(), size_);
  record(CollectiveKind::reduce_scatter, full, full.bytes());
  waited_[next_id_] = false;
  ++outstanding_;
  return next_id_++;
}

WorkId FakeCommunicator::all_reduce(const Tensor& data, ReduceOp) {
  record(CollectiveKind::all_reduce, data, data.bytes());
  waited_[next_id_] = false;
  ++outstanding_;
  return next_id_++;
}

WorkId FakeCommunicator::broadcast(const Tensor& data, int root) {
  MXTRAIN_ASSERT(root >= 0 && root < size_, "broadcast root %d of %d", root, size_);
  record(CollectiveKind::broadcast, data, data.bytes());
  waited_[next_id_] = false;
  ++outstanding_;
  return next_id_++;
}

void FakeCommunicator::wait(WorkId id) {
  // Waiting for id covers everything issued before it, as on a real communicator.
  for (auto it = waited_.begin(); it != waited_.end() && it->first <= id;) {
    --outstanding_;
    it = waited_.erase(it);
  }
}

double FakeCommunicator::all_reduce_scalar(double value, ReduceOp op) {
  return op == ReduceOp::sum ? value * size_ : value;
}

std::unique_ptr<Communicator> FakeCommunicator::split(int, int key, std::string group_name) {
  auto found = group_sizes_.find(group_name);
  const int size = found != group_sizes_.end() ? found->second : size_;
  MXTRAIN_ASSERT(size >= 1 && size_ % size == 0, "fake split into group '%s' of %d ranks from %d", group_name.c_str(),
                 size, size_);
  MXTRAIN_ASSERT(key >= 0 && key < size, "fake split needs dense keys: key %d for a group of %d", key, size);
  auto child = std::make_unique<FakeCommunicator>(size, key, group_sizes_, std::move(group_name));
  child->set_observer(observer_);
  return child;
}

}  // namespace mxtrain
