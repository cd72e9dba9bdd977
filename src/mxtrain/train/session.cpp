#include "mxtrain/train/session.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>

#include "mxtrain/backend/private_buffers.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/data/loader.hpp"
#include "mxtrain/interop/hf_checkpoint.hpp"
#include "mxtrain/distributed/fsdp_store.hpp"
#include "mxtrain/model/local_parameters.hpp"

namespace mxtrain {

std::vector<TokenBatch> token_batch_views(const std::vector<data::Batch>& batches) {
  std::vector<TokenBatch> views;
  for (const data::Batch& batch : batches)
    views.push_back(TokenBatch{batch.tokens.data(), batch.targets.data(), batch.batch, batch.seq});
  return views;
}

std::string resolve_device(const std::string& requested) {
  if (requested == "auto") return backend_available("cuda") ? "cuda" : "cpu";
  if (requested == "cuda" && !backend_available("cuda")) {
    bool built = false;
    for (const std::string& name : backend_names()) built = built || name == "cuda";
    throw Error(ErrorKind::config,
                built ? "train.device = cuda but no CUDA GPU is visible" : "train.device = cuda but this mxtrain was "
                                                                           "built without the CUDA backend",
                built ? "check nvidia-smi and CUDA_VISIBLE_DEVICES, or use --device cpu"
                      : "build with the cuda preset on a machine with the CUDA toolkit, or use --device cpu");
  }
  return requested;
}

namespace {

// The attention of one micro-batch of the run.
AttentionShape attention_shape_of(const RunConfig& config) {
  AttentionShape shape;
  shape.batch = config.train.micro_batch_size;
  shape.seq = config.train.seq_len;
  shape.heads = config.model.heads;
  shape.kv_heads = config.model.kv_heads;
  shape.head_dim = config.model.head_dim();
  return shape;
}

}  // namespace

namespace {

// The FlashAttention-4 configuration auto would take for this run if the build carries it ("" where
// auto keeps cuDNN's backward whatever the build: not a Hopper, deterministic, FP16/FP32, a shape
// FlashAttention-4 cannot run).
std::string flash_attention_4_wanted(const RunConfig& config, int capability) {
  const std::string& precision = config.train.precision;
  if (capability != 90 || config.train.deterministic || precision == "fp16" || precision == "fp32") return "";
  const AttentionShape shape = attention_shape_of(config);
  if (!private_buffers::flash_attention_4_unsupported(shape, DType::bf16).empty()) return "";
  return strf("d%lld_g%lld", static_cast<long long>(shape.head_dim), static_cast<long long>(shape.heads / shape.kv_heads));
}

// The quack GEMM setting auto would take for this run if the build carries its kernels ("" where
// auto keeps cuBLASLt alone whatever the build: not a Hopper, or a deterministic run, which keeps
// SwiGLU and GELU as kernels of their own (Transformer::layer_forward), so auto takes nothing it
// would not run).
std::string quack_gemms_wanted(const RunConfig& config, int capability) {
  if (capability != 90 || config.train.deterministic) return "";
  return config.model.family == ModelFamily::llama ? "cublaslt+quack-swiglu" : "cublaslt+quack-gelu";
}

}  // namespace

std::string attention_backward_of(const RunConfig& config, int capability) {
  if (config.train.attention_backward != "auto") return config.train.attention_backward;
  const std::string tag = flash_attention_4_wanted(config, capability);
  if (tag.empty()) return "cudnn";
  const std::vector<std::string> carried = carried_kernels().flash_attention_4;
  return std::find(carried.begin(), carried.end(), tag) != carried.end() ? "flash-attention-4" : "cudnn";
}

std::string gemm_kernels_of(const RunConfig& config, int capability) {
  if (config.train.gemm_kernels != "auto") return config.train.gemm_kernels;
  const std::string wanted = quack_gemms_wanted(config, capability);
  if (wanted.empty()) return "cublaslt";
  const CarriedKernels carried = carried_kernels();
  const bool carries = config.model.family == ModelFamily::llama ? carried.quack_gated_gemm : carried.quack_gelu_gemms;
  return carries ? wanted : "cublaslt";
}

bool quack_swiglu_in(const std::string& gemm_kernels) {
  return gemm_kernels == "cublaslt+quack-swiglu" || gemm_kernels == "cublaslt+quack";
}

bool quack_gelu_in(const std::string& gemm_kernels) {
  return gemm_kernels == "cublaslt+quack-gelu" || gemm_kernels == "cublaslt+quack";
}

std::string head_loss_of(const RunConfig& config, int capability) {
  (void)capability;
  if (config.train.head_loss != "auto") return config.train.head_loss;
  return "chunked";
}

std::string kernels_startup_line(const RunConfig& config, int capability) {
  auto chosen = [](const std::string& setting, const std::string& taken) {
    return setting == "auto" ? taken + " (auto)" : taken;
  };
  const std::string attention = attention_backward_of(config, capability);
  const std::string gemms = gemm_kernels_of(config, capability);
  std::string line = "kernels: attention backward " + chosen(config.train.attention_backward, attention) +
                     ", GEMMs " + chosen(config.train.gemm_kernels, gemms) + ", head loss " +
                     chosen(config.train.head_loss, head_loss_of(config, capability));
  // Where auto fell back only because this build lacks the kernel it would take: say so.
  std::vector<std::string> missing;
  const std::string tag = flash_attention_4_wanted(config, capability);
  if (config.train.attention_backward == "auto" && !tag.empty() && attention != "flash-attention-4")
    missing.push_back("FlashAttention-4's backward for " + tag);
  if (config.train.gemm_kernels == "auto" && !quack_gemms_wanted(config, capability).empty() && gemms == "cublaslt")
    missing.push_back(config.model.family == ModelFamily::llama ? "quack's gated SwiGLU GEMM" : "quack's GELU GEMMs");
  if (!missing.empty())
    line += " (this build lacks " + missing[0] + (missing.size() > 1 ? " and " + missing[1] : std::string()) +
            ", which auto would take here: MXTRAIN_WITH_FA4=1 ./scripts/setup.sh builds them)";
  return line;
}

BackendOptions backend_options(const RunConfig& config) {
  BackendOptions options;
  options.threads = static_cast<int>(config.train.threads);
  options.deterministic = config.train.deterministic;
  // `auto` as the run's GPU takes it (no GPU asked about unless a setting is auto on a cuda run).
  const bool any_auto = config.train.attention_backward == "auto" || config.train.gemm_kernels == "auto" ||
                        config.train.head_loss == "auto";
  const int capability = any_auto && config.train.device != "cpu" ? cuda_compute_capability() : 0;
  options.flash_attention_4_backward = attention_backward_of(config, capability) == "flash-attention-4";
  options.tf32 = config.train.tf32;
  options.gemm_autotune = config.train.gemm_autotune;
  const std::string kernels = gemm_kernels_of(config, capability);
  options.gemm_quack = kernels == "cublaslt+quack";
  options.gemm_quack_swiglu = quack_swiglu_in(kernels);
  options.gemm_quack_gelu = quack_gelu_in(kernels);
  options.head_loss_quack = head_loss_of(config, capability) == "quack-lce";
  return options;
}

std::unique_ptr<ParameterStore> make_parameter_store(Backend& backend, const RunConfig& config,
                                                     const PrecisionPlan& precision, Communicator* world,
                                                     int local_world_size) {
  const uint64_t seed = static_cast<uint64_t>(config.train.seed);
  // quantized_weights: the blocks the linear recipe quantizes keep no compute copy; their
  // matrices are quantized from the FP32 masters, which the model reads directly. So does an
  // untied token table (the embedding lookup rounds the rows it gathers); a tied one is the
  // head's BF16 GEMM operand and keeps its copy, as does the head.
  if (world != nullptr && config.precision.quantized_weights == "true")
    throw Error(ErrorKind::unsupported, "precision.quantized_weights = true is not available with FSDP sharding yet",
                "set precision.quantized_weights = auto (false under FSDP), or train on one GPU");
  std::vector<int> master_only_groups;
  if (uses_quantized_weights(config, precision, world != nullptr)) {
    const ModelLayout layout = build_layout(config.model);
    const LinearRecipeOptions linear = linear_recipe_options(config, precision);
    for (int64_t l = 0; l < config.model.layers; ++l)
      if (linear.quantized(l, config.model.layers)) master_only_groups.push_back(layout.layer_group(l));
    const size_t quantized_blocks = master_only_groups.size();
    if (!config.model.tied_embeddings) master_only_groups.push_back(layout.embed_group);
    if (backend.device() != Device::none)
      log::info(strf("quantized_weights (precision.quantized_weights = %s): no %s copy of the %zu quantized blocks' "
                     "weights%s; they are cast from the FP32 masters",
                     config.precision.quantized_weights.c_str(), std::string(dtype_name(precision.compute)).c_str(),
                     quantized_blocks, config.model.tied_embeddings ? "" : " or of the token table"));
  }
  const DType block_grad = block_grad_dtype(config, precision, world ? world->size() : 1);
  if (backend.device() != Device::none) {
    const std::string grad = precision_label(precision.grad), block = precision_label(block_grad);
    log::info(block_grad == precision.grad
                  ? "Gradients " + grad
                  : strf("Gradients %s in the blocks (one micro-batch a step on one GPU: each is one GEMM's output, "
                         "as torch autocast leaves it), %s in the embedding and head; precision.grad_dtype = f32 "
                         "keeps them all %s",
                         block.c_str(), grad.c_str(), grad.c_str()));
  }
  // The starting weights: a Hugging Face checkpoint's (model.init_from: every rank reads just
  // the ranges it holds, straight from the safetensors files), else the seed's.
  std::unique_ptr<interop::HfCheckpoint> checkpoint;
  ParameterValues values = random_initialization(config.model, seed);
  if (!config.model.init_from.empty() && backend.device() != Device::none) {
    checkpoint = std::make_unique<interop::HfCheckpoint>(config.model.init_from);
    checkpoint->check(build_layout(config.model));
    values = checkpoint->parameter_values();
    log::info("initial weights from " + config.model.init_from);
  }
  if (world == nullptr) {
    // Precision bf16 on one process keeps each master split into its bf16 copy and the low
    // halves (numerics/split_master.hpp). The FP8/MX recipes keep f32 masters (quantized_weights
    // saves memory by dropping copies, which a split master has no separate one of).
    const bool split_masters = precision.compute == DType::bf16 && precision.linear == LinearFormat::high_precision;
    auto store = std::make_unique<LocalParameterStore>(backend, config.model, precision.compute, precision.grad,
                                                       master_only_groups, block_grad, split_masters);
    store->initialize(values);
    return store;
  }
  const FsdpOptions options = resolve_fsdp_options(config.dist, world->size(), local_world_size);
  auto store = std::make_unique<FsdpParameterStore>(backend, config.model, precision.compute, precision.grad, *world,
                                                    options);
  store->initialize(values);
  return store;
}

TrainingSession::TrainingSession(const RunConfig& config, Backend& backend, const PrecisionPlan& precision,
                                 std::unique_ptr<ParameterStore> params)
    : config_(config), backend_(backend), precision_(precision), params_(std::move(params)) {
  for (OpKind kind : {OpKind::linear_forward, OpKind::attention_forward, OpKind::cross_entropy, OpKind::norm_forward})
    if (!backend_.supports(kind, precision_.activation))
      throw Error(ErrorKind::unsupported,
                  strf("the %s backend has no %s op for %s activations", std::string(backend_.name()).c_str(),
                       op_kind_name(kind), std::string(dtype_name(precision_.activation)).c_str()),
                  "choose a precision this device supports (fp32 on cpu; bf16 or fp32 on cuda)");
  TransformerOptions options;
  options.activation_dtype = precision_.activation;
  options.recompute = RecomputePolicy::parse(config_.train.recompute);
  options.logits_chunk_tokens = config_.train.logits_chunk_tokens;
  options.deterministic = config_.train.deterministic;
  options.linear = linear_recipe_options(config_, precision_);
  model_ = std::make_unique<Transformer>(config_.model, options, backend_, *params_);
  const int64_t rows = config_.train.micro_batch_size * config_.train.seq_len;
  model_->check_batch(rows);
  if (config_.train.attention_backward == "flash-attention-4" && backend_.device() == Device::cpu)
    throw Error(ErrorKind::config,
                "train.attention_backward = " + config_.train.attention_backward +
                    " is a cuda setting, and this run is on the cpu",
                "remove it, or train on cuda");
  if (config_.train.gemm_kernels != "cublaslt" && config_.train.gemm_kernels != "auto" &&
      backend_.device() == Device::cpu)
    throw Error(ErrorKind::config,
                "train.gemm_kernels = " + config_.train.gemm_kernels + " is a cuda setting, and this run is on the cpu",
                "remove it, or train on cuda");
  if (config_.train.head_loss == "quack-lce" && backend_.device() == Device::cpu)
    throw Error(ErrorKind::config, "train.head_loss = quack-lce is a cuda setting, and this run is on the cpu",
                "remove it, or train on cuda");
  backend_.check_attention_backward(attention_shape_of(config_), precision_.activation);
  if (precision_.loss_scaling) loss_scaler_ = std::make_unique<LossScaler>(loss_scaler_options(config_.precision));
  tokens_ = backend_.allocate("tokens", Shape{rows}, DType::i32, Lifetime::data);
  targets_ = backend_.allocate("targets", Shape{rows}, DType::i32, Lifetime::data);
  loss_sum_ = backend_.allocate("loss_sum", Shape{1}, DType::f32, Lifetime::scratch);
  // [0] the squared gradient norm, [1, 4) a captured step's AdamW factors: one 512-byte block
  // either way, so graphs cost no memory and the dryrun's bytes stay the run's.
  step_scalars_ = backend_.allocate("step_scalars", Shape{4}, DType::f32, Lifetime::scratch);
  grad_norm_sq_ = step_scalars_.tensor().slice_flat(0, Shape{1});
  step_factors_ = step_scalars_.tensor().slice_flat(1, Shape{3});
  // fp16's unscaling and train.nonfinite = skip read the norm before the update.
  skip_nonfinite_ = config_.train.nonfinite == "skip";
  optimizer_ = std::make_unique<Optimizer>(config_.optimizer, backend_, *params_, model_->linears(),
                                           loss_scaler_ != nullptr || skip_nonfinite_);
  if (const char* steps = std::getenv("MXT_TEST_NAN_GRADIENT_STEPS")) {
    long long first = 0, last = 0;
    const int parsed = std::sscanf(steps, "%lld-%lld", &first, &last);
    nan_gradient_first_ = parsed >= 1 ? first : 0;
    nan_gradient_last_ = parsed == 2 ? last : (parsed == 1 ? first : -1);
    log::warn(strf("MXT_TEST_NAN_GRADIENT_STEPS: the gradients of steps %lld to %lld will be NaN",
                   static_cast<long long>(nan_gradient_first_), static_cast<long long>(nan_gradient_last_)));
  }
  // A graph holds steps whose every launch is the same from step to step apart from the
  // tokens and the learning rate: not fp16's loss scaling (the host decides to skip), not a
  // linear recipe whose casts change their arguments between steps (NVFP4's stochastic
  // rounding streams; FP8's scales and histories live on the device), not a store that says
  // no, not train.nonfinite = skip (the host decides whether to apply the update), not with
  // the NaN-gradient test hook (the host decides which steps it poisons).
  graph_eligible_ = config_.train.cuda_graph && !loss_scaler_ && !skip_nonfinite_ &&
                    nan_gradient_last_ < nan_gradient_first_ && model_->linears().step_graph_capturable() &&
                    params_->step_graph_capturable();
}

void TrainingSession::upload(const TokenBatch& batch) {
  MXTRAIN_ASSERT(batch.batch * batch.seq == tokens_.tensor().numel(), "micro-batch of %lld x %lld, buffers for %lld",
                 static_cast<long long>(batch.batch), static_cast<long long>(batch.seq),
                 static_cast<long long>(tokens_.tensor().numel()));
  backend_.copy_from_host(batch.tokens, tokens_);
  backend_.copy_from_host(batch.targets, targets_);
}

void TrainingSession::stage_graph_inputs(const std::vector<TokenBatch>& micro_batches, double learning_rate,
                                         int64_t step_number) {
  host_tokens_.resize(micro_batches.size());
  host_targets_.resize(micro_batches.size());
  for (size_t i = 0; i < micro_batches.size(); ++i) {
    const TokenBatch& batch = micro_batches[i];
    const size_t n = static_cast<size_t>(batch.batch * batch.seq);
    host_tokens_[i].assign(batch.tokens, batch.tokens + n);
    host_targets_[i].assign(batch.targets, batch.targets + n);
  }
  const AdamWStepFactors factors = adamw_step_factors(optimizer_->arguments(learning_rate, step_number));
  host_step_factors_[0] = factors.decay_factor;
  host_step_factors_[1] = factors.negative_step_size;
  host_step_factors_[2] = factors.bias_correction2_sqrt;
}

bool TrainingSession::run_step(const std::vector<TokenBatch>& micro_batches, int64_t global_tokens,
                               double learning_rate, int64_t step_number, bool captured, float loss_scale) {
  backend_.fill(loss_sum_, 0.0f);
  // A captured step's host inputs are all read at its start (the next replay may refill their
  // staging as soon as they are): the learning-rate factors first, then the micro-batches.
  if (captured) backend_.copy_from_host(host_step_factors_, step_factors_);
  // fp16: the loss, so every gradient, is multiplied by the loss scale (1 without scaling).
  forward_backward(micro_batches, loss_scale / static_cast<float>(global_tokens), captured);

  inject_nan_gradients(step_number);
  PhaseScope scope(backend_, Phase::optimizer);
  optimizer_->measure_norm(grad_norm_sq_);
  AdamWArgs args = optimizer_->arguments(learning_rate, step_number);
  if (captured) args.step_factors = step_factors_;
  bool apply = !loss_scaler_ || unscale(loss_scale, step_number, args);
  // A fp16 overflow is the loss scaler's to handle; any other non-finite step is dropped here.
  launched_nonfinite_ = apply && skip_nonfinite_ && !step_is_finite();
  if (launched_nonfinite_) apply = false;
  if (apply) optimizer_->update(args, grad_norm_sq_);
  params_->zero_grads();
  model_->linears().settle_weight_casts();  // FP8 weight copies back where the forward reads them
  model_->linears().finish_step();
  return apply;
}

// The captured step's forward took FP8 weight copies (LinearRecipe::weight_casts) from other
// addresses than those its optimizer wrote the next ones to (Quantizer::settle_weight_casts
// could not bring them all back): a second replay would read stale copies. Its one replay was
// right (it read what the step before wrote); the graph goes, and the next steps run op by op and
// capture again. If that keeps happening, the forwards cast the weights again, and the next
// capture holds.
void TrainingSession::drop_unrepeated_capture() {
  backend_.drop_capture();
  graph_ready_ = false;
  eager_steps_ = 0;
  if (++unrepeated_captures_ < kUnrepeatedCaptures) return;
  model_->linears().stop_weight_casts();
  log::info("FP8 weight copies: the optimizer's copies do not land where the step graph reads them; the forward "
            "casts the weights from now on");
}

bool TrainingSession::step_is_finite() {
  const double loss = all_reduce_sum(backend_.read_scalar(loss_sum_));
  return std::isfinite(loss) && std::isfinite(backend_.read_scalar(grad_norm_sq_));
}

void TrainingSession::inject_nan_gradients(int64_t step_number) {
  if (step_number < nan_gradient_first_ || step_number > nan_gradient_last_) return;
  for (const ParamShard& shard : params_->shards())
    if (shard.grad.defined() && shard.count > 0) {
      backend_.fill(shard.grad, std::numeric_limits<float>::quiet_NaN());
      return;
    }
}

void TrainingSession::forward_backward(const std::vector<TokenBatch>& micro_batches, float grad_scale, bool captured) {
  const int count = static_cast<int>(micro_batches.size());
  for (int i = 0; i < count; ++i) {
    const TokenBatch& batch = micro_batches[static_cast<size_t>(i)];
    params_->begin_micro_batch(i, count);
    if (captured) {
      backend_.copy_from_host(host_tokens_[static_cast<size_t>(i)].data(), tokens_);
      backend_.copy_from_host(host_targets_[static_cast<size_t>(i)].data(), targets_);
    } else {
      upload(batch);
    }
    model_->forward_backward(tokens_, targets_, batch.batch, batch.seq, grad_scale, loss_sum_);
  }
  params_->finish_backward();
}

bool TrainingSession::unscale(float loss_scale, int64_t step_number, AdamWArgs& args) {
  backend_.scale(grad_norm_sq_, static_cast<float>(1.0 / (static_cast<double>(loss_scale) * loss_scale)));
  args.grad_multiplier = 1.0f / loss_scale;
  return loss_scaler_->update(!std::isfinite(backend_.read_scalar(grad_norm_sq_)), step_number);
}

StepResult TrainingSession::step(const std::vector<TokenBatch>& micro_batches, int64_t global_tokens,
                                 double learning_rate, int64_t step_number) {
  launch_step(micro_batches, global_tokens, learning_rate, step_number);
  return last_result();
}

void TrainingSession::launch_step(const std::vector<TokenBatch>& micro_batches, int64_t global_tokens,
                                  double learning_rate, int64_t step_number) {
  MXTRAIN_ASSERT(!micro_batches.empty() && global_tokens > 0, "empty step");
  const float loss_scale = loss_scaler_ ? loss_scaler_->scale() : 1.0f;
  const GraphShape shape{static_cast<int64_t>(micro_batches.size()), micro_batches[0].batch, micro_batches[0].seq,
                         global_tokens};
  bool apply = true;
  replayed_ = false;
  launched_nonfinite_ = false;
  if (graph_ready_) {
    if (shape == graph_shape_) {
      stage_graph_inputs(micro_batches, learning_rate, step_number);
      replayed_ = backend_.replay();
    }
    if (!replayed_) {  // stale or a new shape: op by op again, then a new capture
      backend_.drop_capture();
      graph_ready_ = false;
      eager_steps_ = 0;
    }
  }
  if (!replayed_) {
    const bool capture = graph_eligible_ && eager_steps_ >= kEagerSteps && backend_.begin_capture();
    if (capture) {
      stage_graph_inputs(micro_batches, learning_rate, step_number);
      try {
        run_step(micro_batches, global_tokens, learning_rate, step_number, true, loss_scale);
      } catch (...) {
        backend_.drop_capture();
        throw;
      }
      graph_ready_ = backend_.end_capture();
      graph_shape_ = shape;
      replayed_ = graph_ready_ && backend_.replay();
      // Refused by the device (logged): nothing ran; this step and all later ones go op by op.
      if (!replayed_) graph_eligible_ = false;
      if (replayed_ && !model_->linears().weight_casts_repeat()) drop_unrepeated_capture();
    }
    if (!replayed_) {
      apply = run_step(micro_batches, global_tokens, learning_rate, step_number, false, loss_scale);
      ++eager_steps_;
    }
  }
  launched_ = Launched{step_number, global_tokens, apply, launched_nonfinite_, loss_scaler_ ? loss_scale : 0.0f};
}

StepResult TrainingSession::last_result() {
  MXTRAIN_ASSERT(launched_.step_number > 0, "last_result before any step");
  StepResult result;
  const double loss_sum = all_reduce_sum(backend_.read_scalar(loss_sum_));
  result.loss = loss_sum / static_cast<double>(launched_.global_tokens);
  result.grad_norm = std::sqrt(static_cast<double>(backend_.read_scalar(grad_norm_sq_)));
  result.skipped = !launched_.applied;
  result.nonfinite = launched_.nonfinite;
  result.loss_scale = launched_.loss_scale;
  const long long step = static_cast<long long>(launched_.step_number);
  const std::string remedy =
      "lower optimizer.lr, raise schedule.warmup_steps, keep optimizer.grad_clip on, or use a wider precision";
  if (launched_.nonfinite) {
    ++nonfinite_skips_;
    if (++nonfinite_in_a_row_ > config_.train.nonfinite_max_skips)
      throw Error(ErrorKind::numerics,
                  strf("%lld steps in a row had a non-finite loss or gradient norm, the last at step %lld "
                       "(train.nonfinite_max_skips = %lld); nothing non-finite was saved",
                       static_cast<long long>(nonfinite_in_a_row_), step,
                       static_cast<long long>(config_.train.nonfinite_max_skips)),
                  remedy + "; then re-run the same command to resume from the last checkpoint");
  } else {
    nonfinite_in_a_row_ = 0;
    // train.nonfinite = stop: the run ends here, before the step's checkpoint could be written.
    // A fp16 overflow (skipped by the loss scaler) is not an error.
    const char* what = !std::isfinite(result.loss) ? "loss"
                       : !std::isfinite(result.grad_norm) && !result.skipped ? "gradient norm"
                                                                              : nullptr;
    if (what)
      throw Error(ErrorKind::numerics,
                  strf("the %s (%g) is not finite at step %lld; the run stopped before saving it", what,
                       !std::isfinite(result.loss) ? result.loss : result.grad_norm, step),
                  remedy + "; then re-run the same command to resume from the last checkpoint (train.nonfinite = "
                           "skip drops such steps instead)");
  }
  result.nonfinite_skips = nonfinite_skips_;
  return result;
}

double TrainingSession::evaluate(const std::vector<TokenBatch>& batches) {
  backend_.fill(loss_sum_, 0.0f);
  int64_t tokens = 0;
  model_->linears().begin_evaluation();  // the forward passes leave the FP8 scaling state as it was
  for (const TokenBatch& batch : batches) {
    upload(batch);
    model_->forward_loss(tokens_, targets_, batch.batch, batch.seq, loss_sum_);
    tokens += batch.batch * batch.seq;
  }
  model_->linears().end_evaluation();
  const double total_tokens = all_reduce_sum(static_cast<double>(tokens));
  return all_reduce_sum(backend_.read_scalar(loss_sum_)) / total_tokens;
}

PrecisionResumeValues TrainingSession::resume_values() const {
  PrecisionResumeValues values;
  if (loss_scaler_) {
    values.loss_scale = loss_scaler_->scale_value();
    values.loss_scale_clean_steps = loss_scaler_->clean_steps();
  }
  values.rounding_streams = model_->linears().rounding_streams();
  return values;
}

void TrainingSession::restore_resume_values(const PrecisionResumeValues& values) {
  if (loss_scaler_ && values.loss_scale > 0) loss_scaler_->restore(values.loss_scale, values.loss_scale_clean_steps);
  model_->linears().set_rounding_streams(values.rounding_streams);
}

}  // namespace mxtrain
