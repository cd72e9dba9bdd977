// FSDP: the ParameterStore that shards. Each parameter group (embed, every block, head) is one
// flat parameter, padded to a multiple of the shard-group size S; rank r of the shard group
// owns elements [r·P, (r+1)·P) with P = ceil(numel / S), and holds the FP32 master, the Adam
// moments, the reduced FP32 gradient and the compute-dtype copy (what the optimizer refreshes
// and what is all-gathered) of that slice only.
//
// Strategies (the mesh is shard groups of S consecutive ranks × R = world / S replicas):
//   full_shard    (ZeRO-3) gather before forward, free after; gather again before backward.
//   shard_grad_op (ZeRO-2) gather once in forward, keep through the group's backward.
//   no_shard      (DDP) every rank holds everything; gradients are all-reduced once per step.
//   hybrid_shard  full_shard inside each shard group; gradients reduce-scattered in the shard
//                 group, then all-reduced over the R replicas of the same slice.
//
// Schedule, issued in the same order on every rank: acquire(g) waits for g's gather (issuing it
// if no prefetch did) and prefetches the next group in this pass's order (forward: embed,
// blocks, head; backward: the reverse) on the gather communicator. grads_ready(g) issues g's
// reduce-scatter on a second communicator (NCCL serialises one communicator's operations), so it
// overlaps the next group's backward; the results are waited for one group later, where the
// replica all-reduce is issued, and folded into the shard gradient one group after that. On
// non-final micro-batches with dist.sync_every_micro_batch = false (and always at world size 1,
// and for no_shard) full-size gradients accumulate locally and only the last micro-batch
// reduces — so one rank reproduces the local store exactly.
#pragma once
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/distributed/communicator.hpp"
#include "mxtrain/model/parameters.hpp"

namespace mxtrain {

enum class ShardingStrategy : uint8_t { full_shard, shard_grad_op, no_shard, hybrid_shard };
const char* sharding_strategy_name(ShardingStrategy strategy);

struct FsdpOptions {
  ShardingStrategy strategy = ShardingStrategy::full_shard;
  int shard_group_size = 1;  // S: ranks that split each group's elements
  DType reduce_dtype = DType::f32;
  bool sync_every_micro_batch = true;
};

// dist.* resolved for a world: full_shard and shard_grad_op shard over all ranks, no_shard over
// none, hybrid_shard over dist.shard_group_size ranks (0 = the ranks of one node). Throws
// Error(config) naming the key.
FsdpOptions resolve_fsdp_options(const DistConfig& dist, int world_size, int local_world_size);

// Sizes of the groups the store splits off the world ("shard", "replicate"), for a
// FakeCommunicator standing in for the world.
std::map<std::string, int> fsdp_group_sizes(const FsdpOptions& options, int world_size);

class FsdpParameterStore final : public ParameterStore {
 public:
  // Collective: every rank of `world` constructs its store with the same arguments.
  FsdpParameterStore(Backend& backend, const ModelConfig& config, DType compute_dtype, DType grad_dtype,
                     Communicator& world, const FsdpOptions& options);
  ~FsdpParameterStore() override;

  // Fills this rank's slices from initial_values() (no communication); zeroes the rest.
  void initialize(uint64_t seed);
  // The same from any source of values (a Hugging Face checkpoint: model.init_from).
  void initialize(const ParameterValues& values);

  const ModelLayout& layout() const override { return layout_; }
  DType compute_dtype() const override { return compute_dtype_; }
  DType grad_dtype() const override { return grad_dtype_; }
  void acquire(int group, Pass pass) override;
  void release(int group, Pass pass) override;
  Tensor weight(int group, int index) override;
  Tensor grad(int group, int index) override;
  GradTarget grad_target(int group, int index) override;
  void grads_ready(int group) override;
  void begin_micro_batch(int index, int count) override;
  void finish_backward() override;
  std::vector<ParamShard> shards() override;
  void grad_norm_sq(const Tensor& out) override;
  void zero_grads() override;
  int world_size() const override { return world_.size(); }
  // Unsharded (no_shard, or shard groups of one rank), a rank's slices are whole groups holding
  // the all-reduced gradient; sharded, the norm needs the shard group's all-reduce (grad_norm_sq).
  bool shards_are_whole_groups() const override { return !sharded_; }
  // Collectives are not captured into step graphs (untested under capture).
  bool step_graph_capturable() const override { return false; }
  std::string strategy_name() const override { return sharding_strategy_name(options_.strategy); }
  // One line for the log: strategy, mesh, elements per rank, reduction.
  std::string describe() const override;
  bool writes_checkpoint_shards() const override { return replica_rank_ == 0; }

  const FsdpOptions& options() const { return options_; }
  // Elements each rank of a shard group holds of `group` (padding included).
  int64_t shard_numel(int group) const { return groups_[static_cast<size_t>(group)].shard_numel; }

 private:
  struct GroupState {
    int64_t numel = 0;        // real elements of the group
    int64_t shard_numel = 0;  // P: elements per rank, padding included (numel in no_shard)
    int64_t begin = 0;        // first element owned here
    int64_t count = 0;        // real elements owned here (<= shard_numel; 0 for an all-padding slice)
    Buffer master, compute, grad, m, v;  // [shard_numel]
    Buffer gathered;          // sharded: compute dtype [shard_numel * S], while in use or prefetched
    WorkId gather_id = 0;
    bool gather_in_flight = false;
    Buffer full_grad;         // sharded: grad dtype [shard_numel * S], from acquire(backward) to reduction
    GradWrites written;       // of the gradient the model writes (full_grad sharded, grad unsharded)
    bool reduced_this_step = false;
  };
  struct PendingReduction {
    int group = 0;
    Buffer full, full_low;    // the full gradient and its reduce-dtype copy (inputs)
    Buffer part;              // the reduced slice when it does not land in the shard gradient directly
    bool into_shard = false;  // the collectives write the shard gradient itself
    bool accumulate = false;  // add into the shard gradient (it already holds this step's earlier sums)
    WorkId scatter = 0, replicate = 0;
    bool scatter_pending = false, replicate_pending = false;
  };

  GroupState& state(int group) { return groups_[static_cast<size_t>(group)]; }
  Tensor gather_source(const GroupState& group) const;
  void issue_gather(int group);
  void ensure_gathered(int group);
  void free_gathered(int group);
  void prefetch_after(int group, Pass pass);
  void ensure_full_grad(int group);
  void issue_reduction(int group);
  bool advance(PendingReduction& reduction);  // true when finished
  void advance_all(bool to_completion);
  Tensor slice(const Buffer& buffer, int64_t count) const;

  Backend& backend_;
  ModelConfig config_;
  ModelLayout layout_;
  DType compute_dtype_, grad_dtype_;
  Communicator& world_;
  FsdpOptions options_;
  bool sharded_ = true;       // false: no_shard layout (every rank holds every element)
  int shard_rank_ = 0, replica_rank_ = 0, replicas_ = 1;
  std::unique_ptr<Communicator> gather_owned_, reduce_owned_, replicate_owned_;
  Communicator* gather_ = nullptr;     // shard group: all-gathers
  Communicator* reduce_ = nullptr;     // shard group: reduce-scatters and the norm
  Communicator* replicate_ = nullptr;  // across replicas: gradient all-reduce (null when R = 1)
  std::vector<GroupState> groups_;
  std::vector<int> forward_order_, backward_order_;
  std::deque<PendingReduction> pending_;
  bool training_ = false;   // between begin_micro_batch and finish_backward
  bool sync_now_ = true;    // this micro-batch reduces its gradients
};

}  // namespace mxtrain
