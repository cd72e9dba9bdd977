// ParameterStore: how model code reaches its weights and gradients, and the seam where FSDP
// plugs in. The model brackets each group's use with acquire/release and reports when the
// group's gradients for this micro-batch are complete; a local store does nothing there, an
// FSDP store all-gathers, frees and reduce-scatters. The trainer drives the optimizer, norms
// and checkpoints through the same object, so sharding never leaks into model or trainer code.
#pragma once
#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/model/layout.hpp"

namespace mxtrain {

enum class Pass : uint8_t { forward, backward };

// One group's locally owned slice, as the optimizer and checkpoints see it.
struct ParamShard {
  int group = 0;
  int64_t begin = 0;    // first element of the group held here
  int64_t count = 0;    // elements held here
  Tensor master;        // f32 [count]; undefined when the master is split (master_low)
  Tensor grad;          // reduced gradient [count] (f32 or compute dtype); a local store leaves it
                        // undefined between an update and the next backward pass
  Tensor m, v;          // f32 [count]
  Tensor compute_copy;  // compute-dtype copy refreshed by the optimizer (undefined when compute is f32)
  int64_t decay_count = 0;  // elements [0, decay_count) of this shard get weight decay
  // A split master (numerics/split_master.hpp): u8 [2 * count], the low halves, with
  // compute_copy (bf16) the high halves. Read and write masters through download_master and
  // upload_master, which handle both forms.
  Tensor master_low;
};

// The shard's f32 master weights into host[count]; and from host[count] into the shard, its
// compute copy refreshed (the copy is the master's rounding, or its high half when split).
void download_master(Backend& backend, const ParamShard& shard, float* host);
void upload_master(Backend& backend, const ParamShard& shard, const float* host);

// A gradient as an op that can either overwrite or add sees it: accumulate is false for the
// parameter's first write since its gradient buffer was last zeroed or allocated, so the writer
// overwrites (a GEMM with beta = 0) and no zero fill runs before it; true afterwards (gradient
// accumulation over micro-batches, a tied embedding written by the head and the embedding).
struct GradTarget {
  Tensor tensor;
  bool accumulate = true;
};

// Which parameters of one group's gradient buffer hold a value: the stores' bookkeeping behind
// grad() and grad_target(). A buffer starts (reset) with nothing written; zero_unwritten() fills
// what no op wrote, in contiguous runs, before anything reads the whole buffer.
class GradWrites {
 public:
  void reset(size_t params) {
    written_.assign(params, false);
    padding_zeroed_ = false;
  }
  // Whether parameter `index` held a value already (the writer must add); marks it written.
  bool claim(size_t index);
  // Zero-fills parameters never written (and `flat` past the group's last element: FSDP's
  // padding), marking every parameter written.
  void zero_unwritten(Backend& backend, const Tensor& flat, const ParamGroup& group);

 private:
  std::vector<bool> written_;
  bool padding_zeroed_ = false;
};

// What the stores' grad() hands a writer that only adds: the target, zero-filled first when this
// is the parameter's first write.
Tensor gradient_to_add_to(Backend& backend, const GradTarget& target);

class ParameterStore {
 public:
  virtual ~ParameterStore() = default;
  virtual const ModelLayout& layout() const = 0;
  virtual DType compute_dtype() const = 0;
  virtual DType grad_dtype() const = 0;

  // ---- model side -------------------------------------------------------------------------
  virtual void acquire(int group, Pass pass) = 0;
  virtual void release(int group, Pass pass) = 0;
  // Compute-precision view of one parameter (valid between acquire and release).
  virtual Tensor weight(int group, int index) = 0;
  // Where this micro-batch's gradient of one parameter accumulates (valid from acquire(backward)
  // until grads_ready), zero before its first write.
  virtual Tensor grad(int group, int index) = 0;
  // The same gradient for a writer that can overwrite (GradTarget). Either call counts as a write.
  virtual GradTarget grad_target(int group, int index) = 0;
  virtual void grads_ready(int group) = 0;

  // ---- trainer side -----------------------------------------------------------------------
  // Called before each micro-batch; FSDP may skip reduction on non-final ones.
  virtual void begin_micro_batch(int index, int count) = 0;
  // Everything in flight has landed (after the last micro-batch's backward).
  virtual void finish_backward() = 0;
  virtual std::vector<ParamShard> shards() = 0;
  // out f32[1] = global sum of squared gradients (over all ranks).
  virtual void grad_norm_sq(const Tensor& out) = 0;
  virtual void zero_grads() = 0;
  // After the update of `group`'s shard, before zero_grads: a store that allocates gradients per
  // step may free that group's now (the optimizer's FP8 weight copies take the room).
  virtual void release_grad(int group) { (void)group; }
  virtual int world_size() const { return 1; }

  // ---- what the store is, for the trainer's decisions ---------------------------------------
  // The trainer asks these instead of testing the store's type, so a store wrapped in another
  // (the planner's ObservedStore) leads to the decisions the run itself takes. Pure virtual:
  // every wrapper has to forward them.
  //
  // Whether this rank's shards() hold every element of the model's gradient once, fully reduced
  // (whole groups): then the sum of their squares is the global squared norm, and the AdamW pass
  // can leave it (AdamWArgs::grad_norm_output) instead of a separate grad_norm_sq pass.
  virtual bool shards_are_whole_groups() const = 0;
  // Whether a step over this store issues the same launches from step to step with nothing but
  // device work between them, so it can be captured once and replayed (train.cuda_graph).
  virtual bool step_graph_capturable() const = 0;
  // "local", or the FSDP strategy ("full_shard", ...): what a checkpoint records as its strategy.
  virtual std::string strategy_name() const = 0;
  // One line for the log on how parameters are held (sharding, mesh, reduction); "" when there
  // is nothing to say beyond the start-up lines.
  virtual std::string describe() const = 0;
  // Whether this rank writes its shards into checkpoints: replicas hold identical slices, and
  // only the first replica writes them.
  virtual bool writes_checkpoint_shards() const = 0;
};

}  // namespace mxtrain
