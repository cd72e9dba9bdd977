// Communicator: the collectives FSDP needs, asynchronous on backend buffers. Implementations:
// NCCL (GPU, dist/nccl/), Open MPI (CPU, dist/mpi/), single-process, and a fake one that only
// records (the dryrun planner). Communication stays behind this interface so the same FSDP
// schedule runs on GPUs, on CPU processes and in the planner.
//
// Ordering contract: a collective starts after all work the backend has queued before the call
// (compute stream order on GPUs); it may run concurrently with work queued after it, until
// wait(id) makes later work wait for it. Every rank issues the same collectives in the same order.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "mxtrain/core/tensor.hpp"

namespace mxtrain {

enum class ReduceOp : uint8_t { sum, average, max };
enum class CollectiveKind : uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, barrier };
const char* collective_kind_name(CollectiveKind kind);

struct CollectiveRecord {
  CollectiveKind kind;
  DType dtype;
  uint64_t bytes = 0;      // size of the full (gathered / unreduced) buffer on one rank
  int group_size = 1;
  std::string group;       // "world", "shard", "replicate"
};

class CollectiveObserver {
 public:
  virtual ~CollectiveObserver() = default;
  virtual void on_collective(const CollectiveRecord& record) = 0;
};

using WorkId = uint64_t;

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual std::string_view name() const = 0;  // "nccl", "mpi", "single", "fake"
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view group() const { return "world"; }

  // gathered = concatenation of every rank's shard, in rank order (gathered.numel = size * shard.numel).
  virtual WorkId all_gather(const Tensor& shard, const Tensor& gathered) = 0;
  // shard = op over ranks of full's slice [rank * shard.numel, (rank + 1) * shard.numel).
  virtual WorkId reduce_scatter(const Tensor& full, const Tensor& shard, ReduceOp op) = 0;
  virtual WorkId all_reduce(const Tensor& data, ReduceOp op) = 0;
  virtual WorkId broadcast(const Tensor& data, int root) = 0;
  // Later work waits for collective `id` (and everything issued before it).
  virtual void wait(WorkId id) = 0;
  // Host-blocking.
  virtual void barrier() = 0;
  virtual double all_reduce_scalar(double value, ReduceOp op) = 0;
  // Ranks with the same color form a new communicator, ranked by key (MPI_Comm_split semantics).
  virtual std::unique_ptr<Communicator> split(int color, int key, std::string group_name) = 0;

  void set_observer(CollectiveObserver* observer) { observer_ = observer; }

 protected:
  void record(CollectiveKind kind, const Tensor& tensor, uint64_t bytes) const {
    if (observer_) observer_->on_collective(CollectiveRecord{kind, tensor.dtype, bytes, size(), std::string(group())});
  }
  CollectiveObserver* observer_ = nullptr;
};

}  // namespace mxtrain
