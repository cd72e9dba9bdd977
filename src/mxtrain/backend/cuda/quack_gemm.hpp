// quack's Hopper BF16 GEMMs (PyPI quack-kernels: CuTe DSL kernels from the FlashAttention-4
// authors), compiled ahead of time by scripts/quack_gemm_export.py into the same folder as
// FlashAttention-4's kernels (scripts/fa4_kernels.sh) and linked when mxtrain is configured with
// -DMXTRAIN_FLASH_ATTENTION_4=<folder>. With train.gemm_kernels = cublaslt+quack they are
// candidates of the GEMM autotune beside cuBLASLt's algorithms (backend/cuda/gemm.cpp): where a
// plain BF16 GEMM of the three linear ops runs faster in one of quack's tile configurations in
// the autotune's trials, that shape keeps it. Measured on an H200, the picks did not hold in the
// step (llama-1b 1% slower), hence not the default (docs/gemm-kernels.md). And the llama MLP's
// gate/up forward with SwiGLU fused into the GEMM's epilogue (quack's gated GEMM:
// Backend::gemm_fuses_swiglu, train.gemm_kernels = cublaslt+quack-swiglu or cublaslt+quack), and
// GPT-2's up forward and down input gradient with GELU and its derivative in the epilogue
// (train.gemm_kernels = cublaslt+quack-gelu or cublaslt+quack).
// And the LM head's linear cross-entropy in quack's scaled-exp form (train.head_loss = quack-lce,
// Backend::head_loss; docs/gemm-kernels.md): the three GEMMs below, with CUDA glue of mxtrain's
// own between them (backend/cuda/cross_entropy.cu). Built without the folder, nothing here runs.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>
#include <vector>

namespace mxtrain::quack_gemm {

// A GEMM as cuBLAS states it, column-major: D[m, n] = op(A)[m, k] · op(B)[k, n], BF16 operands
// and output, FP32 accumulation, no epilogue and nothing added (beta = 0).
struct Product {
  bool transpose_a = false, transpose_b = false;
  int64_t m = 0, n = 0, k = 0;
  const void* a = nullptr;
  int64_t lda = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  void* d = nullptr;
  int64_t ldd = 0;
};

// The configurations this build carries, as "<layout> <tile>" ("tn 128x192_c2x1_pp"); empty when
// mxtrain was built without them.
std::vector<std::string> carried();

// The carried functions that can run `p` on the current device (an sm_90 GPU; the transposes of
// one of the three linear ops; leading dimensions multiples of 8 elements and 16-byte aligned
// pointers), as indexes for name() and run(); empty when none can.
std::vector<int> candidates(const Product& p);

std::string name(int candidate);

// Runs candidate `candidate` (one of candidates(p)) on `stream`; throws with the fix on failure.
void run(int candidate, const Product& p, cudaStream_t stream);

// The gated forward, row-major and contiguous: preact [rows, 2·ffn] = x [rows, k] · w [2·ffn, k]ᵀ
// (w's gate and up rows interleaved) and postact [rows, ffn] = silu(preact[:, 2j]) · preact[:, 2j+1],
// SwiGLU applied to the FP32 product, each output rounded to BF16 once.
struct Gated {
  int64_t rows = 0, k = 0, ffn = 0;
  const void* x = nullptr;
  const void* w = nullptr;
  void* preact = nullptr;
  void* postact = nullptr;
};

// Whether this build carries the gated GEMM at all, and (gated_candidates) the functions that can
// run `g` on the current device (an sm_90 GPU; k and ffn multiples of 8; 16-byte aligned
// pointers), in the export's order (its first is the one to take untimed).
bool gated_carried();
std::vector<int> gated_candidates(const Gated& g);
void run_gated(int candidate, const Gated& g, cudaStream_t stream);

// GPT-2's MLP GEMMs with GELU (tanh form) in the epilogue, row-major and contiguous, all BF16:
//   forward   preact [rows, n] = a [rows, k] · w [n, k]ᵀ + bias [n], out = gelu(preact), GELU
//             applied to the FP32 sum (the forward's x, the up projection)
//   backward  out [rows, n] = (a [rows, k] · w [k, n]) ⊙ gelu'(preact [rows, n]), the derivative at
//             the stored pre-activation times the FP32 product (a = dY; w the down projection's
//             weight [k = model, n = ffn]; preact is read, not written); with bias_partials
//             also the bias gradient of the up projection in partial sums: f32 [tiles, n],
//             row t = the sum of the FP32 out over rows [t·tile_m, (t+1)·tile_m) (gelu_partial_rows
//             rows; the caller sums them in order)
struct Gelu {
  bool backward = false;
  int64_t rows = 0, k = 0, n = 0;
  const void* a = nullptr;
  const void* w = nullptr;
  const void* bias = nullptr;  // forward only, required
  void* preact = nullptr;
  void* out = nullptr;
  float* bias_partials = nullptr;  // backward only, optional: [gelu_partial_rows(...), n], contiguous
};

// Whether this build carries the GELU GEMMs (both directions, the backward with and without the
// bias partials), and (gelu_candidates) the carried functions that can run `g` on the current
// device (an sm_90 GPU; k and n multiples of 8; 16-byte aligned pointers), in the export's order.
bool gelu_carried();
std::vector<int> gelu_candidates(const Gelu& g);
void run_gelu(int candidate, const Gelu& g, cudaStream_t stream);
// Rows of bias partials `candidate` writes for `rows` rows: one a tile of rows (tiles of 128 or
// more rows: private_buffers::kDgeluBiasTileRows).
int64_t gelu_partial_rows(int candidate, int64_t rows);

// ---- the linear cross-entropy (quack/linear_cross_entropy.py's scaled-exp pipeline) ------------
// One chunk of `rows` rows of the LM head, row-major and contiguous: x [rows, hidden], the head's
// weight W [vocab, hidden] (vocab: the padded columns), all BF16.
//   forward      z = x · Wᵀ + mask (mask f32 [vocab]: 0, or -inf for padding columns) in FP32;
//                per (row, `tile`-column tile t; 192 or 256): offset k[row, t] = round-to-even(max z · log2 e),
//                E = exp2(z · log2 e - k) in BF16 [rows, vocab], sum_exp[row, t] = the tile's sum of
//                E (FP32, before rounding), and target_logit[row] = z at targets[row] (unmasked).
//   input grad   dx [rows, hidden] = v[row] · Σ_c u(row, c) E[row, c] W[c, :], u(row, c) = strip
//                [c / 64, row] (BF16 powers of two), v f32 [rows] applied in the epilogue.
//   weight grad  dW [vocab, hidden] (f32) = or += Σ_row u(row, c) E[row, c] xs[row, :].
// The glue between the forward and the gradients (linear_cross_entropy.cu's lce_glue) turns the offsets
// and sums into the loss, fixes E at the target and writes strip, v and xs.
struct LinearCrossEntropy {
  int64_t rows = 0, hidden = 0, vocab = 0, tile = 192;
  const void* x = nullptr;
  const void* weight = nullptr;
  const int32_t* targets = nullptr;
  const float* mask = nullptr;
  void* e = nullptr;
  float* sum_exp = nullptr;  // [rows, vocab / tile] with leading dimension partials_ld
  float* offsets = nullptr;  // the same shape
  int64_t partials_ld = 0;
  float* target_logits = nullptr;
  void* strip = nullptr;       // bf16 [vocab / 64, rows]   (the glue writes these three)
  float* row_scale = nullptr;  // v
  void* xs = nullptr;          // bf16 [rows, hidden]
  void* dx = nullptr;                // bf16 [rows, hidden]
  float* dweight = nullptr;          // f32 [vocab, hidden]
};
// Whether this build carries the three functions, and why `c`'s sizes cannot run on the current
// device ("" when they can): an sm_90 GPU, rows and vocab multiples of 128, vocab of the tile (192 or
// 256), the hidden size of 8, 16-byte aligned pointers.
bool lce_carried();
std::string lce_unsupported(const LinearCrossEntropy& c);
void lce_forward(const LinearCrossEntropy& c, cudaStream_t stream);
void lce_input_grad(const LinearCrossEntropy& c, cudaStream_t stream);
void lce_weight_grad(const LinearCrossEntropy& c, bool accumulate, cudaStream_t stream);

}  // namespace mxtrain::quack_gemm
