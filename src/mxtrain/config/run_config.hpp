// A training run as data: one struct per config section and ONE field list (fields()) that TOML
// parsing, --set/--flag and MXTRAIN_* overrides, the printed "effective config", the JSON saved
// with checkpoints and the resume check all use (docs/conventions.md #6). Adding a key = one line in fields().
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mxtrain/model/config.hpp"

namespace mxtrain {

struct DataConfig {
  std::string train = "data/fortunes/train_*.bin";
  std::string val = "data/fortunes/val_*.bin";
  std::string tokenizer = "byte";
};

struct TrainConfig {
  std::string device = "auto";       // auto | cpu | cuda
  std::string precision = "auto";    // auto (bf16 on cuda, fp32 on cpu) | fp32 | bf16 | fp16 | fp8 | fp8-current | mxfp8 | nvfp4
  std::string recompute = "none";    // none | selective | full | K
  int64_t steps = 300;
  int64_t micro_batch_size = 16;     // sequences per micro-batch per rank
  int64_t global_batch_size = 0;     // sequences per optimizer step; 0 = micro_batch_size * world size
  int64_t seq_len = 256;
  int64_t seed = 1337;
  int64_t threads = 0;               // cpu threads; 0 = all cores
  int64_t logits_chunk_tokens = 0;  // 0 = auto (Transformer::logits_chunk_rows)
  bool tf32 = false;                 // fp32 precision on cuda: TF32 tensor-core GEMMs
  bool deterministic = false;        // deterministic attention backward on cuda
  // cuda: auto | cudnn | flash-attention-4 (FlashAttention-4's backward after cuDNN's forward; a
  // build with its kernels, docs/attention.md). auto: FlashAttention-4's where it can run
  // (attention_backward_of in train/session.hpp), else cuDNN's.
  std::string attention_backward = "auto";
  // auto | cublaslt | cublaslt+quack-swiglu | cublaslt+quack-gelu | cublaslt+quack
  // (docs/gemm-kernels.md). auto: quack's gated SwiGLU GEMM for a Llama, its GELU GEMMs for a GPT-2,
  // where the build carries them, the GPU is a Hopper and the run is not deterministic
  // (gemm_kernels_of in train/session.hpp), else cuBLASLt alone.
  std::string gemm_kernels = "auto";
  // auto | chunked | quack-lce: the LM head and its loss (docs/gemm-kernels.md). chunked: per chunk
  // of rows the logits GEMM, the cross-entropy kernel in place and the two gradient GEMMs;
  // quack-lce: quack's scaled-exp linear cross-entropy (a build with its kernels, a Hopper GPU,
  // BF16). auto: chunked (head_loss_of in train/session.hpp).
  std::string head_loss = "auto";
  bool gemm_autotune = true;         // cuda: time cuBLASLt's candidates per GEMM shape, keep the fastest
  bool cuda_graph = true;            // cuda: capture the steady-state step in a CUDA graph and replay it
  std::string nonfinite = "stop";    // a NaN/Inf loss or gradient norm: stop (before any save) | skip the update
  int64_t nonfinite_max_skips = 5;   // skip: more non-finite steps in a row than this stop the run

  // Sequences per optimizer step over `world_size` ranks: global_batch_size, or one micro-batch a rank.
  int64_t global_batch(int64_t world_size) const {
    return global_batch_size ? global_batch_size : micro_batch_size * world_size;
  }
};

// How train.precision's recipe runs (docs/numerics-reference.md §2; docs/precision.md).
struct PrecisionConfig {
  std::string fp8_format = "auto";          // auto (hybrid for fp8, e4m3 for mxfp8) | hybrid | e4m3
  int64_t amax_history_len = 1024;          // fp8 delayed scaling window (TE's default)
  std::string amax_compute_algo = "max";    // max | most_recent
  int64_t margin = 0;                       // scale = fp8_max · 2^-margin / amax
  std::string bf16_first_layers = "auto";   // blocks kept in BF16 at the start: auto (0) or a count
  std::string bf16_last_layers = "auto";    // at the end: auto (nvfp4: min(4, layers/4); others 0) or a count
  // No BF16 copy of the quantized blocks' weights (nor of an untied token table): the casts read
  // the FP32 masters. auto = true for a quantized recipe on one process (precision.cpp).
  std::string quantized_weights = "auto";   // auto | true | false
  std::string grad_dtype = "auto";          // the blocks' gradients: auto | f32 | bf16 (precision.cpp)
  std::string mx_scale_rounding = "rceil";  // rceil (TE, cuBLAS) | floor (OCP MX v1.0)
  bool nvfp4_rht = true;                    // 16-point RHT on the wgrad operands
  bool nvfp4_stochastic_rounding = true;    // of gradients
  bool nvfp4_2d_weights = true;             // 16x16 weight tiles
  bool fp8_optimizer_weight_casts = true;   // fp8: AdamW writes the next forward's FP8 weight copies
  double loss_scale_init = 65536;           // fp16 dynamic loss scaling (PyTorch GradScaler's defaults)
  int64_t loss_scale_growth_interval = 2000;
  double loss_scale_backoff = 0.5;
  double loss_scale_growth = 2.0;
};

struct OptimizerConfig {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // max global gradient norm; 0 = off
};

struct ScheduleConfig {
  int64_t warmup_steps = 20;
  std::string decay = "cosine";  // cosine | linear | constant
  double min_lr_ratio = 0.1;     // floor of the decay as a fraction of optimizer.lr
};

struct EvalConfig {
  int64_t every = 50;    // held-out loss every N steps (and at the end); 0 = only at the end
  int64_t batches = 8;   // micro-batches of validation per evaluation
};

struct LogConfig {
  int64_t every = 1;            // a step line every N steps
  std::string metrics = "metrics.jsonl";  // in the run directory
  bool all_ranks = false;       // step lines from every rank, not only rank 0
  bool tensorboard = true;      // TensorBoard event files in <run directory>/tensorboard (rank 0)
  int64_t sample_every = 0;     // a generated sample every N steps (0 = none), as llm.c prints
  int64_t sample_tokens = 64;   // tokens per sample
  std::string sample_prompt = "The";
};

struct CheckpointConfig {
  std::string dir = "";          // run directory; "" = runs/<model.preset>
  int64_t every = 100;           // steps between checkpoints; 0 = only at the end
  double every_minutes = 0;      // also checkpoint when this many minutes passed; 0 = off
  int64_t keep = 3;              // newest checkpoints kept
  std::string resume = "auto";   // auto (resume if the run directory has one) | always | never
  double stop_deadline_s = 100;  // on SIGTERM/SIGINT: finish the step, save, exit 0 within this time
};

struct DistConfig {
  std::string strategy = "full_shard";  // full_shard | shard_grad_op | no_shard | hybrid_shard
  std::string backend = "auto";         // auto (nccl on cuda, mpi on cpu) | nccl | mpi
  std::string reduce_dtype = "f32";     // f32 | bf16
  int64_t shard_group_size = 0;         // hybrid_shard: ranks per shard group; 0 = ranks per node
  bool sync_every_micro_batch = true;   // false: reduce gradients only on the last micro-batch
};

struct RunConfig {
  ModelConfig model = model_preset("tiny");
  DataConfig data;
  TrainConfig train;
  PrecisionConfig precision;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  EvalConfig eval;
  LogConfig log;
  CheckpointConfig checkpoint;
  DistConfig dist;
};

enum class FieldType : uint8_t { integer, real, boolean, text, choice };

// One config key bound to a RunConfig instance.
struct Field {
  std::string key;   // "train.micro_batch_size"
  FieldType type;
  std::string help;
  std::vector<std::string> choices;  // for FieldType::choice
  std::function<std::string()> get;                      // canonical text of the value
  std::function<void(const std::string& text)> set;       // parses and validates; throws Error(config)
  // The accepted values of a number ("1 to 1,024"), checked by set() and shown by --help-config
  // and docs/config-reference.md; "" for text, boolean and choice keys.
  std::string range;
};

// The field list, bound to `config`. model.preset comes first: setting it resets every model.* key.
std::vector<Field> fields(RunConfig& config);

// Checks cross-field rules after all overrides; throws Error(config) naming the keys.
void validate(const RunConfig& config);

}  // namespace mxtrain
