#include "mxtrain/train/benchmark.hpp"

#include <ctime>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/build_info.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/hw/gpu_catalog.hpp"
#include "mxtrain/train/schedule.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain {

BenchmarkResult run_benchmark(const RunConfig& config, const BenchmarkOptions& options) {
  BenchmarkResult result;
  result.device = resolve_device(config.train.device);
  // Validates the name before the backend exists; the full plan needs the backend.
  result.precision = resolve_precision(config.train.precision, result.device, config.train.tf32).name;
  result.parameters = config.model.parameter_count();
  const int64_t micro = config.train.micro_batch_size;
  const int64_t global = config.train.global_batch(1);
  const int64_t accumulation = global / micro;
  const int64_t seq = config.train.seq_len;
  result.tokens_per_step = global * seq;
  try {
    std::unique_ptr<Backend> backend = create_backend(result.device, backend_options(config));
    result.device_name = backend->properties().name;
    result.attention_backward = attention_backward_of(config, backend->properties().compute_capability);
    result.gemm_kernels = gemm_kernels_of(config, backend->properties().compute_capability);
    result.head_loss = head_loss_of(config, backend->properties().compute_capability);
    const PrecisionPlan precision = resolve_precision(config, *backend);
    log::info(precision.startup_line);
    if (result.device == "cuda") log::info(kernels_startup_line(config, backend->properties().compute_capability));
    result.quantized_weights = uses_quantized_weights(config, precision, false);
    result.block_grad_dtype = std::string(dtype_name(block_grad_dtype(config, precision, 1)));
    TrainingSession session(config, *backend, precision, make_parameter_store(*backend, config, precision, nullptr, 1));

    // Random tokens, fixed per run (the PyTorch baseline also reuses one random batch).
    std::vector<int32_t> tokens(static_cast<size_t>(micro * seq)), targets(tokens.size());
    uint64_t state = static_cast<uint64_t>(config.train.seed) | 1;
    for (size_t i = 0; i < tokens.size(); ++i) {
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      tokens[i] = static_cast<int32_t>(state % static_cast<uint64_t>(config.model.vocab_size));
      state ^= state << 13, state ^= state >> 7, state ^= state << 17;
      targets[i] = static_cast<int32_t>(state % static_cast<uint64_t>(config.model.vocab_size));
    }
    std::vector<TokenBatch> batches(static_cast<size_t>(accumulation),
                                    TokenBatch{tokens.data(), targets.data(), micro, seq});
    const int64_t total = options.warmup_steps + options.timed_steps;
    StepResult step;
    for (int64_t i = 1; i <= options.warmup_steps; ++i)
      step = session.step(batches, result.tokens_per_step, learning_rate(config.optimizer, config.schedule, i, total), i);
    // The timed steps are enqueued back to back and only the last one's loss is read (as a
    // PyTorch loop that never calls loss.item()); each replayed graph waits only for the
    // previous one to have read its host inputs.
    const uint64_t start = backend->record_timestamp();
    for (int64_t i = options.warmup_steps + 1; i <= total; ++i)
      session.launch_step(batches, result.tokens_per_step, learning_rate(config.optimizer, config.schedule, i, total),
                          i);
    const uint64_t end = backend->record_timestamp();
    step = session.last_result();
    result.step_ms = backend->elapsed_ms(start, end) / static_cast<double>(options.timed_steps);
    result.final_loss = step.loss;
    result.cuda_graph = session.replayed_graph();
    const MemoryStats memory = backend->memory_stats();
    result.peak_bytes = memory.peak_live_bytes;
    result.reserved_bytes = memory.peak_reserved_bytes;
    result.tokens_per_s = static_cast<double>(result.tokens_per_step) / (result.step_ms / 1e3);
    result.tflops = result.tokens_per_s * config.model.training_flops_per_token(seq) / 1e12;
    if (const GpuSpec* gpu = result.device == "cuda" ? find_gpu(result.device_name) : nullptr) {
      double peak = peak_flops(*gpu, mfu_dtype(precision));
      if (peak > 0) result.mfu = result.tflops * 1e12 / peak;
    }
  } catch (const Error& error) {
    if (error.kind() != ErrorKind::out_of_memory) throw;
    result.fits = false;
    result.error = error.full_message();
  }
  return result;
}

nlohmann::json benchmark_json(const RunConfig& config, const BenchmarkOptions& options, const BenchmarkResult& result) {
  char stamp[32];
  std::time_t now = std::time(nullptr);
  std::strftime(stamp, sizeof stamp, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&now));
  nlohmann::json json = {{"kind", "train"},
                         {"engine", "mxtrain"},
                         {"name", config.model.preset},
                         {"family", family_name(config.model.family)},
                         {"params", result.parameters},
                         {"B", config.train.micro_batch_size},
                         {"T", config.train.seq_len},
                         {"global_batch", config.train.global_batch(1)},
                         {"precision", result.precision},
                         {"recompute", config.train.recompute},
                         {"attention_backward", result.attention_backward.empty() ? config.train.attention_backward
                                                                                  : result.attention_backward},
                         {"gemm_kernels", result.gemm_kernels.empty() ? config.train.gemm_kernels : result.gemm_kernels},
                         {"head_loss", result.head_loss.empty() ? config.train.head_loss : result.head_loss},
                         {"grad_clip", config.optimizer.grad_clip},
                         {"device", result.device},
                         {"gpu", result.device_name},
                         {"warmup_steps", options.warmup_steps},
                         {"timed_steps", options.timed_steps},
                         {"fits", result.fits},
                         {"commit", MXTRAIN_GIT_COMMIT},
                         {"version", MXTRAIN_VERSION},
                         {"time", stamp}};
  if (!result.fits) {
    json["error"] = result.error;
    return json;
  }
  json["step_ms"] = result.step_ms;
  json["tok_s"] = result.tokens_per_s;
  json["tflops"] = result.tflops;
  if (result.mfu >= 0) json["mfu"] = result.mfu;
  json["peak_gib"] = static_cast<double>(result.peak_bytes) / (1u << 30);
  json["reserved_gib"] = static_cast<double>(result.reserved_bytes) / (1u << 30);
  json["peak_bytes"] = result.peak_bytes;
  json["reserved_bytes"] = result.reserved_bytes;
  json["loss"] = result.final_loss;
  json["cuda_graph"] = result.cuda_graph;
  json["quantized_weights"] = result.quantized_weights;
  json["grad_dtype"] = result.block_grad_dtype;
  return json;
}

}  // namespace mxtrain
