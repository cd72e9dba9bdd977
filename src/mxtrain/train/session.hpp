// A TrainingSession is everything one rank needs to run training steps: the backend, the
// resolved precision, the parameter store (local or sharded), the model, and the device
// buffers for tokens and scalars. `mxtrain train` adds data, metrics and checkpoints around it;
// `mxtrain bench` times it on random tokens; the planner runs it on the dryrun backend.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/model/parameters.hpp"
#include "mxtrain/model/transformer.hpp"
#include "mxtrain/train/loss_scaler.hpp"
#include "mxtrain/train/precision.hpp"

namespace mxtrain {

// Host-side tokens of one micro-batch: tokens and targets, each [batch * seq].
struct TokenBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t batch = 0, seq = 0;
};

struct StepResult {
  double loss = 0;       // mean per-token loss over the global batch
  double grad_norm = 0;  // global gradient norm before clipping
  bool skipped = false;  // fp16: the gradients overflowed and the update was skipped
  double loss_scale = 0; // fp16: the loss scale this step used (0 without loss scaling)
};

// "auto" -> "cuda" when a GPU backend is built and a GPU is present, else "cpu".
std::string resolve_device(const std::string& requested);

// The options of the backend for this run (threads, determinism, TF32).
BackendOptions backend_options(const RunConfig& config);

class Communicator;

// The parameter store of a run, initialised from train.seed: the local store when `world` is
// null (one process), otherwise the FSDP store of dist.* over `world` (collective: every rank
// calls it). local_world_size: ranks per node (hybrid_shard's default shard group). The trainer
// builds its store here, and the planner mirrors it over a FakeCommunicator.
std::unique_ptr<ParameterStore> make_parameter_store(Backend& backend, const RunConfig& config,
                                                     const PrecisionPlan& precision, Communicator* world,
                                                     int local_world_size);

class TrainingSession {
 public:
  // params: the store to train (a LocalParameterStore or an FSDP store built on `backend`).
  TrainingSession(const RunConfig& config, Backend& backend, const PrecisionPlan& precision,
                  std::unique_ptr<ParameterStore> params);

  Backend& backend() { return backend_; }
  ParameterStore& params() { return *params_; }
  Transformer& model() { return *model_; }
  const PrecisionPlan& precision() const { return precision_; }
  const RunConfig& config() const { return config_; }

  // One optimizer step over `micro_batches` (this rank's share of the global batch).
  // global_tokens: tokens of the global batch over all ranks (the loss is their mean).
  StepResult step(const std::vector<TokenBatch>& micro_batches, int64_t global_tokens, double learning_rate,
                  int64_t step_number);
  // Mean loss over the given batches (no gradients).
  double evaluate(const std::vector<TokenBatch>& batches);

  // Sum over ranks of a host value (identity for one process); set by the distributed layer.
  std::function<double(double)> all_reduce_sum = [](double value) { return value; };

 private:
  void upload(const TokenBatch& batch);

  RunConfig config_;
  Backend& backend_;
  PrecisionPlan precision_;
  std::unique_ptr<ParameterStore> params_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<LossScaler> loss_scaler_;  // fp16 only
  Buffer tokens_, targets_;        // i32 [batch * seq], reused every micro-batch
  Buffer loss_sum_, grad_norm_sq_; // f32 [1]
};

}  // namespace mxtrain
