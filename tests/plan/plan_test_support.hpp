// Small configs and a dryrun helper shared by the planner's tests.
#pragma once
#include <string>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/plan/step_trace.hpp"
#include "support/test_support.hpp"

namespace mxtrain::test {

// A 3-layer model of `family` ("llama" or "gpt2") that steps in milliseconds on the CPU.
inline RunConfig small_run(const std::string& family, const std::string& recompute, int64_t micro, int64_t seq,
                           int64_t global = 0) {
  RunConfig config;
  config.model = small_model(family == "llama" ? ModelFamily::llama : ModelFamily::gpt2, 3, 64);
  config.train.device = "cpu";
  config.train.precision = "fp32";
  config.train.threads = 2;
  config.train.recompute = recompute;
  config.train.micro_batch_size = micro;
  config.train.seq_len = seq;
  config.train.global_batch_size = global;
  return config;
}

// The dryrun of `config` on one device without any GPU backend's in-op allocations: exactly what
// the cpu backend allocates.
inline StepTrace cpu_equivalent_trace(const RunConfig& config, int steps) {
  TraceRequest request;
  request.config = config;
  request.calibration.cuda_allocations.enabled = false;
  request.device_label = "test";
  request.steps = steps;
  request.detailed_peak = true;
  return trace_step(request);
}

}  // namespace mxtrain::test
