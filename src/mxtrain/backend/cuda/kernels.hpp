// Host-side launchers of the hand-written kernels (one .cu file per op family). Each launcher
// checks what its kernels need, picks the vector width, launches on `stream` and checks the
// launch; none of them synchronizes. Launchers that need scratch memory take it from the
// backend's caching allocator, so no step ever calls cudaMalloc.
#pragma once
#include <cuda_runtime_api.h>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/backend/cuda/quack_gemm.hpp"
#include "mxtrain/backend/private_buffers.hpp"

namespace mxtrain::cuda_kernels {

// ---- elementwise.cu -----------------------------------------------------------------------
void fill(const Tensor& out, float value, cudaStream_t stream);
void convert(const Tensor& source, const Tensor& out, cudaStream_t stream);  // f32/bf16/f16, RNE
void scale(const Tensor& x, float factor, cudaStream_t stream);
void add(const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t stream);
void gelu_forward(const Tensor& x, const Tensor& out, const Tensor& out_amax, cudaStream_t stream);
void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const Tensor& out_amax,
                   cudaStream_t stream);
void swiglu_forward(const Tensor& gate_up, const Tensor& out, const Tensor& out_amax, cudaStream_t stream);
void swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up, const Tensor& out_amax,
                     cudaStream_t stream);

// ---- norm.cu --------------------------------------------------------------------------------
// a_plus_b: when defined, x is written as sum = a + b first (the fused residual add).
// out_amax / dx_amax / the elementwise ops' out_amax (when defined): f32 [1] set to the amax of
// the output, recorded by the kernel that writes it (device_common.cuh, amax records).
void norm_forward(NormKind kind, const Tensor& a, const Tensor& b, const Tensor& x, const Tensor& weight,
                  const Tensor& bias, const Tensor& out, const Tensor& mean, const Tensor& rstd, float eps,
                  const Tensor& out_amax, cudaStream_t stream);
void norm_backward(Backend& backend, NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                   const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                   const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams, const Tensor& dx_amax,
                   const DxColumnSums& dx_sums, cudaStream_t stream);

// ---- reduce.cu ------------------------------------------------------------------------------
// out[0] (+)= sum of x or of x^2; partials: f32 scratch of at least kSumMaxBlocks elements (the
// backend's "reduction.partials", private_buffers.hpp).
constexpr int kSumMaxBlocks = private_buffers::kReductionBlocks;
void sum(const Tensor& x, const Tensor& out, bool accumulate, bool squares, float* partials, cudaStream_t stream);
// out[0] (+)= the sum of partials[0, count) in a fixed order (one block; thread t adds elements
// t, t + kSumMaxBlocks, ...): the second stage of a reduction whose first stage ran inside
// another kernel.
void sum_partials_final(const float* partials, int64_t count, float* out, bool accumulate, cudaStream_t stream);
// out[c] (+)= sum over rows of x[r, c] (x [rows, cols], contiguous or a column range of whole
// rows: column_sum_row_stride), two-stage and deterministic.
void column_sum(Backend& backend, const Tensor& x, const Tensor& out, bool accumulate, cudaStream_t stream);
// Backend::qkv_bias_gradient: column_partials of dq, then one kernel for the queries' sums, the
// keys' zeros and the values' out_bias_grad · out_weight (f32 sums in a fixed order).
void qkv_bias_gradient(Backend& backend, const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                       const Tensor& qkv_bias_grad, bool accumulate, cudaStream_t stream);
// The first stage alone: partials [chunks, cols] f32 = x's column sums over row chunks of
// private_buffers::column_reduction_chunks(rows); returns chunks (0 for an empty x).
int64_t column_partials(const Tensor& x, float* partials, cudaStream_t stream);
// out[i] (+)= values[i] (values f32 [n]).
void accumulate_f32(const float* values, const Tensor& out, bool accumulate, cudaStream_t stream);
// The two-stage column reductions (bias column sums, the wide-row norm backward) sum row chunks
// of private_buffers::column_reduction_chunks(rows): the row count only, so every run sums in
// the same order.
// out[c] (+)= sum over p of partials[p * cols + c], p in order (cols = out.numel()).
void reduce_column_partials(const float* partials, int64_t chunks, const Tensor& out, bool accumulate,
                            cudaStream_t stream);

// ---- rope.cu --------------------------------------------------------------------------------
// table: f32 [table_positions, head_dim/2] cos followed by f32 [table_positions, head_dim/2] sin;
// row r takes position shape.position_offset + r % shape.seq, which must lie in the table.
// out_amax (optional): the amax of all of qkv afterwards, v heads included (they are only read).
void rope(const Tensor& qkv, const AttentionShape& shape, const float* table, int64_t table_positions, bool inverse,
          const Tensor& out_amax, cudaStream_t stream);

// ---- attention_cached.cu ----------------------------------------------------------------------
// Backend::attention_cached: stores the new rows' keys and values in the caches, then attends.
void attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                      const AttentionShape& shape, cudaStream_t stream);

// ---- embedding.cu ---------------------------------------------------------------------------
void embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                       const Tensor& out, int64_t seq_len, cudaStream_t stream);
// Records cub's sort storage size in `facts` (when given) under private_buffers::embedding_sort_fact.
void embedding_backward(Backend& backend, const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                        const Tensor& dposition_table, int64_t seq_len, cudaStream_t stream,
                        private_buffers::DeviceFacts* facts = nullptr);

// ---- cross_entropy.cu -----------------------------------------------------------------------
void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses, int64_t valid_vocab,
                   float grad_scale, cudaStream_t stream);

// ---- linear_cross_entropy.cu: the glue of quack's linear cross-entropy (quack_gemm.hpp) -------
// mask f32 [vocab]: 0 below valid_vocab, -inf from it on.
void lce_column_mask(void* mask, int64_t vocab, int64_t valid_vocab, cudaStream_t stream);
// Between the forward (E, the tiles' sums and offsets, the target logits) and the gradient GEMMs:
// per row the log-sum-exp L from the partials, losses = L - target logit (NaN for a target outside
// [0, valid_vocab)), E at the target fixed to (p_target - 1) / 2^offset, row_max = the largest
// offset, row_scale v = grad_scale · 2^row_max · e^-L, xs = x · bf16(v); then the strip
// [vocab / 64, rows] = 2^(offset - row_max) in BF16 (exact powers of two), tile / 64 rows a tile.
struct LceGlue {
  quack_gemm::LinearCrossEntropy lce;  // the chunk as the GEMMs take it; the glue writes its strip, row_scale, xs
  int64_t valid_vocab = 0;
  float* losses = nullptr;
  float* row_max = nullptr;
  float grad_scale = 0;
};
void lce_glue(const LceGlue& g, cudaStream_t stream);

// ---- quantize.cu ----------------------------------------------------------------------------
// The precision recipes' kernels (backend.hpp states the contracts); bit-identical to numerics/.
void amax(const Tensor& x, const Tensor& out, bool accumulate, bool hadamard_transposed, cudaStream_t stream);
void quantize(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise, const QuantizedTensor& columnwise,
              const Tensor& amax, const ScaleFromAmax& from, cudaStream_t stream);
// quantize's per-tensor FP8 cast with the producing op fused in (CastProducer). rope_backward
// reads the rotation table the rope op uses (rope_positions positions: cosines, then sines).
void quantize_produced(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                       const QuantizedTensor& columnwise, const Tensor& amax, const CastProducer& producer,
                       const float* rope_table, int64_t rope_positions, cudaStream_t stream);
void dequantize(const QuantizedTensor& q, const Tensor& out, cudaStream_t stream);
void fp8_scale_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inverse,
                      const ScaleUpdateArgs& args, cudaStream_t stream);
// scalars[0] = the NVFP4 GEMM's alpha (product of the operands' global decode scales), scalars[1]
// = beta: cuBLASLt reads both from the device (CUBLASLT_POINTER_MODE_DEVICE).
void nvfp4_gemm_scalars(const Tensor& amax_a, const Tensor& amax_b, float beta, float* scalars, cudaStream_t stream);

// ---- adamw.cu -------------------------------------------------------------------------------
// With args.grad_norm_output it allocates scratch (from backend) for one partial sum a block.
void adamw(Backend& backend, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
           const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args, cudaStream_t stream);

}  // namespace mxtrain::cuda_kernels
