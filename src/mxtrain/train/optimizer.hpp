// The optimizer step of a session: AdamW over the parameter store's shards with its arguments
// built from optimizer.*, the global gradient norm (a pass of its own, or summed by the AdamW
// pass itself when nothing reads it before the update), current scaling's weight amaxes,
// recorded as the update writes the weights, and delayed scaling's next FP8 weight copies,
// written by the update too. The session decides when each part runs (after
// backward; the update after fp16's unscaling and skip decision); this decides how.
#pragma once
#include <cstdint>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/model/linear_recipe.hpp"
#include "mxtrain/model/parameters.hpp"

namespace mxtrain {

class Optimizer {
 public:
  // norm_read_before_update: the norm is read between measure_norm and update (fp16's loss
  // scaler looks for an overflow there), so the update cannot be the pass that sums it.
  Optimizer(const OptimizerConfig& config, Backend& backend, ParameterStore& params, LinearRecipe& linears,
            bool norm_read_before_update);

  // Whether update() sums the squared norm (no clipping, shards that are whole groups) and
  // measure_norm() leaves it alone.
  bool norm_from_update() const { return norm_from_update_; }
  // AdamW's arguments for step `step_number` (1-based) at `learning_rate`; the per-shard fields
  // are update()'s to fill.
  AdamWArgs arguments(double learning_rate, int64_t step_number) const;
  // norm_sq f32[1] = the global sum of squared gradients, unless update() is to sum it.
  void measure_norm(const Tensor& norm_sq);
  // AdamW over every shard of the store, clipping against norm_sq (or summing it there).
  void update(AdamWArgs args, const Tensor& norm_sq);

 private:
  // The amax slots of `weights` that lie wholly in what the update of `shard` writes, as
  // segments of the shard (into `segments`); returns the weights they belong to.
  static std::vector<const LinearRecipe::WeightAmax*> amax_segments(const ParamShard& shard,
                                                                    const std::vector<LinearRecipe::WeightAmax>& weights,
                                                                    std::vector<AmaxSegment>& segments);

  // The weight casts whose weights lie wholly in what the update of `shard` writes, as segments
  // of the shard (into `segments`), their copies allocated; returns those casts.
  std::vector<LinearRecipe::WeightCast*> cast_segments(const ParamShard& shard,
                                                              std::vector<LinearRecipe::WeightCast>& casts,
                                                              std::vector<WeightCastSegment>& segments);

  OptimizerConfig config_;
  Backend& backend_;
  ParameterStore& params_;
  LinearRecipe& linears_;
  bool norm_from_update_ = false;
};

}  // namespace mxtrain
