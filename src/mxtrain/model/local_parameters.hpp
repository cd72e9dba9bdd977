// The single-process ParameterStore: every group's master weights, compute copy, gradients and
// Adam moments live whole on one backend. With FP32 compute the master tensor is the compute
// weight; otherwise the optimizer refreshes a compute-dtype copy after each update. With
// split_masters (precision bf16) the master is split (numerics/split_master.hpp): the bf16 copy
// is its high half and master_low its low half, so no f32 master tensor exists (2 bytes a
// parameter less, and the update moves 26 bytes a parameter instead of 28). Gradients
// are allocated at their first use in a step and freed by zero_grads() (set_to_none): shards()
// leaves a gradient undefined while it does not exist. A gradient's first writer overwrites it
// (grad_target), so no zero fill runs in a step but for parameters no op reached.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "mxtrain/model/parameters.hpp"

namespace mxtrain {

class LocalParameterStore final : public ParameterStore {
 public:
  // master_only_groups: groups that keep no compute-dtype copy; weight() hands out their FP32
  // masters (quantized_weights: the linear recipe quantizes the blocks' matrices from them, the
  // embedding lookup rounds the token table's rows).
  // block_grad_dtype: the blocks' gradients (precision.cpp's block_grad_dtype; default
  // grad_dtype); the embedding and head groups take grad_dtype. split_masters (bf16 compute):
  // each group with a compute copy keeps its master split (numerics/split_master.hpp).
  LocalParameterStore(Backend& backend, const ModelConfig& config, DType compute_dtype, DType grad_dtype,
                      const std::vector<int>& master_only_groups = {},
                      std::optional<DType> block_grad_dtype = std::nullopt, bool split_masters = false);

  // Fills master (and compute) weights from initial_values(); zeroes gradients and moments.
  void initialize(uint64_t seed);
  // The same from any source of values (a Hugging Face checkpoint: model.init_from).
  void initialize(const ParameterValues& values);

  const ModelLayout& layout() const override { return layout_; }
  DType compute_dtype() const override { return compute_dtype_; }
  DType grad_dtype() const override { return grad_dtype_; }
  DType block_grad_dtype() const { return block_grad_dtype_; }
  void acquire(int, Pass) override {}
  void release(int, Pass) override {}
  Tensor weight(int group, int index) override;
  Tensor grad(int group, int index) override;
  GradTarget grad_target(int group, int index) override;
  void grads_ready(int) override {}
  // Refuses a step of several micro-batches when the blocks' gradients are in a lower precision
  // than grad_dtype: their sum would round in that precision (precision.grad_dtype).
  void begin_micro_batch(int index, int count) override;
  void finish_backward() override;
  std::vector<ParamShard> shards() override;
  void grad_norm_sq(const Tensor& out) override;
  void zero_grads() override;
  void release_grad(int group) override;
  bool shards_are_whole_groups() const override { return true; }
  bool step_graph_capturable() const override { return true; }
  std::string strategy_name() const override { return "local"; }
  std::string describe() const override { return ""; }
  bool writes_checkpoint_shards() const override { return true; }

 private:
  struct GroupStorage {
    Buffer master, compute, grad, m, v;
    Buffer master_low;  // u8 [2n]: a split master's low halves (master then unallocated)
    GradWrites written;  // of grad, since its allocation
  };
  Tensor param_view(const Tensor& flat, const ParamSpec& spec) const;
  // A shard with the fields that hold the group's master (f32, or split) and its compute copy.
  static ParamShard master_of(const GroupStorage& storage);
  const Buffer& grad_buffer(size_t group);  // allocated (not zeroed) on first use
  // grad_buffer with every parameter no op wrote zeroed: the whole gradient, for its readers.
  const Buffer& complete_grad(size_t group);

  Backend& backend_;
  ModelConfig config_;
  ModelLayout layout_;
  DType compute_dtype_, grad_dtype_, block_grad_dtype_;
  std::vector<GroupStorage> groups_;
};

// Writes the values of elements [begin, begin+count) of a group into host memory, parameter by
// parameter from `values`.
void group_values(const ParameterValues& values, const ParamGroup& group, int64_t begin, int64_t count, float* out);

}  // namespace mxtrain
