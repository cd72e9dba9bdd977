// Rotary position embedding in place on the q and k heads of the packed qkv rows, rotate-half
// convention: element i pairs with i + head_dim/2. The cos/sin table is built once per
// (positions, head_dim, theta) on the host with the CPU oracle's float32 formula and uploaded by the
// backend, so the angles are bit-identical to the CPU's. Backward applies the inverse
// rotation (sin negated). Each thread rotates W pairs of one head of one row. Backward can
// record the amax of the whole dqkv for the QKV projection's FP8 cast (current scaling): its
// threads then also cover the v heads, which they read but leave as they are.
#include <cstdint>

#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kThreads = 256;

// I: the index type of the item split (with_index_type).
template <int W, typename I, typename T>
__global__ void rope_kernel(T* qkv, const float* cos_table, const float* sin_table, int64_t items, int64_t seq,
                            int64_t position_offset, int rotated_heads, int heads, int head_dim, int64_t row_stride, float sin_sign,
                            unsigned* amax) {
  // heads: the rotated ones, or with an amax record every head of the row (v's only read).
  const int64_t item = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool active = item < items;
  if (!active && amax == nullptr) return;  // a record needs whole warps
  unsigned bits = 0;
  if (active) {
    const int half = head_dim / 2;
    const I chunks = static_cast<I>(half / W);
    const int chunk = static_cast<int>(static_cast<I>(item) % chunks);
    const I head_row = static_cast<I>(item) / chunks;
    const int head = static_cast<int>(head_row % static_cast<I>(heads));
    const int64_t row = head_row / static_cast<I>(heads);
    const int64_t position = position_offset + static_cast<int64_t>(static_cast<I>(row) % static_cast<I>(seq));
    const int i = chunk * W;
    T* first = qkv + row * row_stride + static_cast<int64_t>(head) * head_dim + i;
    T* second = first + half;
    float x1[W], x2[W];
    load<W>(first, x1);
    load<W>(second, x2);
    if (head < rotated_heads) {
      float c[W], s[W];
      load<W>(cos_table + position * half + i, c);
      load<W>(sin_table + position * half + i, s);
#pragma unroll
      for (int k = 0; k < W; ++k) {
        float y1, y2;
        rope_rotate(x1[k], x2[k], c[k], sin_sign * s[k], y1, y2);
        x1[k] = y1;
        x2[k] = y2;
      }
      store<W>(first, x1);
      store<W>(second, x2);
    }
    if (amax != nullptr) {
#pragma unroll
      for (int k = 0; k < W; ++k) bits = max(bits, max(abs_bits(x1[k]), abs_bits(x2[k])));
    }
  }
  if (amax != nullptr) record_warp_amax<T>(bits, amax);
}

}  // namespace

void rope(const Tensor& qkv, const AttentionShape& shape, const float* table, int64_t table_positions, bool inverse,
          const Tensor& out_amax, cudaStream_t stream) {
  const int head_dim = static_cast<int>(shape.head_dim);
  const int half = head_dim / 2;
  const int rotated_heads = static_cast<int>(shape.heads + shape.kv_heads);
  const int64_t rows = qkv.rows();
  unsigned* amax = start_amax_record(out_amax, stream);
  if (rows == 0) return;
  // With a record the items also cover the v heads (read for the amax only).
  const int heads = amax != nullptr ? static_cast<int>(shape.heads + 2 * shape.kv_heads) : rotated_heads;
  const float* cos_table = table;
  const float* sin_table = table + table_positions * half;
  const float sin_sign = inverse ? -1.0f : 1.0f;
  // 16-byte vectors need 8 pairs per chunk and 16-byte aligned rows/heads.
  const bool vector = half % 8 == 0 && aligned16(qkv) && (qkv.cols() * dtype_bits(qkv.dtype) / 8) % 16 == 0 &&
                      aligned16(cos_table) && aligned16(sin_table);
  dispatch_float<true>(qkv.dtype, "rope", [&](auto tag) {
    using T = decltype(tag);
    T* data = static_cast<T*>(qkv.data);
    const int width = vector ? 8 : 1;
    const int64_t items = rows * heads * (half / width);
    with_index_type(items, [&](auto index) {
      using I = decltype(index);
      auto kernel = vector ? rope_kernel<8, I, T> : rope_kernel<1, I, T>;
      kernel<<<blocks_for(items, kThreads), kThreads, 0, stream>>>(data, cos_table, sin_table, items, shape.seq,
                                                                  shape.position_offset, rotated_heads, heads, head_dim, qkv.cols(), sin_sign,
                                                                  amax);
    });
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mxtrain::cuda_kernels
