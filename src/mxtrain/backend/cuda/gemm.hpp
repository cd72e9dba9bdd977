// cuBLASLt GEMMs for the three linear ops. The row-major -> column-major mapping lives in one
// place (the three row-major entry points below); everything under them speaks cuBLAS's
// column-major D[m,n] = op(A)[m,k] · op(B)[k,n] + beta·C, with C == D except for the
// residual GEMM (C = the residual stream, beta = 1).
//
// A matmul descriptor, the four layouts and the heuristic's algorithm are built once per key
// (shape, transposes, dtypes, compute type, epilogue, beta != 0 and the pointers' alignment)
// and reused; each call only sets the epilogue's bias pointer and runs. With autotuning on
// (train.gemm_autotune), the first call of each key times up to kCandidates of the heuristic's
// algorithms on the call's own operands and keeps the fastest for the rest of the run (like
// cudnn.benchmark: the choice, hence the last bits of the results, can differ between runs). With
// set_quack (train.gemm_kernels = cublaslt+quack) in a build that carries quack's GEMMs
// (backend/cuda/quack_gemm.hpp), a plain BF16 GEMM's trials include quack's tile configurations,
// and the fastest of either library runs. The workspace is one
// fixed buffer from the backend's allocator ("cublaslt.workspace", Lifetime::workspace; its size
// is private_buffers::kGemmWorkspaceBytes), allocated when the backend is created, so its bytes
// are the same in every run.
#pragma once
#include <cublasLt.h>

#include <array>
#include <functional>
#include <map>
#include <memory>

#include "mxtrain/backend/backend.hpp"

namespace mxtrain {

namespace quack_gemm {
struct Product;
}

class CublasLtGemm {
 public:
  CublasLtGemm(void* workspace, size_t workspace_bytes);
  ~CublasLtGemm();
  CublasLtGemm(const CublasLtGemm&) = delete;
  CublasLtGemm& operator=(const CublasLtGemm&) = delete;

  static constexpr int kCandidates = 8;
  void set_tf32(bool enabled) { tf32_ = enabled; }
  void set_autotune(bool enabled) { autotune_ = enabled; }
  // With autotuning, quack's configurations among the candidates (in a build that carries them).
  void set_quack(bool enabled) { quack_ = enabled; }
  // quack's gated GEMM for the SwiGLU forward (linear_forward_swiglu), in a build that carries it.
  void set_quack_swiglu(bool enabled) { quack_swiglu_ = enabled; }
  bool quack_swiglu() const { return quack_swiglu_; }
  // quack's GELU GEMMs for linear_forward_gelu (with a BF16 bias) and linear_backward_input_gelu,
  // in a build that carries them; cuBLASLt's epilogues where a call does not qualify or (with
  // autotuning) where they time faster at the call's shape.
  void set_quack_gelu(bool enabled) { quack_gelu_ = enabled; }
  bool quack_gelu_gemms() const { return quack_gelu_; }
  bool autotune() const { return autotune_; }
  bool tf32() const { return tf32_; }
  // How many GEMM shapes the autotune gave to quack's kernels so far.
  int quack_choices() const;

  // out[N,M] = x[N,K] · weight[M,K]ᵀ (+ bias[M]), bias fused as the BIAS epilogue.
  void linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                      cudaStream_t stream);
  // out[N,M] = x · weightᵀ (+ bias) + residual[N,M] (C = residual, beta = 1), one rounding.
  // Returns false when cuBLASLt has no algorithm (nothing ran; the caller runs GEMM + add).
  bool linear_forward_residual(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& residual,
                               const Tensor& out, cudaStream_t stream);
  // dx[N,K] (+)= dout[N,M] · weight[M,K].
  void linear_backward_input(const Tensor& dout, const Tensor& weight, const Tensor& dx, bool accumulate,
                             cudaStream_t stream);
  // The GELU epilogues (16-bit pre/out/dx whose rows are multiples of 8 elements, on 16-byte
  // aligned addresses; false when a call does not qualify or cuBLASLt has no algorithm for it,
  // and then nothing ran): pre = x · weightᵀ (+ bias) with out = gelu(pre) (GELU_AUX[_BIAS]:
  // GELU of the f32 sum), and dx = (dout · weight) ⊙ gelu'(pre) (DGELU: the f32 product times
  // GELU's derivative at the 16-bit pre, one rounding). cuBLASLt's GELU is the tanh form; so is
  // quack's, which runs them instead with set_quack_gelu where a call qualifies (BF16, contiguous).
  bool linear_forward_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& pre,
                           const Tensor& out, cudaStream_t stream);
  // The DGELU GEMM may also leave the column sums of dx (the bias gradient of the linear that made
  // pre) as partial sums: quack's DGELU GEMM writes them itself, one row a tile of rows; after
  // cuBLASLt's, column_partials() runs (it writes dx's partial sums in chunks of rows and returns
  // how many). Either way `rows` says how many rows of `partials` [rows, dx.cols()] f32 the call
  // filled, for the caller to sum in order.
  struct BiasPartials {
    float* partials = nullptr;
    std::function<int64_t()> column_partials;
    int64_t rows = 0;
  };
  bool linear_backward_input_gelu(const Tensor& dout, const Tensor& weight, const Tensor& pre, const Tensor& dx,
                                  cudaStream_t stream, BiasPartials* bias = nullptr);
  // With set_quack_swiglu: pre [N, 2F] = x · weightᵀ (gate/up rows interleaved) and out [N, F] =
  // silu(gate) · up of the f32 product, in quack's gated GEMM (BF16, contiguous; the
  // configuration timed once a shape with autotuning). False when the call does not qualify
  // (quack_gemm::gated_candidates), and then nothing ran.
  bool linear_forward_swiglu(const Tensor& x, const Tensor& weight, const Tensor& pre, const Tensor& out,
                             cudaStream_t stream);
  // dweight[M,K] (+)= dout[N,M]ᵀ · x[N,K]. With bias_sum (f32 [M]) the BGRADB epilogue writes the
  // column sums of dout there in the same pass; returns false when cuBLASLt has no algorithm
  // for that epilogue (then nothing ran, and the caller must run the plain GEMM and a
  // column-sum kernel instead).
  bool linear_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, float* bias_sum,
                              bool accumulate, cudaStream_t stream);
  // out[N,M] (+)= deq(a)[N,K] · deq(b)[M,K]ᵀ (+ bias[M]) from two quantized copies (TN, the only
  // FP8 layout Hopper has). Per-tensor FP8: the copies' FP32 decode scales as the A/B scale
  // pointers, fast accumulation for the forward role only (TE's defaults). MXFP8/NVFP4 (sm_100+):
  // swizzled block scales with the VEC32_UE8M0 / VEC16_UE4M3 scale modes; NVFP4 reads alpha and
  // beta from device_scalars (alpha = the operands' global decode scales).
  void linear_quantized(GemmRole role, const QuantizedTensor& a, const QuantizedTensor& b, const Tensor& bias,
                        const Tensor& out, bool accumulate, const float* device_scalars, cudaStream_t stream);
  // The forward of linear_quantized with the residual added in the epilogue (C = residual,
  // beta = 1; host scalars: per-tensor FP8 and MXFP8): out = product + bias + residual, one
  // rounding. False (nothing run) where cuBLASLt has no algorithm for it.
  bool linear_quantized_residual(const QuantizedTensor& a, const QuantizedTensor& b, const Tensor& bias,
                                 const Tensor& residual, const Tensor& out, cudaStream_t stream);

 private:
  enum class Epilogue : int { none = 0, bias = 1, bias_gradient_b = 2, gelu_aux = 3, gelu_aux_bias = 4, dgelu = 5 };
  struct Call {
    bool transpose_a = false, transpose_b = false;
    int64_t m = 0, n = 0, k = 0;
    const void* a = nullptr;
    DType a_type = DType::f32;
    int64_t lda = 0;
    const void* b = nullptr;
    DType b_type = DType::f32;
    int64_t ldb = 0;
    void* d = nullptr;
    DType d_type = DType::f32;
    int64_t ldd = 0;
    const void* c = nullptr;  // C when it is not D (same type and layout as D); beta must be 1
    float beta = 0;
    Epilogue epilogue = Epilogue::none;
    void* bias = nullptr;  // input for bias, output for bias_gradient_b
    DType bias_type = DType::f32;
    void* aux = nullptr;   // the GELU epilogues' pre-activation (D's type and layout): out for gelu_aux*, in for dgelu
    ScalingMode scaling = ScalingMode::per_tensor;
    bool scaled = false;                   // A and B carry decode scales (quantized operands)
    const void* a_scale = nullptr;         // cuBLAS's A and B (the row-major mapping swaps them)
    const void* b_scale = nullptr;
    bool fast_accumulation = false;        // CUBLASLT_MATMUL_DESC_FAST_ACCUM (per-tensor FP8)
    const float* device_scalars = nullptr; // alpha, beta on the device
  };
  struct Plan;
  using Key = std::array<int64_t, 23>;

  // The call as quack's GEMMs take it (backend/cuda/quack_gemm.hpp), when they can: BF16 in and
  // out, no epilogue, nothing added, no decode scales.
  static bool quack_product(const Call& call, quack_gemm::Product* p);
  // Runs the call; returns false only when `optional` and no algorithm exists for it.
  bool run(const Call& call, cudaStream_t stream, bool optional);
  // Column-major D[m, n] = op(A)[m, k] · op(B)[k, n]: the shape, and A, B and D (the tensors'
  // data and types) with their leading dimensions; the rest of the call at its defaults.
  static Call product(int64_t m, int64_t n, int64_t k, const Tensor& a, int64_t lda, const Tensor& b, int64_t ldb,
                      const Tensor& d, int64_t ldd);
  // The row-major mappings: out = x · weightᵀ and dx = dout · weight.
  static Call forward_call(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out);
  static Call quantized_call(GemmRole role, const QuantizedTensor& a, const QuantizedTensor& b, const Tensor& bias,
                             const Tensor& out, bool accumulate, const float* device_scalars);
  static Call backward_input_call(const Tensor& dout, const Tensor& weight, const Tensor& dx, bool accumulate);
  Plan* plan_for(const Call& call, bool optional);
  // quack's GELU GEMM (forward with the bias, or backward) when the call qualifies and, with
  // autotuning, runs faster than cublaslt() (cuBLASLt's GELU epilogue on the same call, false when
  // it has no algorithm); false when quack's does not run, and then nothing ran.
  // With bias_partials (backward only) quack's DGELU GEMM also writes them and *partial_rows.
  bool quack_gelu(const Tensor& a, const Tensor& weight, const Tensor& bias, const Tensor& pre, const Tensor& out,
                  bool backward, const std::function<bool()>& cublaslt, cudaStream_t stream,
                  float* bias_partials = nullptr, int64_t* partial_rows = nullptr);
  // One of quack's epilogue GEMMs (key: the kind — 0 gated, 1 GELU, 2 DGELU, 3 DGELU with the bias
  // partials — and rows, k, n):
  // launch(c) runs candidate c. The choice is made once a key: with autotuning the fastest of the
  // candidates and, where given, cublaslt (cuBLASLt's own epilogue); else the first candidate.
  // False when there is no candidate or cuBLASLt's was chosen (nothing ran).
  bool run_quack_epilogue(const std::array<int64_t, 4>& key, const std::vector<int>& candidates, const char* what,
                          const std::function<void(int)>& launch, const std::function<bool()>& cublaslt,
                          cudaStream_t stream);
  static void configure_scaling(cublasLtMatmulDesc_t desc, const Call& call);
  // Times the plan's candidate algorithms on this call and keeps the fastest (autotuning).
  void tune(Plan* plan, const Call& call, cudaStream_t stream);
  cublasStatus_t launch(Plan* plan, const cublasLtMatmulAlgo_t& algo, const Call& call, const void* c, void* d,
                        cudaStream_t stream);

  cublasLtHandle_t handle_ = nullptr;
  void* workspace_;
  size_t workspace_bytes_;
  bool tf32_ = false;
  bool autotune_ = false;
  bool quack_ = false;
  bool quack_swiglu_ = false;
  bool quack_gelu_ = false;
  std::map<Key, std::unique_ptr<Plan>> plans_;
  std::map<std::array<int64_t, 4>, int> epilogue_choice_;  // (kind, rows, k, n) -> quack_gemm candidate
};

}  // namespace mxtrain
