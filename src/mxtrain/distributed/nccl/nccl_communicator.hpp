// The NCCL communicator for GPU ranks. Each communicator owns one communication stream; a
// collective first makes that stream wait for everything queued so far on the backend's
// compute stream (the ordering contract of communicator.hpp), runs there, and records an
// event; wait(id) makes the compute stream wait for that event, so nothing blocks the host.
//
// NCCL serialises all operations of one communicator, even on different streams, so the FSDP
// store gathers on one communicator and reduces on another (split from the same ranks): the
// next block's all-gather then overlaps this block's reduce-scatter.
#pragma once
#include <cuda_runtime_api.h>
#include <nccl.h>

#include <map>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/distributed/communicator.hpp"

namespace mxtrain {

class NcclCommunicator final : public Communicator {
 public:
  // Takes ownership of `comm`. compute_stream: the backend's stream.
  NcclCommunicator(Backend& backend, cudaStream_t compute_stream, ncclComm_t comm, std::string group_name);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  std::string_view name() const override { return "nccl"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string_view group() const override { return group_; }

  WorkId all_gather(const Tensor& shard, const Tensor& gathered) override;
  WorkId reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp op) override;
  WorkId all_reduce(const Tensor& data, ReduceOp op) override;
  WorkId broadcast(const Tensor& data, int root) override;
  void wait(WorkId id) override;
  void barrier() override;
  double all_reduce_scalar(double value, ReduceOp op) override;
  std::unique_ptr<Communicator> split(int color, int key, std::string group_name) override;

 private:
  void follow_compute();   // communication stream waits for the compute stream's queued work
  WorkId complete();       // records the completion event of the collective just queued

  Backend& backend_;
  cudaStream_t compute_stream_;
  cudaStream_t stream_ = nullptr;
  ncclComm_t comm_;
  int rank_ = 0, size_ = 1;
  std::string group_;
  cudaEvent_t compute_ready_ = nullptr;
  std::map<WorkId, cudaEvent_t> in_flight_;
  std::vector<cudaEvent_t> spare_events_;
  WorkId next_id_ = 1;
  Buffer scalar_;                 // 8 bytes on the device for all_reduce_scalar / barrier
  double* host_scalar_ = nullptr; // pinned
};

}  // namespace mxtrain
