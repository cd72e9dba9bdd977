// Rotary position embedding in place on the q and k heads of the packed qkv rows, rotate-half
// convention: element i pairs with i + head_dim/2. The cos/sin table is built once per
// (seq, head_dim, theta) on the host with the CPU oracle's float32 formula and uploaded by the
// backend, so the angles are bit-identical to the CPU's. Backward applies the inverse
// rotation (sin negated). Each thread rotates W pairs of one head of one row.
#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kThreads = 256;

template <int W, typename T>
__global__ void rope_kernel(T* qkv, const float* cos_table, const float* sin_table, int64_t items, int64_t seq,
                            int rotated_heads, int head_dim, int64_t row_stride, float sin_sign) {
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (item >= items) return;
  const int half = head_dim / 2;
  const int chunks = half / W;
  const int chunk = static_cast<int>(item % chunks);
  const int64_t head_row = item / chunks;
  const int head = static_cast<int>(head_row % rotated_heads);
  const int64_t row = head_row / rotated_heads;
  const int64_t position = row % seq;
  const int i = chunk * W;
  T* first = qkv + row * row_stride + static_cast<int64_t>(head) * head_dim + i;
  T* second = first + half;
  float x1[W], x2[W], c[W], s[W], y1[W], y2[W];
  load<W>(first, x1);
  load<W>(second, x2);
  load<W>(cos_table + position * half + i, c);
  load<W>(sin_table + position * half + i, s);
#pragma unroll
  for (int k = 0; k < W; ++k) {
    const float sk = sin_sign * s[k];
    y1[k] = x1[k] * c[k] - x2[k] * sk;
    y2[k] = x2[k] * c[k] + x1[k] * sk;
  }
  store<W>(first, y1);
  store<W>(second, y2);
}

}  // namespace

void rope(const Tensor& qkv, const AttentionShape& shape, const float* table, bool inverse, cudaStream_t stream) {
  const int head_dim = static_cast<int>(shape.head_dim);
  const int half = head_dim / 2;
  const int rotated_heads = static_cast<int>(shape.heads + shape.kv_heads);
  const int64_t rows = qkv.rows();
  if (rows == 0) return;
  const float* cos_table = table;
  const float* sin_table = table + shape.seq * half;
  const float sin_sign = inverse ? -1.0f : 1.0f;
  // 16-byte vectors need 8 pairs per chunk and 16-byte aligned rows/heads.
  const bool vector = half % 8 == 0 && aligned16(qkv) && (qkv.cols() * dtype_bits(qkv.dtype) / 8) % 16 == 0 &&
                      aligned16(cos_table) && aligned16(sin_table);
  dispatch_float<true>(qkv.dtype, "rope", [&](auto tag) {
    using T = decltype(tag);
    T* data = static_cast<T*>(qkv.data);
    if (vector) {
      const int64_t items = rows * rotated_heads * (half / 8);
      rope_kernel<8><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
          data, cos_table, sin_table, items, shape.seq, rotated_heads, head_dim, qkv.cols(), sin_sign);
    } else {
      const int64_t items = rows * rotated_heads * half;
      rope_kernel<1><<<blocks_for(items, kThreads), kThreads, 0, stream>>>(
          data, cos_table, sin_table, items, shape.seq, rotated_heads, head_dim, qkv.cols(), sin_sign);
    }
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mxtrain::cuda_kernels
