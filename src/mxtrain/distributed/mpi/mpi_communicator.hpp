// The Open MPI communicator for CPU ranks (processes started by mpirun). Collectives are MPI-3
// non-blocking calls on host buffers; wait(id) completes them and applies what MPI lacks
// (average = sum / size; BF16/FP16 sums through our own MPI_Op on 16-bit words).
//
// MPI_Finalize is called only after a successful run (finish_communication()): a rank that
// fails exits without it, so mpirun ends the job instead of the failed rank waiting in
// MPI_Finalize for peers that are stuck in a collective.
#pragma once
#include <mpi.h>

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "mxtrain/distributed/communicator.hpp"

namespace mxtrain {

// Initialises MPI once per process (MPI_THREAD_FUNNELED: only the main thread calls MPI).
void ensure_mpi_initialized();
// Size of MPI_COMM_WORLD (initialising MPI if needed).
int mpi_world_size();
int mpi_world_rank();
// Rank 0's bytes on every rank of MPI_COMM_WORLD (the NCCL unique id under mpirun).
std::string mpi_broadcast_bytes(const std::string& bytes_on_rank0);
// Finalises MPI if it was initialised and is not yet finalised; later calls are no-ops.
void finalize_mpi();

class MpiCommunicator final : public Communicator {
 public:
  // MPI_COMM_WORLD duplicated, so mxtrain's traffic never mixes with other users of MPI.
  static std::unique_ptr<MpiCommunicator> world();
  // Takes ownership of `comm` (freed by the destructor).
  MpiCommunicator(MPI_Comm comm, std::string group_name);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

  std::string_view name() const override { return "mpi"; }
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
  struct Pending {
    MPI_Request request = MPI_REQUEST_NULL;
    std::function<void()> finish;  // runs once the request completed (average scaling)
  };
  WorkId start(MPI_Request request, std::function<void()> finish = {});

  MPI_Comm comm_;
  int rank_ = 0, size_ = 1;
  std::string group_;
  std::map<WorkId, Pending> pending_;
  WorkId next_id_ = 1;
};

}  // namespace mxtrain
