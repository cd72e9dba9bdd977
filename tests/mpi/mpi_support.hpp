// Helpers for tests that run inside every rank of an mpirun job: a temporary directory all ranks
// share, the tiny training run, and checks of a run against a one-rank reference (losses to
// 1e-5 relative in FP32, and the final weights).
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/distributed/mpi/mpi_communicator.hpp"

namespace mxtrain::test {

// The world of the test job (MPI_COMM_WORLD duplicated).
Communicator& mpi_world();

// Made by rank 0, path broadcast to all ranks; removed by rank 0 after a barrier.
class SharedTempDir {
 public:
  SharedTempDir();
  ~SharedTempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// The run every comparison uses: a 2-block model of hidden 64, global batch 8 of 32 tokens, fp32
// on one CPU thread per rank, held-out loss at steps 3 and 6, checkpoints every 3 steps.
RunConfig tiny_run(const std::string& corpus, const std::string& run_dir, int64_t micro_batch,
                   const std::string& strategy, int64_t steps = 6);

// step -> loss and step -> val_loss of a run directory.
std::map<int64_t, double> losses(const std::string& run_dir, const std::string& key = "loss");
// The master weights of a checkpoint, whole groups (loaded at world size 1: resharding).
std::vector<std::vector<float>> checkpoint_weights(const std::string& checkpoint, const RunConfig& config);

// Expects the losses of `run_dir` for steps [first, last] to equal the reference's to `relative`.
void expect_losses_match(const std::string& run_dir, const std::string& reference_dir, int64_t first, int64_t last,
                         double relative = 1e-5, const std::string& key = "loss");
// Expects two checkpoints' weights to agree: max |a-b| <= tolerance · max |b| per group.
void expect_weights_match(const std::string& checkpoint, const std::string& reference, const RunConfig& config,
                          double tolerance = 1e-5);

}  // namespace mxtrain::test
