// The CPU backend: FP32, multithreaded with OpenMP, matrix products through OpenBLAS. It is
// the oracle every other backend is checked against, so every op is written for clarity and
// determinism first: reductions over rows use fixed-size chunks summed in a fixed order, so
// results do not depend on the thread count, and rerunning an op gives the same bits.
#pragma once
#include "mxtrain/backend/backend.hpp"

namespace mxtrain {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads = 0);  // 0 = all cores (OMP_NUM_THREADS honoured)

  std::string_view name() const override { return "cpu"; }
  Device device() const override { return Device::cpu; }
  DeviceProperties properties() const override;
  bool supports(OpKind kind, DType dtype) const override;
  void synchronize() override {}
  int threads() const { return threads_; }

 protected:
  void impl_fill(const Tensor& out, float value) override;
  void impl_copy(const Tensor& source, const Tensor& out) override;
  void impl_copy_from_host(const void* host, const Tensor& out) override;
  void impl_copy_to_host(const Tensor& source, void* host) override;
  void impl_embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                              const Tensor& out, int64_t seq_len) override;
  void impl_embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                               const Tensor& dposition_table, int64_t seq_len) override;
  void impl_norm_forward(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                         const Tensor& mean, const Tensor& rstd, float eps, const Tensor& out_amax) override;
  void impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                          const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams,
                          const Tensor& dx_amax, const DxColumnSums& dx_sums) override;
  // linear_cpu.cpp: the high-precision GEMMs; quantized operands go to gemm_quantized.
  void impl_gemm(const GemmArgs& args) override;
  void impl_rope(const Tensor& qkv, const AttentionShape& shape, const RopeSpec& rope, bool inverse,
                 const Tensor& out_amax) override;
  void impl_attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                             const AttentionShape& shape) override;
  void impl_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              const AttentionShape& shape) override;
  void impl_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                               const Tensor& dqkv, const AttentionShape& shape) override;
  void impl_swiglu_forward(const Tensor& gate_up, const Tensor& out, const Tensor& out_amax) override;
  void impl_swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up,
                            const Tensor& out_amax) override;
  void impl_gelu_forward(const Tensor& x, const Tensor& out, const Tensor& out_amax) override;
  void impl_gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const Tensor& out_amax) override;
  void impl_add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void impl_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses, int64_t valid_vocab,
                          float grad_scale) override;
  void impl_sum(const Tensor& x, const Tensor& out, bool accumulate, bool squares) override;
  void impl_scale(const Tensor& x, float factor) override;
  // quantize_cpu.cpp: through numerics/, the reference quantizers.
  void impl_amax(const Tensor& x, const Tensor& out, bool accumulate, bool hadamard_transposed) override;
  void impl_quantize(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                     const QuantizedTensor& columnwise, const Tensor& amax,
                     const ScaleFromAmax& from) override;
  void impl_quantize_produced(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                              const QuantizedTensor& columnwise, const Tensor& amax,
                              const CastProducer& producer) override;
  void impl_dequantize(const QuantizedTensor& q, const Tensor& out) override;
  void impl_fp8_scale_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inverse,
                             const ScaleUpdateArgs& args) override;
  void impl_column_sum(const Tensor& x, const Tensor& out, bool accumulate) override;
  void impl_qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                              const Tensor& qkv_bias_grad, bool accumulate) override;
  void impl_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args) override;

 private:
  // The GEMM of each role (linear_cpu.cpp) and of quantized operands (quantize_cpu.cpp: an FP32
  // product of the dequantized copies).
  void gemm_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
  void gemm_backward_input(const Tensor& dout, const Tensor& weight, const Tensor& dx, bool accumulate);
  void gemm_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, const Tensor& dbias,
                            bool accumulate);
  void gemm_quantized(const QuantizedTensor& a, const QuantizedTensor& b, const Tensor& bias, const Tensor& out,
                      bool accumulate);

  int threads_;
};

}  // namespace mxtrain
