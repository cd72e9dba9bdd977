// The training loop: data → micro-batches → TrainingSession::step → metrics, held-out loss and
// checkpoints; resume from the newest valid checkpoint; stop safely on SIGTERM/SIGINT.
#pragma once
#include <functional>
#include <memory>
#include <string>

#include <nlohmann/json_fwd.hpp>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/runtime/rank_environment.hpp"

namespace mxtrain {

class Communicator;

struct TrainerContext {
  // Who this rank is (runtime/rank_environment.hpp); one process by default.
  runtime::RankEnvironment environment;
  // The world to train over. Null: the trainer creates it from `environment` and dist.backend
  // (none for one process with dist.backend = auto, which trains on the local store). Given (tests,
  // embedders): its rank and size win over `environment`, and the FSDP store is used.
  Communicator* communicator = nullptr;
  std::string source_dir;  // fallback base for relative data paths
  // The planner's prediction for this run, written to RUN_DIR/plan.json at start for the run
  // report (the cli wires plan/ in: it sits above train/). Called on rank 0 with the run's config
  // (train.precision resolved) and the GPU catalog key of the run's device ("" on a CPU or an
  // unknown GPU; the callee picks one); it may throw (the report then says why there is no
  // prediction). Empty: no plan.json.
  std::function<nlohmann::json(const RunConfig& config, const std::string& gpu_key, int gpus)> predict;
  // Makes the run's token shards before they are opened (a SageMaker job's raw-text channels):
  // local rank 0 of every node runs it while the other ranks wait; if it fails anywhere, every
  // rank stops with an error. Empty: the shards exist already.
  std::function<void()> prepare_data;
};

struct TrainerSummary {
  int64_t steps_done = 0;
  double final_loss = 0;
  double final_val_loss = -1;     // < 0 when there is no validation set
  double tokens_per_s = 0;        // mean over the timed steps after the first
  std::string run_dir, checkpoint, metrics_path;
  bool stopped_by_signal = false;
};

class Trainer {
 public:
  Trainer(RunConfig config, TrainerContext context);
  TrainerSummary run();

 private:
  RunConfig config_;
  TrainerContext context_;
};

// The run directory: checkpoint.dir, or runs/<model.preset> when empty.
std::string run_directory(const RunConfig& config);

}  // namespace mxtrain
