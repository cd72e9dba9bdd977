// Softmax cross-entropy over a [rows, V] chunk of logits, in place: one block per row, an
// online max/sum pass (each thread keeps a running max and a rescaled sum, merged across the
// block), then — when a gradient is wanted — a second pass that overwrites the logits with
// grad_scale * (softmax - onehot), zero in padding columns. So full FP32 logits never exist:
// the chunk stays in the activation dtype. The first pass also copies the row into shared
// memory (100 KB for a bf16 row of GPT-2's 50k vocabulary), so the second pass reads it from
// there: device memory sees one read and one write of the logits. Rows too long for shared
// memory read device memory twice instead; both paths compute the same values.
//
// Exponentials use the hardware ex2 (__expf), a third of the accurate expf's instructions: the
// kernel moved only 2.2 TB/s on GPT-2's 8192x50304 chunk on an H200 with expf, two of them per
// element. The approximation's error (a few ulp, growing with |x|) stays far inside the op's
// 1e-5 tolerance against the CPU oracle.
//
// The target logit is read before the block's first barrier, so the in-place gradient cannot
// overwrite it first. A target outside [0, valid_vocab) is a data bug (the CPU oracle asserts);
// here it makes that row's loss NaN, which the trainer's NaN-loss check turns into an error.
#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

template <int W, typename T, bool kCache>
__global__ void cross_entropy_kernel(T* logits, const int32_t* targets, float* losses, int64_t cols,
                                     int64_t valid_vocab, float grad_scale) {
  extern __shared__ uint4 shared_row[];  // kCache: the row's valid columns, as stored
  T* cache = reinterpret_cast<T*>(shared_row);
  const int64_t row = blockIdx.x;
  T* row_logits = logits + row * cols;
  const int32_t target = targets[row];
  const bool target_valid = target >= 0 && target < valid_vocab;
  __shared__ float target_logit;
  if (threadIdx.x == 0) target_logit = target_valid ? to_float<T>(row_logits[target]) : NAN;

  float running_max = -INFINITY, running_sum = 0.0f;
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < valid_vocab; c += static_cast<int64_t>(blockDim.x) * W) {
    float v[W];
    load<W>(row_logits + c, v);
    if constexpr (kCache) store<W>(cache + c, v);
    float local_max = -INFINITY;
#pragma unroll
    for (int i = 0; i < W; ++i) {
      if (c + i >= valid_vocab) v[i] = -INFINITY;
      local_max = fmaxf(local_max, v[i]);
    }
    const float new_max = fmaxf(running_max, local_max);
    float local_sum = 0.0f;
#pragma unroll
    for (int i = 0; i < W; ++i) local_sum += __expf(v[i] - new_max);
    running_sum = running_sum * __expf(running_max - new_max) + local_sum;
    running_max = new_max;
  }
  const float row_max = block_max(running_max);
  const float scaled = running_max == -INFINITY ? 0.0f : running_sum * __expf(running_max - row_max);
  const float row_sum = block_sum(scaled);  // its barriers also publish target_logit
  const float log_sum_exp = row_max + logf(row_sum);
  if (threadIdx.x == 0) losses[row] = log_sum_exp - target_logit;
  if (grad_scale == 0.0f) return;

  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < cols; c += static_cast<int64_t>(blockDim.x) * W) {
    float v[W], g[W];
    if constexpr (kCache) {
      if (c < valid_vocab) load<W>(cache + c, v);  // columns past valid_vocab become 0 below
    } else {
      load<W>(row_logits + c, v);
    }
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const int64_t column = c + i;
      const float probability = column < valid_vocab ? __expf(v[i] - log_sum_exp) : 0.0f;
      g[i] = grad_scale * (column == target ? probability - 1.0f : probability);
    }
    store<W>(row_logits + c, g);
  }
}

template <int W, typename T, bool kCache>
void launch(T* data, const int32_t* ids, float* out, int64_t rows, int64_t cols, int64_t valid_vocab,
            float grad_scale, int threads, size_t shared_bytes, cudaStream_t stream) {
  if constexpr (kCache) {
    // Once per instantiation: allow this kernel the device's whole opt-in shared memory.
    // The dynamic limit is the opt-in maximum less the kernel's static shared memory (the
    // block reductions' few hundred bytes).
    static const bool raised = [] {
      int device = 0, limit = 0;
      MXTRAIN_CUDA_CHECK(cudaGetDevice(&device));
      MXTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&limit, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
      cudaFuncAttributes attributes{};
      MXTRAIN_CUDA_CHECK(cudaFuncGetAttributes(&attributes, cross_entropy_kernel<W, T, true>));
      MXTRAIN_CUDA_CHECK(cudaFuncSetAttribute(cross_entropy_kernel<W, T, true>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              limit - static_cast<int>(attributes.sharedSizeBytes)));
      return true;
    }();
    (void)raised;
  }
  cross_entropy_kernel<W, T, kCache><<<static_cast<unsigned>(rows), threads, shared_bytes, stream>>>(
      data, ids, out, cols, valid_vocab, grad_scale);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

size_t shared_memory_limit() {
  static const size_t limit = [] {
    int device = 0, bytes = 0;
    MXTRAIN_CUDA_CHECK(cudaGetDevice(&device));
    MXTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
    return static_cast<size_t>(bytes);
  }();
  return limit;
}

}  // namespace

void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses, int64_t valid_vocab,
                   float grad_scale, cudaStream_t stream) {
  const int64_t rows = logits.rows(), cols = logits.cols();
  if (rows == 0) return;
  const bool vector = cols % 8 == 0 && aligned16(logits);
  const int width = vector ? 8 : 1;
  // Enough threads for one pass of 16-byte loads over the row, in whole warps, at most 1024.
  const int64_t wanted = (cols / width + 31) / 32 * 32;
  const int threads = static_cast<int>(std::max<int64_t>(32, std::min<int64_t>(1024, wanted)));
  // The row cache (only when a second pass runs); the static reductions need under 1 KB more.
  const size_t row_bytes = (static_cast<size_t>(cols) * dtype_bits(logits.dtype) / 8 + 15) / 16 * 16;
  const bool cache = grad_scale != 0.0f && row_bytes + 1024 <= shared_memory_limit();
  const size_t shared_bytes = cache ? row_bytes : 0;
  dispatch_float<true>(logits.dtype, "cross_entropy", [&](auto tag) {
    using T = decltype(tag);
    T* data = static_cast<T*>(logits.data);
    const int32_t* ids = static_cast<const int32_t*>(targets.data);
    float* out = static_cast<float*>(losses.data);
    if (vector) {
      if (cache) launch<8, T, true>(data, ids, out, rows, cols, valid_vocab, grad_scale, threads, shared_bytes, stream);
      else launch<8, T, false>(data, ids, out, rows, cols, valid_vocab, grad_scale, threads, 0, stream);
    } else {
      if (cache) launch<1, T, true>(data, ids, out, rows, cols, valid_vocab, grad_scale, threads, shared_bytes, stream);
      else launch<1, T, false>(data, ids, out, rows, cols, valid_vocab, grad_scale, threads, 0, stream);
    }
  });
}

}  // namespace mxtrain::cuda_kernels
