// The planner's prediction for a training run, as the run report reads it (RUN_DIR/plan.json):
// `mxtrain train` calls this at start (wired in by the cli, as train/ sits below plan/) for the
// run's own config on the run's GPU type and rank count. The run report sets its memory and
// step-time panels beside the measured figures with it.
#pragma once
#include <string>

#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"

namespace mxtrain {

// The GPU a prediction is made for when the run's device is not a GPU of the catalog (a CPU
// run): the planner's default, so the report can say what the same config needs on it.
inline constexpr const char* kDefaultPredictionGpu = "h200";

// plan_json() of make_plan(config, {gpu_key or kDefaultPredictionGpu, gpus}) with the default
// calibration, two dry-run steps and no per-buffer listing. Throws Error(config) as make_plan does.
nlohmann::json predict_run(const RunConfig& config, const std::string& gpu_key, int gpus);

}  // namespace mxtrain
