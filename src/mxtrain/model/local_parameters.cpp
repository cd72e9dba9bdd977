#include "mxtrain/model/local_parameters.hpp"

#include <algorithm>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

void group_values(const ParameterValues& values, const ParamGroup& group, int64_t begin, int64_t count, float* out) {
  for (const ParamSpec& spec : group.params) {
    int64_t lo = std::max(begin, spec.offset);
    int64_t hi = std::min(begin + count, spec.offset + spec.numel());
    if (hi > lo) values(spec, lo - spec.offset, hi - lo, out + (lo - begin));
  }
}

LocalParameterStore::LocalParameterStore(Backend& backend, const ModelConfig& config, DType compute_dtype,
                                         DType grad_dtype, const std::vector<int>& master_only_groups,
                                         std::optional<DType> block_grad_dtype, bool split_masters)
    : backend_(backend), config_(config), layout_(build_layout(config)), compute_dtype_(compute_dtype),
      grad_dtype_(grad_dtype), block_grad_dtype_(block_grad_dtype.value_or(grad_dtype)) {
  groups_.resize(layout_.groups.size());
  std::vector<bool> master_only(layout_.groups.size(), false);
  for (int group : master_only_groups) master_only.at(static_cast<size_t>(group)) = true;
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const ParamGroup& group = layout_.groups[g];
    GroupStorage& storage = groups_[g];
    Shape flat{group.numel};
    // A bf16 compute copy and the low halves hold the f32 master exactly (split_master.hpp).
    if (split_masters && compute_dtype_ == DType::bf16 && !master_only[g])
      storage.master_low =
          backend_.allocate(group.name + ".master_low", Shape{2 * group.numel}, DType::u8, Lifetime::master_parameter);
    else
      storage.master = backend_.allocate(group.name + ".master", flat, DType::f32, Lifetime::master_parameter);
    if (compute_dtype_ != DType::f32 && !master_only[g])
      storage.compute = backend_.allocate(group.name + ".weight", flat, compute_dtype_, Lifetime::parameter);
    storage.m = backend_.allocate(group.name + ".adam_m", flat, DType::f32, Lifetime::optimizer_state);
    storage.v = backend_.allocate(group.name + ".adam_v", flat, DType::f32, Lifetime::optimizer_state);
  }
}

void LocalParameterStore::initialize(uint64_t seed) { initialize(random_initialization(config_, seed)); }

void LocalParameterStore::initialize(const ParameterValues& values) {
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    GroupStorage& storage = groups_[g];
    if (backend_.device() != Device::none) {
      std::vector<float> host(static_cast<size_t>(layout_.groups[g].numel));
      group_values(values, layout_.groups[g], 0, layout_.groups[g].numel, host.data());
      upload_master(backend_, master_of(storage), host.data());
    } else if (storage.master.defined() && storage.compute.defined()) {
      backend_.copy(storage.master, storage.compute);  // the dryrun's record of the op
    }
    backend_.fill(storage.m, 0.0f);
    backend_.fill(storage.v, 0.0f);
  }
}

ParamShard LocalParameterStore::master_of(const GroupStorage& storage) {
  ParamShard shard;
  shard.master = storage.master.tensor();
  shard.master_low = storage.master_low.tensor();
  shard.compute_copy = storage.compute.tensor();
  return shard;
}

Tensor LocalParameterStore::param_view(const Tensor& flat, const ParamSpec& spec) const {
  return flat.slice_flat(spec.offset, spec.shape);
}

Tensor LocalParameterStore::weight(int group, int index) {
  const GroupStorage& storage = groups_[static_cast<size_t>(group)];
  const Tensor& flat = storage.compute.defined() ? storage.compute.tensor() : storage.master.tensor();
  return param_view(flat, layout_.groups[static_cast<size_t>(group)].params[static_cast<size_t>(index)]);
}

// Gradients exist from the first backward touch to the optimizer step, like PyTorch's
// zero_grad(set_to_none=True): at the end of the forward pass, where activations peak, only the
// groups the loss has already reached (the head) hold gradient memory; the others are allocated
// as the backward pass frees the activations of later layers.
const Buffer& LocalParameterStore::grad_buffer(size_t group) {
  GroupStorage& storage = groups_[group];
  if (!storage.grad.defined()) {
    const bool block = layout_.is_layer_group(static_cast<int>(group));
    storage.grad = backend_.allocate(layout_.groups[group].name + ".grad", Shape{layout_.groups[group].numel},
                                     block ? block_grad_dtype_ : grad_dtype_, Lifetime::gradient);
    storage.written.reset(layout_.groups[group].params.size());
  }
  return storage.grad;
}

const Buffer& LocalParameterStore::complete_grad(size_t group) {
  const Buffer& grad = grad_buffer(group);
  groups_[group].written.zero_unwritten(backend_, grad, layout_.groups[group]);
  return grad;
}

GradTarget LocalParameterStore::grad_target(int group, int index) {
  const auto g = static_cast<size_t>(group);
  const Buffer& flat = grad_buffer(g);
  const bool accumulate = groups_[g].written.claim(static_cast<size_t>(index));
  return {param_view(flat, layout_.groups[g].params[static_cast<size_t>(index)]), accumulate};
}

void LocalParameterStore::begin_micro_batch(int, int count) {
  if (count > 1 && block_grad_dtype_ != grad_dtype_)
    throw Error(ErrorKind::config,
                strf("a step of %d micro-batches would sum the blocks' gradients in %s (precision.grad_dtype "
                     "resolved for one micro-batch a step)",
                     count, std::string(dtype_name(block_grad_dtype_)).c_str()),
                "set train.global_batch_size to the batch the step takes, or precision.grad_dtype = f32");
}

Tensor LocalParameterStore::grad(int group, int index) {
  return gradient_to_add_to(backend_, grad_target(group, index));
}

void LocalParameterStore::finish_backward() {
  for (size_t g = 0; g < groups_.size(); ++g) complete_grad(g);
}

std::vector<ParamShard> LocalParameterStore::shards() {
  std::vector<ParamShard> result;
  for (size_t g = 0; g < groups_.size(); ++g) {
    GroupStorage& storage = groups_[g];
    const ParamGroup& group = layout_.groups[g];
    const Tensor grad = storage.grad.defined() ? storage.grad.tensor() : Tensor();
    ParamShard shard = master_of(storage);
    shard.group = static_cast<int>(g);
    shard.count = group.numel;
    shard.grad = grad;
    shard.m = storage.m;
    shard.v = storage.v;
    shard.decay_count = group.decay_numel;
    result.push_back(shard);
  }
  return result;
}

// After finish_backward every group has its whole gradient (zeros where no op wrote), so
// shards() hands the optimizer a gradient for every group.
void LocalParameterStore::grad_norm_sq(const Tensor& out) {
  for (size_t g = 0; g < groups_.size(); ++g) backend_.sum_of_squares(complete_grad(g), out, g > 0);
}

void LocalParameterStore::release_grad(int group) { groups_.at(static_cast<size_t>(group)).grad.reset(); }

void LocalParameterStore::zero_grads() {
  for (GroupStorage& storage : groups_) storage.grad.reset();
}

}  // namespace mxtrain
