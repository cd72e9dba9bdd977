// Attention of new tokens against a key/value cache (generation; Backend::attention_cached).
// First a copy kernel stores the new rows' keys and values in the caches. Then one block per
// (query head, new row) attends: each of its 8 warps walks every 8th key with an online softmax
// (running max m, sum l and a head_dim accumulator spread over the lanes: lane t holds elements
// t, t+32, ..., so a warp reads a key or value row as one contiguous span), and the warps' partial
// results are merged through shared memory at the end (flash-decoding within a block). A decode
// step is one query row per head, bandwidth-bound on the cache: the walk reads each key and value
// once. head_dim up to 256.
#include <algorithm>
#include <cstdint>

#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kWarps = 8;
constexpr int kMaxPerLane = 8;  // head_dim <= 32 * 8

template <typename T>
__global__ void store_keys_values_kernel(const T* qkv, T* k_cache, T* v_cache, int64_t rows, int64_t qkv_stride,
                                         int64_t k_column, int64_t kv_cols, int64_t past) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= rows * kv_cols) return;
  const int64_t row = item / kv_cols, column = item % kv_cols;
  const T* source = qkv + row * qkv_stride + k_column + column;
  k_cache[(past + row) * kv_cols + column] = source[0];
  v_cache[(past + row) * kv_cols + column] = source[kv_cols];
}

// One (head, row) of the output; every thread of the block calls it.
template <typename T>
__device__ void attend_row(const T* qkv, const T* k_cache, const T* v_cache, T* out, int64_t qkv_stride,
                           int64_t out_stride, int64_t kv_cols, int head_dim, int group, int64_t past, float scale,
                           int head, int64_t row) {
  const int kv_head = head / group;
  const int64_t keys = past + row + 1;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  float q[kMaxPerLane], acc[kMaxPerLane];
  const T* q_row = qkv + row * qkv_stride + static_cast<int64_t>(head) * head_dim;
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) {
    const int d = lane + 32 * e;
    q[e] = d < head_dim ? to_float<T>(q_row[d]) * scale : 0.0f;
    acc[e] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int64_t j = warp; j < keys; j += kWarps) {
    const T* k_row = k_cache + j * kv_cols + static_cast<int64_t>(kv_head) * head_dim;
    float partial = 0.0f;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      if (d < head_dim) partial += q[e] * to_float<T>(k_row[d]);
    }
    const float score = warp_sum(partial);
    const float m_new = fmaxf(m, score);
    const float correction = __expf(m - m_new), p = __expf(score - m_new);
    l = l * correction + p;
    const T* v_row = v_cache + j * kv_cols + static_cast<int64_t>(kv_head) * head_dim;
#pragma unroll
    for (int e = 0; e < kMaxPerLane; ++e) {
      const int d = lane + 32 * e;
      acc[e] = acc[e] * correction + (d < head_dim ? p * to_float<T>(v_row[d]) : 0.0f);
    }
    m = m_new;
  }
  // Merge the warps: each rescales to the block's max.
  __shared__ float warp_m[kWarps], warp_l[kWarps];
  __shared__ float warp_acc[kWarps][32 * kMaxPerLane];
  if (lane == 0) {
    warp_m[warp] = m;
    warp_l[warp] = l;
  }
#pragma unroll
  for (int e = 0; e < kMaxPerLane; ++e) warp_acc[warp][lane + 32 * e] = acc[e];
  __syncthreads();
  float top = -INFINITY;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) top = fmaxf(top, warp_m[w]);
  float total = 0.0f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) total += warp_m[w] == -INFINITY ? 0.0f : warp_l[w] * __expf(warp_m[w] - top);
  T* out_row = out + row * out_stride + static_cast<int64_t>(head) * head_dim;
  for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w)
      if (warp_m[w] != -INFINITY) sum += warp_acc[w][d] * __expf(warp_m[w] - top);
    out_row[d] = from_float<T>(sum / total);
  }
  __syncthreads();  // the shared partials are reused by the block's next row
}

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
    attention_cached_kernel(const T* qkv, const T* k_cache, const T* v_cache, T* out, int64_t rows, int64_t qkv_stride,
                            int64_t out_stride, int64_t kv_cols, int head_dim, int group, int64_t past, float scale) {
  for (int64_t row = blockIdx.y; row < rows; row += gridDim.y)
    attend_row(qkv, k_cache, v_cache, out, qkv_stride, out_stride, kv_cols, head_dim, group, past, scale,
               static_cast<int>(blockIdx.x), row);
}

}  // namespace

void attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                      const AttentionShape& shape, cudaStream_t stream) {
  const int64_t rows = qkv.rows(), kv_cols = shape.kv_heads * shape.head_dim;
  if (rows == 0) return;
  if (shape.head_dim > 32 * kMaxPerLane)
    throw Error(ErrorKind::unsupported,
                strf("attention_cached: head_dim %lld is above the kernel's %d", static_cast<long long>(shape.head_dim),
                     32 * kMaxPerLane),
                "generate on the cpu backend (--backend cpu)");
  const float scale =
      shape.softmax_scale > 0 ? shape.softmax_scale : 1.0f / sqrtf(static_cast<float>(shape.head_dim));
  dispatch_float<true>(qkv.dtype, "attention_cached", [&](auto tag) {
    using T = decltype(tag);
    const T* source = static_cast<const T*>(qkv.data);
    T* keys = static_cast<T*>(k_cache.data);
    T* values = static_cast<T*>(v_cache.data);
    const int64_t items = rows * kv_cols;
    store_keys_values_kernel<T><<<blocks_for(items, 256), 256, 0, stream>>>(
        source, keys, values, rows, qkv.cols(), shape.heads * shape.head_dim, kv_cols, shape.position_offset);
    MXTRAIN_CUDA_CHECK_LAUNCH();
    const dim3 grid(static_cast<unsigned>(shape.heads), static_cast<unsigned>(std::min<int64_t>(rows, 65535)));
    attention_cached_kernel<T><<<grid, kWarps * 32, 0, stream>>>(
        source, keys, values, static_cast<T*>(out.data), rows, qkv.cols(), out.cols(), kv_cols,
        static_cast<int>(shape.head_dim), static_cast<int>(shape.heads / shape.kv_heads), shape.position_offset,
        scale);
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mxtrain::cuda_kernels
