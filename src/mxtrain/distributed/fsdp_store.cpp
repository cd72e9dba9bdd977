#include "mxtrain/distributed/fsdp_store.hpp"

#include <algorithm>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/model/local_parameters.hpp"

namespace mxtrain {

const char* sharding_strategy_name(ShardingStrategy strategy) {
  switch (strategy) {
    case ShardingStrategy::full_shard: return "full_shard";
    case ShardingStrategy::shard_grad_op: return "shard_grad_op";
    case ShardingStrategy::no_shard: return "no_shard";
    case ShardingStrategy::hybrid_shard: return "hybrid_shard";
  }
  return "?";
}

FsdpOptions resolve_fsdp_options(const DistConfig& dist, int world_size, int local_world_size) {
  FsdpOptions options;
  if (dist.strategy == "full_shard") {
    options.strategy = ShardingStrategy::full_shard;
  } else if (dist.strategy == "shard_grad_op") {
    options.strategy = ShardingStrategy::shard_grad_op;
  } else if (dist.strategy == "no_shard") {
    options.strategy = ShardingStrategy::no_shard;
  } else if (dist.strategy == "hybrid_shard") {
    options.strategy = ShardingStrategy::hybrid_shard;
  } else {
    throw Error(ErrorKind::config, "dist.strategy = " + dist.strategy + " is unknown",
                "use full_shard, shard_grad_op, no_shard or hybrid_shard");
  }
  switch (options.strategy) {
    case ShardingStrategy::full_shard:
    case ShardingStrategy::shard_grad_op: options.shard_group_size = world_size; break;
    case ShardingStrategy::no_shard: options.shard_group_size = 1; break;
    case ShardingStrategy::hybrid_shard: {
      const int64_t size = dist.shard_group_size > 0 ? dist.shard_group_size : local_world_size;
      if (size > world_size || world_size % size != 0)
        throw Error(ErrorKind::config,
                    strf("dist.shard_group_size = %lld does not divide the %d ranks of this run%s",
                         static_cast<long long>(size), world_size,
                         dist.shard_group_size > 0 ? "" : " (0 means the ranks of one node)"),
                    "set dist.shard_group_size to a divisor of the world size, usually the GPUs per node");
      options.shard_group_size = static_cast<int>(size);
      break;
    }
  }
  if (!parse_dtype(dist.reduce_dtype, &options.reduce_dtype) ||
      (options.reduce_dtype != DType::f32 && options.reduce_dtype != DType::bf16))
    throw Error(ErrorKind::config, "dist.reduce_dtype = " + dist.reduce_dtype + " is not f32 or bf16",
                "reduce gradients in f32 (exact) or bf16 (half the traffic)");
  options.sync_every_micro_batch = dist.sync_every_micro_batch;
  return options;
}

std::map<std::string, int> fsdp_group_sizes(const FsdpOptions& options, int world_size) {
  return {{"shard", options.shard_group_size}, {"replicate", world_size / options.shard_group_size}};
}

FsdpParameterStore::FsdpParameterStore(Backend& backend, const ModelConfig& config, DType compute_dtype,
                                       DType grad_dtype, Communicator& world, const FsdpOptions& options)
    : backend_(backend), config_(config), layout_(build_layout(config)), compute_dtype_(compute_dtype),
      grad_dtype_(grad_dtype), world_(world), options_(options) {
  MXTRAIN_ASSERT(grad_dtype_ == DType::f32, "the FSDP store accumulates f32 gradients, got %s",
                 std::string(dtype_name(grad_dtype_)).c_str());
  const int world_size = world_.size();
  const int shard_size = options_.shard_group_size;
  MXTRAIN_ASSERT(shard_size >= 1 && world_size % shard_size == 0, "shard groups of %d in a world of %d", shard_size,
                 world_size);
  sharded_ = options_.strategy == ShardingStrategy::full_shard ||
             options_.strategy == ShardingStrategy::shard_grad_op ||
             (options_.strategy == ShardingStrategy::hybrid_shard && shard_size > 1);
  if (!sharded_) options_.shard_group_size = 1;
  const int S = options_.shard_group_size;
  replicas_ = world_size / S;
  shard_rank_ = world_.rank() % S;
  replica_rank_ = world_.rank() / S;

  // Communicators, split in the same order on every rank. Keys are dense (the new rank).
  if (sharded_) {
    if (S == world_size) {
      gather_ = &world_;
      reduce_owned_ = world_.split(0, world_.rank(), "world");
    } else {
      gather_owned_ = world_.split(replica_rank_, shard_rank_, "shard");
      reduce_owned_ = world_.split(replica_rank_, shard_rank_, "shard");
      gather_ = gather_owned_.get();
    }
    reduce_ = reduce_owned_.get();
  }
  if (replicas_ > 1) {
    replicate_owned_ = world_.split(shard_rank_, replica_rank_, "replicate");
    replicate_ = replicate_owned_.get();
  }

  groups_.resize(layout_.groups.size());
  for (size_t g = 0; g < layout_.groups.size(); ++g) {
    const ParamGroup& group = layout_.groups[g];
    GroupState& s = groups_[g];
    s.numel = group.numel;
    s.shard_numel = (group.numel + S - 1) / S;
    s.begin = std::min<int64_t>(group.numel, s.shard_numel * shard_rank_);
    s.count = std::min<int64_t>(group.numel, s.begin + s.shard_numel) - s.begin;
    const Shape shape{s.shard_numel};
    const std::string suffix = sharded_ ? ".shard" : "";
    s.master = backend_.allocate(group.name + ".master" + suffix, shape, DType::f32, Lifetime::master_parameter);
    if (compute_dtype_ != DType::f32)
      s.compute = backend_.allocate(group.name + ".weight" + suffix, shape, compute_dtype_, Lifetime::parameter);
    s.grad = backend_.allocate(group.name + ".grad" + suffix, shape, grad_dtype_, Lifetime::gradient);
    s.m = backend_.allocate(group.name + ".adam_m" + suffix, shape, DType::f32, Lifetime::optimizer_state);
    s.v = backend_.allocate(group.name + ".adam_v" + suffix, shape, DType::f32, Lifetime::optimizer_state);
    s.written.reset(group.params.size());
    forward_order_.push_back(static_cast<int>(g));
  }
  // Groups are stored in forward order: embed, blocks, head.
  backward_order_.assign(forward_order_.rbegin(), forward_order_.rend());
}

FsdpParameterStore::~FsdpParameterStore() {
  // Collectives still in flight write into buffers about to be freed: land them first. While an
  // error unwinds, peers may be gone, so nothing more is waited for.
  if (std::uncaught_exceptions() > 0) return;
  for (size_t g = 0; g < groups_.size(); ++g)
    if (groups_[g].gather_in_flight) gather_->wait(groups_[g].gather_id);
  advance_all(true);
}

void FsdpParameterStore::initialize(uint64_t seed) { initialize(random_initialization(config_, seed)); }

void FsdpParameterStore::initialize(const ParameterValues& values) {
  for (size_t g = 0; g < groups_.size(); ++g) {
    GroupState& s = groups_[g];
    if (backend_.device() != Device::none) {
      std::vector<float> host(static_cast<size_t>(s.shard_numel), 0.0f);  // padding stays zero
      if (s.count > 0) group_values(values, layout_.groups[g], s.begin, s.count, host.data());
      backend_.copy_from_host(host.data(), s.master);
    }
    if (s.compute.defined()) backend_.copy(s.master, s.compute);
    backend_.fill(s.grad, 0.0f);
    backend_.fill(s.m, 0.0f);
    backend_.fill(s.v, 0.0f);
  }
}

std::string FsdpParameterStore::describe() const {
  int64_t total = 0, held = 0;
  for (const GroupState& s : groups_) {
    total += s.numel;
    held += s.shard_numel;
  }
  const int S = options_.shard_group_size;
  std::string mesh = sharded_ ? strf("shard groups of %d rank%s x %d replica%s", S, S == 1 ? "" : "s", replicas_,
                                     replicas_ == 1 ? "" : "s")
                              : strf("%d replicas", replicas_);
  std::string reduce = options_.sync_every_micro_batch && sharded_ ? "every micro-batch" : "on the last micro-batch";
  return strf("FSDP %s over %d rank%s (%s; %s): %s of %s parameters per rank; gradients reduced in %s %s",
              sharding_strategy_name(options_.strategy), world_.size(), world_.size() == 1 ? "" : "s", mesh.c_str(),
              std::string(world_.name()).c_str(), log::with_commas(static_cast<double>(held)).c_str(),
              log::with_commas(static_cast<double>(total)).c_str(),
              std::string(dtype_name(options_.reduce_dtype)).c_str(), reduce.c_str());
}

Tensor FsdpParameterStore::slice(const Buffer& buffer, int64_t count) const {
  return buffer.tensor().slice_flat(0, Shape{count});
}

// ---- parameters: gather, prefetch, free ----------------------------------------------------------

Tensor FsdpParameterStore::gather_source(const GroupState& s) const {
  return s.compute.defined() ? s.compute.tensor() : s.master.tensor();
}

void FsdpParameterStore::issue_gather(int group) {
  GroupState& s = state(group);
  s.gathered = backend_.allocate(layout_.groups[static_cast<size_t>(group)].name + ".weight.gathered",
                                 Shape{s.shard_numel * options_.shard_group_size}, compute_dtype_, Lifetime::parameter);
  s.gather_id = gather_->all_gather(gather_source(s), s.gathered);
  s.gather_in_flight = true;
}

void FsdpParameterStore::ensure_gathered(int group) {
  GroupState& s = state(group);
  if (!s.gathered.defined()) issue_gather(group);
  if (s.gather_in_flight) {
    gather_->wait(s.gather_id);
    s.gather_in_flight = false;
  }
}

void FsdpParameterStore::free_gathered(int group) {
  GroupState& s = state(group);
  if (s.gather_in_flight) {
    gather_->wait(s.gather_id);
    s.gather_in_flight = false;
  }
  s.gathered.reset();
}

void FsdpParameterStore::prefetch_after(int group, Pass pass) {
  const std::vector<int>& order = pass == Pass::forward ? forward_order_ : backward_order_;
  auto at = std::find(order.begin(), order.end(), group);
  if (at == order.end() || at + 1 == order.end()) return;
  if (!state(*(at + 1)).gathered.defined()) issue_gather(*(at + 1));
}

void FsdpParameterStore::acquire(int group, Pass pass) {
  if (sharded_) {
    ensure_gathered(group);
    prefetch_after(group, pass);
  }
  if (pass == Pass::backward) ensure_full_grad(group);
}

void FsdpParameterStore::release(int group, Pass pass) {
  if (!sharded_) return;
  // In training, backward frees a group at grads_ready (a tied embedding is used by the head and
  // again by the embedding's own backward); shard_grad_op keeps forward's gather for backward.
  const bool keep = training_ && (pass == Pass::backward || options_.strategy == ShardingStrategy::shard_grad_op);
  if (!keep) free_gathered(group);
}

Tensor FsdpParameterStore::weight(int group, int index) {
  const GroupState& s = state(group);
  const ParamSpec& spec = layout_.groups[static_cast<size_t>(group)].params[static_cast<size_t>(index)];
  if (!sharded_) return (s.compute.defined() ? s.compute.tensor() : s.master.tensor()).slice_flat(spec.offset, spec.shape);
  MXTRAIN_ASSERT(s.gathered.defined() && !s.gather_in_flight, "weight of group %d used outside acquire/release",
                 group);
  return s.gathered.tensor().slice_flat(spec.offset, spec.shape);
}

GradTarget FsdpParameterStore::grad_target(int group, int index) {
  GroupState& s = state(group);
  const ParamSpec& spec = layout_.groups[static_cast<size_t>(group)].params[static_cast<size_t>(index)];
  const Buffer& flat = sharded_ ? s.full_grad : s.grad;
  MXTRAIN_ASSERT(flat.defined(), "gradient of group %d used outside backward", group);
  const bool accumulate = s.written.claim(static_cast<size_t>(index));
  return {flat.tensor().slice_flat(spec.offset, spec.shape), accumulate};
}

Tensor FsdpParameterStore::grad(int group, int index) {
  return gradient_to_add_to(backend_, grad_target(group, index));
}

// ---- gradients: accumulate, reduce, fold into the shard -----------------------------------------

void FsdpParameterStore::ensure_full_grad(int group) {
  GroupState& s = state(group);
  if (!sharded_ || s.full_grad.defined()) return;
  s.full_grad = backend_.allocate(layout_.groups[static_cast<size_t>(group)].name + ".grad.full",
                                  Shape{s.shard_numel * options_.shard_group_size}, grad_dtype_, Lifetime::gradient);
  s.written.reset(layout_.groups[static_cast<size_t>(group)].params.size());  // first writers overwrite
}

void FsdpParameterStore::begin_micro_batch(int index, int count) {
  training_ = true;
  // One rank reduces nothing, so it accumulates like the local store and reduces (copies) once.
  const bool every = options_.sync_every_micro_batch && sharded_ && world_.size() > 1;
  sync_now_ = index == count - 1 || every;
}

void FsdpParameterStore::grads_ready(int group) {
  if (sharded_) free_gathered(group);
  if (!sync_now_) return;
  advance_all(false);
  issue_reduction(group);
}

void FsdpParameterStore::issue_reduction(int group) {
  GroupState& s = state(group);
  const std::string& name = layout_.groups[static_cast<size_t>(group)].name;
  const bool low = options_.reduce_dtype != grad_dtype_;
  PendingReduction r;
  r.group = group;
  r.accumulate = s.reduced_this_step;
  s.reduced_this_step = true;
  // What no op wrote (a parameter the loss does not reach, the shard padding) is zero before
  // anything is reduced.
  s.written.zero_unwritten(backend_, sharded_ ? s.full_grad : s.grad, layout_.groups[static_cast<size_t>(group)]);
  if (sharded_) {
    MXTRAIN_ASSERT(s.full_grad.defined(), "grads_ready(%d) without a backward", group);
    r.full = std::move(s.full_grad);
    Tensor input = r.full;
    if (low) {
      r.full_low = backend_.allocate(name + ".grad.full_reduce", r.full.tensor().shape, options_.reduce_dtype,
                                     Lifetime::communication);
      backend_.copy(r.full, r.full_low);
      input = r.full_low;
    }
    r.into_shard = !low && !r.accumulate;
    if (!r.into_shard)
      r.part = backend_.allocate(name + ".grad.reduced", Shape{s.shard_numel}, options_.reduce_dtype,
                                 Lifetime::communication);
    r.scatter = reduce_->reduce_scatter(input, r.into_shard ? s.grad.tensor() : r.part.tensor(), ReduceOp::sum);
    r.scatter_pending = true;
  } else {
    if (!replicate_) return;  // one rank: nothing to reduce
    // no_shard reduces once per step, so the gradient holds exactly this step's local sum.
    r.into_shard = !low;
    if (low) {
      r.full_low = backend_.allocate(name + ".grad.reduce", s.grad.tensor().shape, options_.reduce_dtype,
                                     Lifetime::communication);
      backend_.copy(s.grad, r.full_low);
    }
    r.replicate = replicate_->all_reduce(low ? r.full_low.tensor() : s.grad.tensor(), ReduceOp::sum);
    r.replicate_pending = true;
  }
  pending_.push_back(std::move(r));
}

bool FsdpParameterStore::advance(PendingReduction& r) {
  GroupState& s = state(r.group);
  if (r.scatter_pending) {
    reduce_->wait(r.scatter);
    r.scatter_pending = false;
    r.full.reset();
    r.full_low.reset();
    if (replicate_) {
      r.replicate = replicate_->all_reduce(r.into_shard ? s.grad.tensor() : r.part.tensor(), ReduceOp::sum);
      r.replicate_pending = true;
      return false;
    }
  }
  if (r.replicate_pending) {
    replicate_->wait(r.replicate);
    r.replicate_pending = false;
  }
  if (!sharded_) {
    if (r.full_low.defined()) backend_.copy(r.full_low, s.grad);
    return true;
  }
  if (r.into_shard) return true;
  if (!r.accumulate) {
    backend_.copy(r.part, s.grad);  // a bf16 reduction, widened
  } else if (r.part.tensor().dtype == grad_dtype_) {
    backend_.add(s.grad, r.part, s.grad);
  } else {
    Buffer widened = backend_.allocate(layout_.groups[static_cast<size_t>(r.group)].name + ".grad.reduced_f32",
                                       Shape{s.shard_numel}, grad_dtype_, Lifetime::communication);
    backend_.copy(r.part, widened);
    backend_.add(s.grad, widened, s.grad);
  }
  return true;
}

void FsdpParameterStore::advance_all(bool to_completion) {
  // Oldest first, so every rank issues the follow-up collectives in the same order.
  do {
    for (size_t i = 0; i < pending_.size();) {
      if (advance(pending_[i])) {
        pending_.erase(pending_.begin() + static_cast<std::ptrdiff_t>(i));
      } else {
        ++i;
      }
    }
  } while (to_completion && !pending_.empty());
}

void FsdpParameterStore::finish_backward() {
  advance_all(true);
  for (size_t g = 0; g < groups_.size(); ++g) {
    free_gathered(static_cast<int>(g));
    MXTRAIN_ASSERT(!groups_[g].full_grad.defined(), "group %zu's gradient was never reduced", g);
  }
  training_ = false;
}

std::vector<ParamShard> FsdpParameterStore::shards() {
  std::vector<ParamShard> result;
  for (size_t g = 0; g < groups_.size(); ++g) {
    const GroupState& s = groups_[g];
    if (s.count == 0) continue;  // this rank's slice of a small group is all padding
    const int64_t decay = std::clamp<int64_t>(layout_.groups[g].decay_numel - s.begin, 0, s.count);
    result.push_back(ParamShard{static_cast<int>(g), s.begin, s.count, slice(s.master, s.count),
                                slice(s.grad, s.count), slice(s.m, s.count), slice(s.v, s.count),
                                s.compute.defined() ? slice(s.compute, s.count) : Tensor(), decay, Tensor()});
  }
  return result;
}

void FsdpParameterStore::grad_norm_sq(const Tensor& out) {
  backend_.fill(out, 0.0f);
  for (const GroupState& s : groups_)
    if (s.count > 0) backend_.sum_of_squares(slice(s.grad, s.count), out, true);
  // Each slice counted once: summed over the shard group, never over replicas (they hold copies).
  if (sharded_ && options_.shard_group_size > 1) reduce_->wait(reduce_->all_reduce(out, ReduceOp::sum));
}

void FsdpParameterStore::zero_grads() {
  for (size_t g = 0; g < groups_.size(); ++g) {
    GroupState& s = groups_[g];
    // Sharded: the shard's sums start from zero (each reduction's slice lands in or adds to it).
    // Unsharded, gradients accumulate in s.grad itself: its first writers overwrite instead.
    if (sharded_) backend_.fill(s.grad, 0.0f);
    else s.written.reset(layout_.groups[g].params.size());
    s.reduced_this_step = false;
  }
}

}  // namespace mxtrain
