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
#include "mxtrain/train/optimizer.hpp"
#include "mxtrain/train/precision.hpp"

namespace mxtrain {

namespace data {
struct Batch;
}

// Host-side tokens of one micro-batch: tokens and targets, each [batch * seq].
struct TokenBatch {
  const int32_t* tokens = nullptr;
  const int32_t* targets = nullptr;
  int64_t batch = 0, seq = 0;
};

// The session's views of loaded micro-batches (which must outlive them).
std::vector<TokenBatch> token_batch_views(const std::vector<data::Batch>& batches);

struct StepResult {
  double loss = 0;       // mean per-token loss over the global batch
  double grad_norm = 0;  // global gradient norm before clipping
  bool skipped = false;  // the update was skipped: fp16 overflow, or non-finite under train.nonfinite = skip
  bool nonfinite = false;  // skipped because the loss or the gradient norm was NaN/Inf (train.nonfinite = skip)
  int64_t nonfinite_skips = 0;  // such skips since this session started
  double loss_scale = 0; // fp16: the loss scale this step used (0 without loss scaling)
};

// "auto" -> "cuda" when a GPU backend is built and a GPU is present, else "cpu".
std::string resolve_device(const std::string& requested);

// train.attention_backward and train.gemm_kernels as a run takes them on a GPU of compute
// capability `capability` (0: no GPU) with this build's kernels (carried_kernels()). An explicit
// value stays; `auto` (the default) takes the fastest path measured on the H200 where it can run:
// FlashAttention-4's backward where the build carries its kernels for the model's attention
// shape (head dimension, query heads per key/value head), the GPU is a Hopper (sm_90), the
// activations are bf16, the sequence is longer than 128 tokens and the run is not deterministic,
// else "cudnn"; quack's gated SwiGLU GEMM for a llama ("cublaslt+quack-swiglu"), its GELU GEMMs
// for a GPT-2 ("cublaslt+quack-gelu", measured on an H100), where the build carries them, the GPU
// is a Hopper and the run is not deterministic, else "cublaslt" (docs/attention.md,
// docs/gemm-kernels.md).
// The planner asks with the GPU it plans for, so it plans what this binary would run there.
std::string attention_backward_of(const RunConfig& config, int capability);
std::string gemm_kernels_of(const RunConfig& config, int capability);
// Whether a gemm_kernels value runs llama's SwiGLU forward / GPT-2's GELU GEMMs on quack's kernels.
bool quack_swiglu_in(const std::string& gemm_kernels);
bool quack_gelu_in(const std::string& gemm_kernels);
// train.head_loss as a run takes it: auto is "chunked".
std::string head_loss_of(const RunConfig& config, int capability);
// "kernels: attention backward flash-attention-4 (auto), GEMMs cublaslt+quack-swiglu (auto)": what
// a cuda run takes, and which settings `auto` decided; on a Hopper GPU, also which kernels auto
// would have taken but this build lacks, and how to build them.
std::string kernels_startup_line(const RunConfig& config, int capability);

// The options of the backend for this run (threads, determinism, TF32, the kernels above on the
// run's GPU).
BackendOptions backend_options(const RunConfig& config);

class Communicator;

// The parameter store of a run, initialised from train.seed: the local store when `world` is
// null (one process), otherwise the FSDP store of dist.* over `world` (collective: every rank
// calls it). local_world_size: ranks per node (hybrid_shard's default shard group). The trainer
// builds its store here, and the planner mirrors it over a FakeCommunicator.
std::unique_ptr<ParameterStore> make_parameter_store(Backend& backend, const RunConfig& config,
                                                     const PrecisionPlan& precision, Communicator* world,
                                                     int local_world_size);

// The host values a bit-identical resume needs besides the parameters and the recipe's device
// buffers: fp16's loss scale and its clean steps, and the random streams NVFP4's stochastic
// rounding has drawn.
struct PrecisionResumeValues {
  double loss_scale = 0;  // 0: no loss scaling
  int64_t loss_scale_clean_steps = 0;
  uint64_t rounding_streams = 0;
};

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
  // step() = launch_step(), then last_result().
  StepResult step(const std::vector<TokenBatch>& micro_batches, int64_t global_tokens, double learning_rate,
                  int64_t step_number);
  // The step's device work, enqueued; returns without reading its results, so the host can
  // prepare and enqueue the next step while this one runs (`mxtrain bench`'s timed steps, as a
  // PyTorch loop that never calls loss.item()). A replayed graph waits only until the previous
  // replay has read its host inputs; fp16's loss scaling reads the norm within the step.
  void launch_step(const std::vector<TokenBatch>& micro_batches, int64_t global_tokens, double learning_rate,
                   int64_t step_number);
  // What the last launched step reported (waits for it). train.nonfinite = stop: throws
  // Error(numerics) if its loss or gradient norm is not finite (before the caller saves anything);
  // skip: a non-finite step's update was dropped, and more than train.nonfinite_max_skips such
  // steps in a row throw.
  StepResult last_result();
  // Mean loss over the given batches (no gradients).
  double evaluate(const std::vector<TokenBatch>& batches);
  // Whether the last step replayed a captured step graph (train.cuda_graph).
  bool replayed_graph() const { return replayed_; }

  // What checkpoints keep so that a resumed run continues bit-identically: the recipe's device
  // buffers by name (FP8 delayed scaling's amax histories and scales; this rank's own), and the
  // host values. restore_resume_values() is for a resumed run, before its first step.
  std::vector<std::pair<std::string, Tensor>> resume_buffers() { return model_->linears().resume_state(); }
  PrecisionResumeValues resume_values() const;
  void restore_resume_values(const PrecisionResumeValues& values);

  // Sum over ranks of a host value (identity for one process); set by the distributed layer.
  std::function<double(double)> all_reduce_sum = [](double value) { return value; };

 private:
  void upload(const TokenBatch& batch);
  // The device work of one step; returns false if fp16's loss scaler skipped the update.
  // captured: host inputs come from host_tokens_/host_targets_/host_step_factors_ (which a
  // replay re-reads) and the optimizer takes its learning-rate factors from step_factors_.
  // loss_scale: fp16's scale in effect for this step (1 without scaling), read by launch_step.
  bool run_step(const std::vector<TokenBatch>& micro_batches, int64_t global_tokens, double learning_rate,
                int64_t step_number, bool captured, float loss_scale);
  // Forward and backward of every micro-batch, the loss summed into loss_sum_ and the gradients,
  // multiplied by grad_scale, into the store; captured: tokens from the staged host copies.
  void forward_backward(const std::vector<TokenBatch>& micro_batches, float grad_scale, bool captured);
  // fp16: unscales the squared norm (clipping reads the unscaled one), has the update unscale the
  // gradients, and returns whether to apply it (an inf/NaN norm: the scaled gradients overflowed).
  bool unscale(float loss_scale, int64_t step_number, AdamWArgs& args);
  void stage_graph_inputs(const std::vector<TokenBatch>& micro_batches, double learning_rate, int64_t step_number);
  // train.nonfinite = skip: whether this step's loss and gradient norm are finite (reads both on
  // the host before the update; the loss summed over ranks).
  bool step_is_finite();
  // Test hook MXT_TEST_NAN_GRADIENT_STEPS=FIRST[-LAST]: the gradients of those steps are NaN.
  void inject_nan_gradients(int64_t step_number);

  RunConfig config_;
  Backend& backend_;
  PrecisionPlan precision_;
  std::unique_ptr<ParameterStore> params_;
  std::unique_ptr<Transformer> model_;
  std::unique_ptr<LossScaler> loss_scaler_;  // fp16 only
  std::unique_ptr<Optimizer> optimizer_;
  bool skip_nonfinite_ = false;     // train.nonfinite = skip
  int64_t nonfinite_in_a_row_ = 0, nonfinite_skips_ = 0;
  int64_t nan_gradient_first_ = 0, nan_gradient_last_ = -1;  // the test hook's steps
  Buffer tokens_, targets_;        // i32 [batch * seq], reused every micro-batch
  Buffer loss_sum_;                // f32 [1]
  Buffer step_scalars_;            // f32 [4]: grad_norm_sq_, then step_factors_
  Tensor grad_norm_sq_;            // f32 [1]

  // Step graphs (train.cuda_graph): after kEagerSteps steps op by op, one step is captured and
  // later steps of the same shape replay it, until the backend reports it stale (memory was
  // allocated outside it, e.g. by evaluate) or the shape changes; then the count starts over.
  static constexpr int kEagerSteps = 2;
  struct GraphShape {
    int64_t micro_batches = 0, batch = 0, seq = 0, global_tokens = 0;
    bool operator==(const GraphShape&) const = default;
  };
  // Captures whose FP8 weight copies did not repeat their addresses (drop_unrepeated_capture),
  // and how many of those end the optimizer's weight casts.
  static constexpr int kUnrepeatedCaptures = 3;
  int unrepeated_captures_ = 0;
  void drop_unrepeated_capture();
  bool graph_eligible_ = false;
  bool graph_ready_ = false;
  bool replayed_ = false;
  int eager_steps_ = 0;
  GraphShape graph_shape_;
  std::vector<std::vector<int32_t>> host_tokens_, host_targets_;  // the captured copies' sources
  float host_step_factors_[3] = {};
  Tensor step_factors_;  // f32 [3]: AdamWArgs::step_factors of a captured step

  // The last launched step, for last_result().
  struct Launched {
    int64_t step_number = 0, global_tokens = 0;
    bool applied = true;
    bool nonfinite = false;  // dropped by train.nonfinite = skip
    float loss_scale = 0;
  };
  Launched launched_;
  bool launched_nonfinite_ = false;  // set by run_step for launched_
};

}  // namespace mxtrain
