#include "mxtrain/train/optimizer.hpp"

namespace mxtrain {

namespace {

// Where `part` lies in `whole`, in elements; -1 unless wholly inside it, in the same dtype.
int64_t element_offset(const Tensor& whole, const Tensor& part) {
  if (!whole.defined() || !part.defined() || whole.dtype != part.dtype) return -1;
  const uintptr_t begin = reinterpret_cast<uintptr_t>(whole.data), at = reinterpret_cast<uintptr_t>(part.data);
  const uintptr_t element = static_cast<uintptr_t>(dtype_bits(whole.dtype) / 8);
  if (at < begin || (at - begin) % element != 0) return -1;
  const int64_t offset = static_cast<int64_t>((at - begin) / element);
  return offset + part.numel() <= whole.numel() ? offset : -1;
}

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config, Backend& backend, ParameterStore& params, LinearRecipe& linears,
                     bool norm_read_before_update)
    : config_(config), backend_(backend), params_(params), linears_(linears) {
  // Without clipping (and with nothing else reading the norm before the update) the norm the
  // step reports comes out of the AdamW pass, which reads every gradient anyway, when the shards
  // are whole groups, so their sums are the norm (sharded FSDP's would need an all-reduce after
  // the update: it keeps its own pass).
  norm_from_update_ = config_.grad_clip <= 0 && !norm_read_before_update && params_.shards_are_whole_groups();
}

AdamWArgs Optimizer::arguments(double learning_rate, int64_t step_number) const {
  AdamWArgs args;
  args.learning_rate = static_cast<float>(learning_rate);
  args.beta1 = static_cast<float>(config_.beta1);
  args.beta2 = static_cast<float>(config_.beta2);
  args.epsilon = static_cast<float>(config_.eps);
  args.weight_decay = static_cast<float>(config_.weight_decay);
  args.step = step_number;
  args.max_grad_norm = static_cast<float>(config_.grad_clip);
  return args;
}

void Optimizer::measure_norm(const Tensor& norm_sq) {
  if (!norm_from_update_) params_.grad_norm_sq(norm_sq);
}

void Optimizer::update(AdamWArgs args, const Tensor& norm_sq) {
  // Current scaling: the step records the new amax of each quantized weight it writes whole
  // (a local store's weights are views of its shards), sparing the next casts their passes.
  const std::vector<LinearRecipe::WeightAmax> weights = linears_.weight_amaxes();
  // Delayed scaling: the step writes each quantized weight's next rowwise FP8 copy as well, when
  // every weight lies whole in one shard here (a sharded store's forward casts what it gathers).
  std::vector<LinearRecipe::WeightCast> casts;
  if (params_.shards_are_whole_groups()) casts = linears_.weight_casts();
  bool first_shard = true;
  for (const ParamShard& shard : params_.shards()) {
    args.decay_count = shard.decay_count;
    if (norm_from_update_)
      args.grad_norm_output = first_shard ? AdamWArgs::NormOutput::overwrite : AdamWArgs::NormOutput::add;
    first_shard = false;
    const std::vector<const LinearRecipe::WeightAmax*> recorded = amax_segments(shard, weights, args.weight_amaxes);
    const std::vector<LinearRecipe::WeightCast*> cast = cast_segments(shard, casts, args.weight_casts);
    args.master_low = shard.master_low;  // a split master: (compute_copy, master_low)
    backend_.adamw(shard.master, shard.grad, shard.m, shard.v, shard.compute_copy, norm_sq, args);
    for (const LinearRecipe::WeightAmax* weight : recorded) linears_.weight_amax_recorded(*weight);
    for (LinearRecipe::WeightCast* written : cast) linears_.weight_cast_written(std::move(*written));
    // The shard's gradient is read: where the store frees it now, the next shard's copies take
    // (a quarter of) its place, so the copies add nothing to the step's peak.
    if (!cast.empty()) params_.release_grad(shard.group);
  }
}

std::vector<LinearRecipe::WeightCast*> Optimizer::cast_segments(const ParamShard& shard,
                                                                std::vector<LinearRecipe::WeightCast>& casts,
                                                                std::vector<WeightCastSegment>& segments) {
  segments.clear();
  std::vector<LinearRecipe::WeightCast*> in_shard;
  const Tensor& written = shard.compute_copy.defined() ? shard.compute_copy : shard.master;
  for (LinearRecipe::WeightCast& cast : casts) {
    const int64_t offset = element_offset(written, cast.weight);
    if (offset < 0) continue;
    linears_.prepare_weight_cast(cast);
    segments.push_back({offset, offset + cast.weight.numel(), cast.scale, cast.operand.rowwise, cast.amax});
    in_shard.push_back(&cast);
  }
  return in_shard;
}

std::vector<const LinearRecipe::WeightAmax*> Optimizer::amax_segments(
    const ParamShard& shard, const std::vector<LinearRecipe::WeightAmax>& weights, std::vector<AmaxSegment>& segments) {
  segments.clear();
  std::vector<const LinearRecipe::WeightAmax*> recorded;
  const Tensor& written = shard.compute_copy.defined() ? shard.compute_copy : shard.master;
  for (const LinearRecipe::WeightAmax& weight : weights) {
    const int64_t offset = element_offset(written, weight.weight);
    if (offset < 0) continue;
    segments.push_back({offset, offset + weight.weight.numel(), weight.amax});
    recorded.push_back(&weight);
  }
  return recorded;
}

}  // namespace mxtrain
