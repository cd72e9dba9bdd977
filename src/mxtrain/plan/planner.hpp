// `mxtrain plan`: one config on a chosen GPU type and count. Memory is the dryrun of the real
// step (plan/step_trace); time is its ops priced on the GPU model (plan/cost_model). The plan
// reproduces what `mxtrain bench` and the training steps of `mxtrain train` do on that GPU.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/plan/calibration.hpp"
#include "mxtrain/plan/cost_model.hpp"
#include "mxtrain/plan/memory_breakdown.hpp"
#include "mxtrain/plan/step_trace.hpp"

namespace mxtrain {

struct PlanTarget {
  std::string gpu = "h200";  // catalog key
  int gpus = 1;              // in total
  int nodes = 0;             // 0 = as few as hold `gpus` (gpus_per_node each)
};

struct PlanOptions {
  int steps = 2;             // dryrun steps (the allocator's peaks are over all of them)
  bool detailed = true;      // list live buffers at the peak (per-layer and by-name breakdown)
  double headroom = 0.05;    // a config "fits" when its total is at most (1 - headroom) of capacity
};

struct Plan {
  RunConfig config;
  const GpuSpec* gpu = nullptr;
  GpuCalibration calibration;
  int gpus = 1, nodes = 1;
  int64_t micro_batch = 0, seq_len = 0, micro_batches = 1, global_batch = 0;
  StepTrace trace;
  MemoryBreakdown memory;
  StepTime time;
  bool fits = false;               // total <= capacity
  bool fits_with_headroom = false; // total <= (1 - headroom) capacity
  double headroom = 0.05;
  bool out_of_memory = false;      // the step failed even after releasing cached segments
  double tokens_per_step = 0;      // global
  double tokens_per_s = 0;         // global
  double tokens_per_s_per_gpu = 0;
  double model_tflops_per_gpu = 0; // PaLM convention, as bench reports
  double mfu = -1;                 // against the dense peak of mfu_dtype (FP8 for FP8 recipes); < 0 unknown
  double planning_seconds = 0;
};

// Throws Error(config) for an invalid config or target, with the fix.
Plan make_plan(const RunConfig& config, const PlanTarget& target, const Calibration& calibration,
               const PlanOptions& options = {});

std::string format_plan(const Plan& plan);
nlohmann::json plan_json(const Plan& plan);
std::string gib_text(double bytes);  // "12.34 GiB"

}  // namespace mxtrain
