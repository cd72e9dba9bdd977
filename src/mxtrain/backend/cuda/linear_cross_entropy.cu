// The glue of quack's scaled-exp linear cross-entropy (train.head_loss = quack-lce;
// Backend::head_loss, quack_gemm.hpp's three GEMMs; docs/gemm-kernels.md). quack writes it in
// Triton (quack/linear_cross_entropy.py: _lce_glue_row, _lce_glue_strip); these are mxtrain's
// CUDA kernels for the same arithmetic.
//
// The forward GEMM leaves, per row and 192- or 256-column tile t, the integer offset k_t (the
// tile's largest logit in log2 units, rounded to even) and s_t = Σ exp2(z·log2 e - k_t) over the tile,
// and stores E = exp2(z·log2 e - k_t) in BF16 (at most √2), never the logits. Then per row:
//   k_r = max_t k_t,  S = Σ_t s_t · 2^(k_t - k_r),  L = k_r·ln 2 + ln S   (the log-sum-exp)
//   loss = L - z_target
//   dlogits_c = grad_scale · (p_c - [c = target]) = v · u_c · E_c  with  v = grad_scale / S and
//   u_c = 2^(k_t(c) - k_r) (exact powers of two), once E at the target is replaced as below
//   (p_c = e^(z_c - L) = E_c · 2^(k_t - k_r) / S). The gradient GEMMs take u as the strip
//   [vocab / 64, rows] (each tile's u written for each of its 64-column blocks) and apply v: dx's
//   epilogue multiplies by it, the weight gradient reads xs = x · bf16(v).
// The target's entry: dlogits_y = grad_scale · (e^(z_y - L) - 1) must equal v · u_y · E_y, so
//   E_y = (e^(z_y - L) - 1) · S · 2^(k_r - k_y) = (e^(z_y - L) - 1) · e^(L - k_y·ln 2),
// computed in FP32 from the exact target logit the forward emitted, then rounded once to BF16.
//
// Rows: one warp a row (the partials are a few hundred floats: 262 at GPT-2's 50,304 columns, 668
// at Llama 3's 128,256). Strip: 32x32 tiles of (row, tile) through shared memory, so the strip's
// writes run along rows.
#include <cmath>

#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr float kLn2 = 0.6931471805599453f;

__global__ void column_mask_kernel(float* mask, int64_t vocab, int64_t valid_vocab) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c < vocab) mask[c] = c < valid_vocab ? 0.0f : -INFINITY;
}

__global__ void glue_rows_kernel(LceGlue g) {
  const quack_gemm::LinearCrossEntropy& l = g.lce;
  const int64_t tiles = l.vocab / l.tile;
  const int lane = threadIdx.x & 31;
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= l.rows) return;
  const float* sums = l.sum_exp + row * l.partials_ld;
  const float* offsets = l.offsets + row * l.partials_ld;
  float k_r = -INFINITY;
  for (int64_t t = lane; t < tiles; t += 32) k_r = fmaxf(k_r, offsets[t]);
  k_r = warp_max(k_r);
  float s = 0.0f;
  for (int64_t t = lane; t < tiles; t += 32) s += sums[t] * exp2f(offsets[t] - k_r);
  s = warp_sum(s);
  const float L = k_r * kLn2 + logf(s);
  const float v = g.grad_scale / s;
  if (lane == 0) {
    const int32_t y = l.targets[row];
    const bool valid = y >= 0 && y < g.valid_vocab;
    const float z_y = valid ? l.target_logits[row] : 0.0f;
    g.losses[row] = valid ? L - z_y : NAN;
    g.row_max[row] = k_r;
    l.row_scale[row] = v;
    if (valid) {
      const float k_y = offsets[y / l.tile];
      const float fixed = (expf(z_y - L) - 1.0f) * expf(L - k_y * kLn2);
      static_cast<bf16*>(l.e)[row * l.vocab + y] = __float2bfloat16_rn(fixed);
    }
  }
  // xs = x · bf16(v): the weight gradient's operand (the row scale it cannot take in its epilogue).
  const float vb = __bfloat162float(__float2bfloat16_rn(v));
  const bf16* x = static_cast<const bf16*>(l.x) + row * l.hidden;
  bf16* xs = static_cast<bf16*>(l.xs) + row * l.hidden;
  for (int64_t c = lane * 8; c < l.hidden; c += 32 * 8) {
    float values[8];
    load<8>(x + c, values);
    for (float& value : values) value *= vb;
    store<8>(xs + c, values);
  }
}

// strip[t · blocks + r, row] = 2^(k[row, t] - k_r[row]) for r < blocks = tile / 64 (3 or 4): 32 rows x
// 32 column tiles a block.
__global__ void glue_strip_kernel(LceGlue g) {
  const quack_gemm::LinearCrossEntropy& l = g.lce;
  const int64_t tiles = l.vocab / l.tile;
  __shared__ float diff[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;  // 32 x 8
  const int64_t t0 = static_cast<int64_t>(blockIdx.x) * 32, r0 = static_cast<int64_t>(blockIdx.y) * 32;
  for (int j = ty; j < 32; j += 8) {
    const int64_t row = r0 + j, t = t0 + tx;
    diff[j][tx] = t < tiles ? l.offsets[row * l.partials_ld + t] - g.row_max[row] : 0.0f;
  }
  __syncthreads();
  bf16* strip = static_cast<bf16*>(l.strip);
  for (int j = ty; j < 32; j += 8) {
    const int64_t t = t0 + j;
    if (t >= tiles) continue;
    // An integer exponent at most 0: ldexpf is exact, and far below the smallest normal it is 0.
    const float exponent = fmaxf(diff[tx][j], -200.0f);
    const bf16 u = __float2bfloat16_rn(ldexpf(1.0f, static_cast<int>(exponent)));
    const int64_t blocks = l.tile / 64;
    for (int64_t r = 0; r < blocks; ++r) strip[(t * blocks + r) * l.rows + r0 + tx] = u;
  }
}

}  // namespace

void lce_column_mask(void* mask, int64_t vocab, int64_t valid_vocab, cudaStream_t stream) {
  constexpr int kThreads = 256;
  column_mask_kernel<<<blocks_for(vocab, kThreads), kThreads, 0, stream>>>(static_cast<float*>(mask), vocab,
                                                                            valid_vocab);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

void lce_glue(const LceGlue& g, cudaStream_t stream) {
  const quack_gemm::LinearCrossEntropy& l = g.lce;
  const int64_t tiles = l.tile > 0 ? l.vocab / l.tile : 0;
  MXTRAIN_ASSERT(l.rows % 32 == 0 && l.hidden % 8 == 0 && l.tile > 0 && l.tile % 64 == 0 && l.vocab == tiles * l.tile && aligned16(l.x) &&
                     aligned16(l.xs),
                 "lce_glue: rows %lld, hidden %lld, vocab %lld", static_cast<long long>(l.rows),
                 static_cast<long long>(l.hidden), static_cast<long long>(l.vocab));
  constexpr int kRowsPerBlock = 8;
  glue_rows_kernel<<<blocks_for(l.rows, kRowsPerBlock), kRowsPerBlock * 32, 0, stream>>>(g);
  MXTRAIN_CUDA_CHECK_LAUNCH();
  const dim3 grid(static_cast<unsigned>((tiles + 31) / 32), static_cast<unsigned>(l.rows / 32));
  glue_strip_kernel<<<grid, dim3(32, 8), 0, stream>>>(g);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace mxtrain::cuda_kernels
