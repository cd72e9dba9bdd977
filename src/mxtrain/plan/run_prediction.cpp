#include "mxtrain/plan/run_prediction.hpp"

#include "mxtrain/plan/calibration.hpp"
#include "mxtrain/plan/planner.hpp"

namespace mxtrain {

nlohmann::json predict_run(const RunConfig& config, const std::string& gpu_key, int gpus) {
  PlanTarget target;
  target.gpu = gpu_key.empty() ? kDefaultPredictionGpu : gpu_key;
  target.gpus = gpus;
  PlanOptions options;
  options.steps = 2;
  options.detailed = false;
  return plan_json(make_plan(config, target, Calibration::load(), options));
}

}  // namespace mxtrain
