// Throughput measurement of one config on random tokens (as the PyTorch baseline does): warm-up
// steps, then timed steps bracketed by backend timestamps (CUDA events on cuda). Used by
// `mxtrain bench` and by `mxtrain tune` for its trials.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"

namespace mxtrain {

struct BenchmarkOptions {
  int64_t warmup_steps = 3;
  int64_t timed_steps = 10;
};

struct BenchmarkResult {
  bool fits = true;              // false: the config ran out of memory
  std::string error;             // the out-of-memory message when !fits
  std::string device, device_name, precision;
  // train.attention_backward, train.gemm_kernels and train.head_loss as the run took them (auto
  // resolved).
  std::string attention_backward, gemm_kernels, head_loss;
  int64_t parameters = 0;
  int64_t tokens_per_step = 0;
  double step_ms = 0;            // mean over timed steps
  double tokens_per_s = 0;
  double tflops = 0;             // model FLOPs (PaLM convention) per second
  double mfu = -1;               // against the GPU's dense peak; < 0 when unknown
  uint64_t peak_bytes = 0;       // allocator peak of live bytes
  uint64_t reserved_bytes = 0;   // allocator peak of reserved bytes
  double final_loss = 0;
  bool cuda_graph = false;       // the timed steps replayed a captured step graph (train.cuda_graph)
  bool quantized_weights = false;  // the quantized blocks kept no BF16 weight copy (precision.quantized_weights)
  std::string block_grad_dtype;    // the blocks' weight gradients (precision.grad_dtype resolved)
};

BenchmarkResult run_benchmark(const RunConfig& config, const BenchmarkOptions& options);
nlohmann::json benchmark_json(const RunConfig& config, const BenchmarkOptions& options, const BenchmarkResult& result);

}  // namespace mxtrain
