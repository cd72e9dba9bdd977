// The dryrun backend computes nothing. It hands out fake addresses through the same caching
// allocator as the real backends and reports every op to its observer, so running the real
// step code on it yields the exact allocation trace, peak bytes and op list of a real step.
//
// A GPU backend also allocates inside its ops, through the same allocator: library workspaces
// and kernel scratch. When planning for a GPU the dryrun replays those allocations too
// (CudaAllocationModel, mirroring backend/cuda), so its peak and reserved bytes are what the
// cuda backend's allocator reports; without a model it allocates exactly what the cpu backend
// does (nothing inside ops).
#pragma once
#include <map>
#include <tuple>
#include <vector>

#include "mxtrain/backend/backend.hpp"

namespace mxtrain {

// The allocations backend/cuda makes through Backend::allocate besides the model's own buffers
// (see cuda_backend.hpp's workspace list). Sizes that come from a library's plan are data
// (plan/calibration), the rest follow the cuda code exactly.
struct CudaAllocationModel {
  bool enabled = false;
  // At creation: "cublaslt.workspace" (gemm.hpp kWorkspaceBytes) and "reduction.partials" f32.
  size_t gemm_workspace_bytes = size_t{32} << 20;
  int64_t reduction_partials = 1024;  // kernels.hpp kSumMaxBlocks
  // "cudnn.workspace", grown to the largest any SDPA graph asks for (attention.cpp). Backward:
  // cudnn-frontend's SDPA backward node keeps dQ accumulated in f32 [b, h, s, d] and the
  // softmax sum f32 [b, h, s] in its workspace, plus what the engine itself asks for. With
  // grouped-query heads (kv_heads < heads) it also asks for 4 bytes per b·h·s·d (dK and dV
  // for every query head before they are summed per KV head); measured on the H200.
  int64_t attention_forward_workspace_bytes = 0;
  double attention_backward_dq_accum_f32 = 1;     // f32 elements per b·h·s·d
  double attention_backward_row_f32 = 1;          // f32 elements per b·h·s
  double attention_backward_gqa_bytes = 4;        // bytes per b·h·s·d when kv_heads < heads
  int64_t attention_backward_engine_bytes = 0;
  bool deterministic_attention = false;  // dP workspace b·h·s64·s128·2 bytes instead of dQ accum
  // embedding_backward: keys, rows i32 [2, n] and cub's radix-sort temp storage (about this many
  // bytes per token plus a fixed part; the exact figure is cub's and depends on its version).
  double embedding_sort_bytes_per_token = 9;
  int64_t embedding_sort_fixed_bytes = 65536;
  // linear_backward_weight with a bias: the cuda backend's default sums the bias gradient with
  // the column-sum kernel (f32 partials); fused = the BGRADB epilogue into f32 [cols] sums.
  bool bias_gradient_fused = false;
};

class DryrunBackend final : public Backend {
 public:
  // memory_bytes: the simulated device's capacity (0 = unlimited); label: e.g. "h200".
  DryrunBackend(size_t memory_bytes, std::string label, CudaAllocationModel cuda_model = {});

  std::string_view name() const override { return "dryrun"; }
  Device device() const override { return Device::none; }
  DeviceProperties properties() const override;
  bool supports(OpKind kind, DType dtype) const override;
  void synchronize() override {}
  const CudaAllocationModel& cuda_model() const { return cuda_; }
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
                          const Tensor& dx_amax) override;
  // The GEMMs compute nothing; what backend/cuda allocates inside them is replayed.
  void impl_gemm(const GemmArgs& args) override;
  void impl_rope(const Tensor& qkv, const AttentionShape& shape, float theta, bool inverse,
                 const Tensor& out_amax) override;
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
  void impl_sum(const Tensor&, const Tensor&, bool, bool) override {}
  void impl_scale(const Tensor&, float) override {}
  void impl_amax(const Tensor&, const Tensor&, bool, bool) override {}
  void impl_quantize(const Tensor&, const Tensor&, const QuantizedTensor&, const QuantizedTensor&, const Tensor&,
                     const ScaleFromAmax&) override {}
  void impl_dequantize(const QuantizedTensor&, const Tensor&) override {}
  void impl_fp8_scale_update(const Tensor&, const Tensor&, const Tensor&, const ScaleUpdateArgs&) override {}
  void impl_column_sum(const Tensor& x, const Tensor& out, bool accumulate) override;
  void impl_adamw(const Tensor& param, const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                  const AdamWArgs& args) override;

 private:
  // cuda: the DGELU epilogue writes dx directly (no scratch) where it applies (cuda gemm.hpp).
  void gemm_backward_input_gelu(const GemmArgs& args);
  void gemm_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, const Tensor& dbias,
                            bool accumulate);
  void gemm_quantized(const QuantizedTensor& a);
  void grow_attention_workspace(size_t bytes);

  size_t memory_bytes_;
  std::string label_;
  CudaAllocationModel cuda_;
  Buffer gemm_workspace_, reduction_partials_, attention_workspace_;
  size_t attention_workspace_bytes_ = 0;
  std::map<std::tuple<int64_t, int64_t, float>, Buffer> rope_tables_;
  std::vector<DType> native_quantized_gemms_;
};

}  // namespace mxtrain
