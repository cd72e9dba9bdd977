// The dryrun backend computes nothing. It hands out fake addresses through the same caching
// allocator as the real backends and reports every op to its observer, so running the real
// step code on it yields the exact allocation trace, peak bytes and op list of a real step.
#pragma once
#include "mxtrain/backend/backend.hpp"

namespace mxtrain {

class DryrunBackend final : public Backend {
 public:
  // memory_bytes: the simulated device's capacity (0 = unlimited); label: e.g. "h200".
  DryrunBackend(size_t memory_bytes, std::string label);

  std::string_view name() const override { return "dryrun"; }
  Device device() const override { return Device::none; }
  DeviceProperties properties() const override;
  bool supports(OpKind, DType dtype) const override;
  void synchronize() override {}

 protected:
  void impl_fill(const Tensor&, float) override {}
  void impl_copy(const Tensor&, const Tensor&) override {}
  void impl_copy_from_host(const void*, const Tensor&) override {}
  void impl_copy_to_host(const Tensor&, void*) override {}
  void impl_embedding_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t) override {}
  void impl_embedding_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t) override {}
  void impl_norm_forward(NormKind, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, float) override {}
  void impl_add_norm_forward(NormKind, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor&, float) override {}
  void impl_norm_backward(NormKind, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                          const Tensor&, const Tensor&, const Tensor&, bool) override {}
  void impl_linear_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_linear_backward_input(const Tensor&, const Tensor&, const Tensor&, bool) override {}
  void impl_linear_backward_weight(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_rope(const Tensor&, const AttentionShape&, float, bool) override {}
  void impl_attention_forward(const Tensor&, const Tensor&, const Tensor&, const AttentionShape&) override {}
  void impl_attention_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                               const AttentionShape&) override {}
  void impl_swiglu_forward(const Tensor&, const Tensor&) override {}
  void impl_swiglu_backward(const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_gelu_forward(const Tensor&, const Tensor&) override {}
  void impl_gelu_backward(const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_add(const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_cross_entropy(const Tensor&, const Tensor&, const Tensor&, int64_t, float) override {}
  void impl_sum(const Tensor&, const Tensor&, bool, bool) override {}
  void impl_scale(const Tensor&, float) override {}
  void impl_adamw(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  const AdamWArgs&) override {}

 private:
  size_t memory_bytes_;
  std::string label_;
};

}  // namespace mxtrain
