// The cuda backend: hand-written fused kernels for the memory-bound ops (kernels.hpp), cuBLASLt
// for the GEMMs (gemm.hpp) and cuDNN flash attention (attention.hpp), all on one stream that
// the backend owns. Every byte — activations, scratch and the library workspaces — comes from
// the shared CachingAllocator over cudaMalloc'd segments, so a steady-state step never calls
// cudaMalloc and the memory stats match the dryrun's. Ops never synchronize with the host;
// copy_to_host and read_scalar are the only waits.
//
// Workspaces and kernel scratch: every buffer an op allocates for itself is the list a function
// of backend/private_buffers.hpp returns for the op's arguments (the dryrun records the same
// lists), with cuDNN's and cub's sizes passed in as the device reports them.
//
// Quantized GEMMs: per-tensor FP8 through cuBLASLt on sm_89+ (Hopper is TN-only, so the recipe
// hands over transposed copies); MXFP8 and NVFP4 block-scaled GEMMs on sm_100+ when this
// cuBLAS has the block-scaling modes (CUDA >= 12.8). supports() answers exactly that.
#pragma once
#include <cuda_runtime_api.h>

#include <array>
#include <map>
#include <memory>
#include <tuple>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/backend/private_buffers.hpp"

namespace mxtrain {

class CublasLtGemm;
class CudnnAttention;

// The registry's entry points (registry.cpp declares them too).
std::unique_ptr<Backend> create_cuda_backend(const BackendOptions& options);
bool cuda_device_present();

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const BackendOptions& options);
  ~CudaBackend() override;

  std::string_view name() const override { return "cuda"; }
  Device device() const override { return Device::cuda; }
  DeviceProperties properties() const override { return properties_; }
  bool supports(OpKind kind, DType dtype) const override;
  bool gemm_fuses_swiglu(DType dtype, int64_t k, int64_t ffn) const override;
  bool gemm_fuses_dgelu_bias_gradient(DType dtype, int64_t k, int64_t n) const override;
  bool fuses_head_loss(const HeadLossChunk& c) const override;
  bool records_output_amax() const override { return true; }
  bool casts_weights_in_adamw() const override { return true; }
  void synchronize() override;
  // CUDA events on the backend's stream; up to kTimestampSlots marks may be outstanding.
  uint64_t record_timestamp() override;
  double elapsed_ms(uint64_t start, uint64_t end) override;
  // Step graphs: stream capture (relaxed mode: the caching allocator may still cudaMalloc)
  // into a CUDA graph, instantiated once. A host copy in the capture goes through a pinned
  // staging buffer of its own, refreshed from the caller's bytes before each replay. The graph
  // goes stale when anything is allocated after the capture: its scratch lives in blocks the
  // allocator counts as free, which only the graph may use until then.
  bool begin_capture() override;
  bool end_capture() override;
  bool replay() override;
  void drop_capture() override;

  cudaStream_t stream() const { return stream_; }
  int device_index() const { return device_index_; }
  // cuDNN's deterministic SDPA backward (bit-reproducible dQ/dK/dV); default from BackendOptions.
  void set_deterministic_attention(bool deterministic);
  bool deterministic_attention() const;
  // FlashAttention-4's attention backward (attention.hpp); default from BackendOptions.
  void set_flash_attention_4_backward(bool enabled);
  bool flash_attention_4_backward() const;
  void check_attention_backward(const AttentionShape& shape, DType activations) const override;
  // GEMM shapes the autotune gave to quack's kernels (backend/cuda/quack_gemm.hpp) so far.
  int quack_gemm_shapes() const;
  // TF32 tensor cores for f32 GEMMs (the fp32 precision mode); default off.
  void set_tf32(bool enabled);
  bool tf32() const;
  // Bias gradients of linear layers: fused into the weight GEMM (cuBLASLt BGRADB) or a separate
  // deterministic column-sum kernel over dout (the default: on an H200, GPT-2 124M's qkv weight
  // gradient at 64x1024 tokens took 0.420 ms with the column sums, 0.460 ms with BGRADB).
  void set_fused_bias_gradient(bool fused);
  bool fused_bias_gradient() const { return fused_bias_gradient_; }
  // Bytes of the cuDNN workspace grown so far (for logs and the planner's calibration).
  size_t attention_workspace_bytes() const;
  // The device facts the private buffers were sized with so far (each SDPA graph's workspace,
  // cub's sort storage), keyed as private_buffers.hpp keys them: what the dryrun models.
  const private_buffers::DeviceFacts& device_facts() const { return device_facts_; }

  static constexpr int kTimestampSlots = 1024;

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
  void impl_add_norm_forward(NormKind kind, const Tensor& a, const Tensor& b, const Tensor& sum, const Tensor& weight,
                             const Tensor& bias, const Tensor& out, const Tensor& mean, const Tensor& rstd,
                             float eps, const Tensor& out_amax) override;
  void impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                          const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                          const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams,
                          const Tensor& dx_amax, const DxColumnSums& dx_sums) override;
  // The GEMMs through cuBLASLt (gemm.hpp), epilogues fused where it has them.
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
  void impl_head_loss_fused(const HeadLossChunk& c) override;
  void impl_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses, int64_t valid_vocab,
                          float grad_scale) override;
  void impl_sum(const Tensor& x, const Tensor& out, bool accumulate, bool squares) override;
  void impl_scale(const Tensor& x, float factor) override;
  void impl_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                  const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args) override;
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

 private:
  // impl_gemm by operands, role and epilogue.
  void gemm_forward_residual(const GemmArgs& args);
  void log_unfused_residual();
  void gemm_forward_gelu(const GemmArgs& args);
  void gemm_forward_swiglu(const GemmArgs& args);
  void gemm_backward_input_gelu(const GemmArgs& args);
  void gemm_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, const Tensor& dbias,
                            bool accumulate);
  void gemm_quantized(GemmRole role, const QuantizedTensor& a, const QuantizedTensor& b, const Tensor& bias,
                      const Tensor& out, bool accumulate);
  // f32 [2, seq, head_dim/2]: cos then sin, built with the CPU oracle's formula.
  const float* rope_table(int64_t seq, int64_t head_dim, const RopeSpec& rope);

  int device_index_;
  cudaStream_t stream_ = nullptr;
  DeviceProperties properties_;
  private_buffers::DeviceFacts device_facts_;
  Buffer gemm_workspace_;
  Buffer reduction_partials_;
  std::unique_ptr<CublasLtGemm> gemm_;
  std::unique_ptr<CudnnAttention> attention_;
  std::map<std::tuple<int64_t, int64_t, RopeSpec>, Buffer> rope_tables_;
  std::array<cudaEvent_t, kTimestampSlots> events_{};
  uint64_t next_timestamp_ = 0;
  bool head_loss_quack_ = false;  // train.head_loss = quack-lce, on an sm_90 GPU with the kernels carried
  mutable bool logged_unfused_head_loss_ = false;
  bool fused_bias_gradient_ = false;
  bool logged_bias_gradient_path_ = false;
  bool logged_unfused_residual_ = false;  // cuBLASLt had no beta = 1 algorithm: GEMM + add ran
  bool logged_unfused_gelu_ = false;      // a GELU epilogue was unavailable: GEMM + GELU kernel ran
  bool logged_unfused_swiglu_ = false;    // quack's gated GEMM could not take a call: GEMM + SwiGLU kernel ran
  void log_unfused_gelu(const char* op, const Tensor& out);

  struct HostInput {
    const void* host;  // the caller's bytes, re-read at each replay
    void* staging;     // pinned; the graph's copy node reads it
    size_t bytes;
    cudaEvent_t read;  // recorded by a node of the graph right after that copy
  };
  bool capturing_ = false;
  cudaGraphExec_t graph_ = nullptr;
  std::vector<HostInput> host_inputs_;
  size_t allocations_at_capture_ = 0;
  bool logged_capture_ = false;
};

}  // namespace mxtrain
