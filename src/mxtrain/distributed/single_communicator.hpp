// The communicator of a one-process world: every collective over one rank is a copy (or
// nothing), done with the backend's own ops so it follows the compute stream on any device.
// The FSDP store runs unchanged on it, which is how world size 1 reproduces the local store.
#pragma once
#include "mxtrain/backend/backend.hpp"
#include "mxtrain/distributed/communicator.hpp"

namespace mxtrain {

class SingleProcessCommunicator final : public Communicator {
 public:
  explicit SingleProcessCommunicator(Backend& backend, std::string group_name = "world")
      : backend_(backend), group_(std::move(group_name)) {}

  std::string_view name() const override { return "single"; }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  std::string_view group() const override { return group_; }

  WorkId all_gather(const Tensor& shard, const Tensor& gathered) override;
  WorkId reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp op) override;
  WorkId all_reduce(const Tensor& data, ReduceOp op) override;
  WorkId broadcast(const Tensor& data, int root) override;
  void wait(WorkId) override {}
  void barrier() override { record(CollectiveKind::barrier, Tensor(), 0); }
  double all_reduce_scalar(double value, ReduceOp) override { return value; }
  std::unique_ptr<Communicator> split(int color, int key, std::string group_name) override;

 private:
  Backend& backend_;
  std::string group_;
  WorkId next_id_ = 1;
};

}  // namespace mxtrain
