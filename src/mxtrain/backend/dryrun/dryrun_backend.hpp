// The dryrun backend computes nothing. It hands out fake addresses through the same caching
// allocator as the real backends and reports every op to its observer, so running the real
// step code on it yields the exact allocation trace, peak bytes and op list of a real step.
//
// A GPU backend also allocates inside its ops, through the same allocator: library workspaces
// and kernel scratch. When planning for a GPU the dryrun records those allocations too: the
// lists backend/private_buffers.hpp returns for each op, the same functions backend/cuda
// allocates from, so its peak and reserved bytes are what the cuda backend's allocator reports.
// Without the model it allocates exactly what the cpu backend does (nothing inside ops).
#pragma once
#include <map>
#include <tuple>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/backend/private_buffers.hpp"

namespace mxtrain {

// The device facts backend/cuda sizes its private buffers with (private_buffers.hpp), as the
// dryrun models them: sizes that come from a library's plan are data (plan/calibration fills
// these fields from configs/plan/calibration.json), and `recorded` holds values a cuda run
// reported (CudaBackend::device_facts()), used in place of the model where present.
struct CudaAllocationModel {
  bool enabled = false;
  // cuDNN's SDPA workspace. Forward: what the graph asks for. Backward: cudnn-frontend's SDPA
  // backward node keeps dQ accumulated in f32 [b, h, s, d] and the softmax sum f32 [b, h, s] in
  // its workspace, plus what the engine itself asks for. With grouped-query heads (kv_heads <
  // heads) it also asks for 4 bytes per b·h·s·d (dK and dV for every query head before they are
  // summed per KV head); measured on the H200.
  int64_t attention_forward_workspace_bytes = 0;
  double attention_backward_dq_accum_f32 = 1;     // f32 elements per b·h·s·d
  double attention_backward_row_f32 = 1;          // f32 elements per b·h·s
  double attention_backward_gqa_bytes = 4;        // bytes per b·h·s·d when kv_heads < heads
  int64_t attention_backward_engine_bytes = 0;
  bool deterministic_attention = false;  // dP workspace b·h·s64·s128·2 bytes instead of dQ accum
  // train.attention_backward = flash-attention-4: the backward's workspace is FlashAttention-4's
  // buffers, sized by formula (private_buffers::flash_attention_4_workspace), not a fact.
  bool flash_attention_4_backward = false;
  // Not a fact but the run's setting (train.gemm_kernels with quack's SwiGLU on a Hopper GPU): the
  // llama gate/up GEMM with SwiGLU in its epilogue, as CudaBackend::gemm_fuses_swiglu answers.
  bool gemm_swiglu_fused = false;
  // Not a fact but the run's setting (train.gemm_kernels with quack's GELU GEMMs on a Hopper GPU):
  // GPT-2's DGELU GEMM sums the up projection's bias gradient, as
  // CudaBackend::gemm_fuses_dgelu_bias_gradient answers.
  bool gemm_dgelu_bias_fused = false;
  // Not a fact but the run's setting (train.head_loss = quack-lce on a Hopper GPU): the LM head's
  // chunks as quack's linear cross-entropy where CudaBackend::fuses_head_loss would take them.
  bool head_loss_fused = false;
  // cub's radix-sort temp storage of the embedding backward (about this many bytes per token
  // plus a fixed part; the exact figure is cub's and depends on its version).
  double embedding_sort_bytes_per_token = 9;
  int64_t embedding_sort_fixed_bytes = 65536;
  // Not a fact but the cuda backend's setting (set_fused_bias_gradient): the bias gradient from
  // the BGRADB epilogue (assumed available for every shape) instead of the column-sum kernel.
  bool bias_gradient_fused = false;
  private_buffers::DeviceFacts recorded;

  // The modelled facts (recorded ones first).
  int64_t attention_workspace_bytes(const AttentionShape& shape, DType io, bool backward) const;
  int64_t embedding_sort_bytes(int64_t tokens, int key_bits) const;
};

// Not final: tests derive from it to watch the private buffers of each op.
class DryrunBackend : public Backend {
 public:
  // memory_bytes: the simulated device's capacity (0 = unlimited); label: e.g. "h200".
  DryrunBackend(size_t memory_bytes, std::string label, CudaAllocationModel cuda_model = {});

  std::string_view name() const override { return "dryrun"; }
  Device device() const override { return Device::none; }
  DeviceProperties properties() const override;
  bool supports(OpKind kind, DType dtype) const override;
  bool gemm_fuses_swiglu(DType dtype, int64_t k, int64_t ffn) const override {
    return cuda_.enabled && cuda_.gemm_swiglu_fused && dtype == DType::bf16 && k % 8 == 0 && ffn % 8 == 0;
  }
  bool gemm_fuses_dgelu_bias_gradient(DType dtype, int64_t k, int64_t n) const override {
    return cuda_.enabled && cuda_.gemm_dgelu_bias_fused && dtype == DType::bf16 && k % 8 == 0 && n % 8 == 0;
  }
  bool fuses_head_loss(const HeadLossChunk& c) const override {
    return cuda_.enabled && cuda_.head_loss_fused && private_buffers::head_loss_unfusable(c).empty();
  }
  // FlashAttention-4's backward: its shape rules (the build's configurations are the cuda run's).
  void check_attention_backward(const AttentionShape& shape, DType activations) const override;
  void synchronize() override {}
  const CudaAllocationModel& cuda_model() const { return cuda_; }
  // Every device fact the private buffers were sized with so far, keyed as the cuda backend's
  // CudaBackend::device_facts(): the model's values (or the recorded ones it was given).
  const private_buffers::DeviceFacts& device_facts_used() const { return facts_used_; }
  // The GEMM operand formats the simulated GPU runs natively (supports(linear_forward, e4m3 |
  // e8m0 | e2m1)); the precision recipes emulate the others. Default: none.
  void set_native_quantized_gemms(std::vector<DType> dtypes) { native_quantized_gemms_ = std::move(dtypes); }

 protected:
  void impl_fill(const Tensor&, float) override {}
  void impl_copy(const Tensor&, const Tensor&) override {}
  void impl_copy_from_host(const void*, const Tensor&) override {}
  void impl_copy_to_host(const Tensor&, void*) override {}
  void impl_embedding_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, int64_t) override {}
  void impl_embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                               const Tensor& dposition_table, int64_t seq_len) override;
  void impl_norm_forward(NormKind, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                         const Tensor&, float, const Tensor&) override {}
  void impl_add_norm_forward(NormKind, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                             const Tensor&, const Tensor&, const Tensor&, float, const Tensor&) override {}
  void impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                          const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams,
                          const Tensor& dx_amax, const DxColumnSums& dx_sums) override;
  // The GEMMs compute nothing; what backend/cuda allocates inside them is replayed.
  void impl_gemm(const GemmArgs& args) override;
  void impl_rope(const Tensor& qkv, const AttentionShape& shape, const RopeSpec& rope, bool inverse,
                 const Tensor& out_amax) override;
  void impl_attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                             const AttentionShape& shape) override;
  void impl_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              const AttentionShape& shape) override;
  void impl_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                               const Tensor& dqkv, const AttentionShape& shape) override;
  void impl_swiglu_forward(const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_swiglu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_gelu_forward(const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_gelu_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_add(const Tensor&, const Tensor&, const Tensor&) override {}
  void impl_cross_entropy(const Tensor&, const Tensor&, const Tensor&, int64_t, float) override {}
  void impl_head_loss_fused(const HeadLossChunk& c) override {
    const std::vector<Buffer> scratch = private_buffers::allocate_private(*this, private_buffers::head_loss(c).buffers);
  }
  void impl_sum(const Tensor&, const Tensor&, bool, bool) override {}
  void impl_scale(const Tensor&, float) override {}
  void impl_amax(const Tensor&, const Tensor&, bool, bool) override {}
  void impl_quantize(const Tensor&, const Tensor&, const QuantizedTensor&, const QuantizedTensor&, const Tensor&,
                     const ScaleFromAmax&) override {}
  void impl_quantize_produced(const Tensor&, const Tensor&, const QuantizedTensor&, const QuantizedTensor&,
                              const Tensor&, const CastProducer&) override {}
  void impl_dequantize(const QuantizedTensor&, const Tensor&) override {}
  void impl_fp8_scale_update(const Tensor&, const Tensor&, const Tensor&, const ScaleUpdateArgs&) override {}
  void impl_column_sum(const Tensor& x, const Tensor& out, bool accumulate) override;
  void impl_qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                              const Tensor& qkv_bias_grad, bool accumulate) override;
  void impl_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  const Tensor& compute_copy, const Tensor&, const AdamWArgs& args) override;

 private:
  // cuda: the DGELU epilogue writes dx directly (no scratch) where it applies (cuda gemm.hpp).
  void gemm_backward_input_gelu(const GemmArgs& args);
  void gemm_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, const Tensor& dbias,
                            bool accumulate);
  void gemm_quantized(const QuantizedTensor& a);
  void grow_attention_workspace(const AttentionShape& shape, DType io, bool backward);

  size_t memory_bytes_;
  std::string label_;
  CudaAllocationModel cuda_;
  private_buffers::DeviceFacts facts_used_;
  std::vector<Buffer> workspaces_;  // private_buffers::backend_workspaces()
  Buffer attention_workspace_;
  size_t attention_workspace_bytes_ = 0;
  std::map<std::tuple<int64_t, int64_t, RopeSpec>, Buffer> rope_tables_;
  std::vector<DType> native_quantized_gemms_;
};

}  // namespace mxtrain
