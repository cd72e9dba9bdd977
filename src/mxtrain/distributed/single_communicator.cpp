#include "mxtrain/distributed/single_communicator.hpp"

#include "mxtrain/core/error.hpp"

namespace mxtrain {

WorkId SingleProcessCommunicator::all_gather(const Tensor& shard, const Tensor& gathered) {
  MXTRAIN_ASSERT(gathered.numel() == shard.numel() && gathered.dtype == shard.dtype, "all_gather: %s -> %s",
                 shard.describe().c_str(), gathered.describe().c_str());
  record(CollectiveKind::all_gather, gathered, gathered.bytes());
  if (shard.data != gathered.data) backend_.copy(shard, gathered);
  return next_id_++;
}

WorkId SingleProcessCommunicator::reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp) {
  MXTRAIN_ASSERT(full.numel() == shard.numel() && full.dtype == shard.dtype, "reduce_scatter: %s -> %s",
                 full.describe().c_str(), shard.describe().c_str());
  record(CollectiveKind::reduce_scatter, full, full.bytes());
  // Sum, average and max over one rank are all the identity.
  if (full.data != shard.data) backend_.copy(full, shard);
  return next_id_++;
}

WorkId SingleProcessCommunicator::all_reduce(const Tensor& data, ReduceOp) {
  record(CollectiveKind::all_reduce, data, data.bytes());
  return next_id_++;
}

WorkId SingleProcessCommunicator::broadcast(const Tensor& data, int root) {
  MXTRAIN_ASSERT(root == 0, "broadcast from rank %d in a world of one", root);
  record(CollectiveKind::broadcast, data, data.bytes());
  return next_id_++;
}

std::unique_ptr<Communicator> SingleProcessCommunicator::split(int, int, std::string group_name) {
  auto child = std::make_unique<SingleProcessCommunicator>(backend_, std::move(group_name));
  child->set_observer(observer_);
  return child;
}

}  // namespace mxtrain
