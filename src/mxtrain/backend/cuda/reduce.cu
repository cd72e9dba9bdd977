// Deterministic reductions: whole-tensor sums (loss sums, gradient norms) and column sums
// (bias gradients, norm weight gradients). Every reduction has two stages with a launch shape
// that depends only on the tensor's size: per-block partials in a fixed order, then one pass
// that adds the partials in index order. No float atomics anywhere, so rerunning an op gives
// the same bits.
#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kSumThreads = 256;
constexpr int kColumnThreads = 128;

template <int W, typename T, bool kSquares>
__global__ void sum_partials_kernel(const T* x, int64_t vectors, float* partials) {
  float total = 0.0f;
  for (int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; v < vectors;
       v += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    float e[W];
    load<W>(x + v * W, e);
#pragma unroll
    for (int i = 0; i < W; ++i) total += kSquares ? e[i] * e[i] : e[i];
  }
  total = block_sum(total);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block adds the partials; each thread's share in index order, eight loads in flight before
// their adds (the same sums as one load at a time: AdamW's per-group norms have up to 20,000
// partials, and a load at a time left this kernel at about 11 us a group on an H200).
__global__ void sum_final_kernel(const float* partials, int64_t count, float* out, bool accumulate) {
  constexpr int kBatch = 8;
  float value = 0.0f;
  const int64_t stride = blockDim.x;
  int64_t i = threadIdx.x;
  for (; i + (kBatch - 1) * stride < count; i += kBatch * stride) {
    float batch[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) batch[j] = partials[i + j * stride];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) value += batch[j];
  }
  for (; i < count; i += stride) value += partials[i];
  value = block_sum(value);
  if (threadIdx.x == 0) out[0] = accumulate ? out[0] + value : value;
}

template <int W, typename T>
__global__ void column_partials_kernel(const T* x, float* partials, int64_t rows, int64_t cols, int64_t ld,
                                       int64_t rows_per_chunk) {
  const int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * W;
  if (c >= cols) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float acc[W];
#pragma unroll
  for (int i = 0; i < W; ++i) acc[i] = 0.0f;
  // Eight rows' loads in flight before their adds (the adds stay in row order): the kernel is
  // latency-bound at one or four loads in flight per thread.
  constexpr int kBatch = 8;
  int64_t r = begin;
  for (; r + kBatch <= end; r += kBatch) {
    float v[kBatch][W];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) load<W>(x + (r + j) * ld + c, v[j]);
#pragma unroll
    for (int j = 0; j < kBatch; ++j)
#pragma unroll
      for (int i = 0; i < W; ++i) acc[i] += v[j][i];
  }
  for (; r < end; ++r) {
    float v[W];
    load<W>(x + r * ld + c, v);
#pragma unroll
    for (int i = 0; i < W; ++i) acc[i] += v[i];
  }
  store<W>(partials + chunk * cols + c, acc);
}

// Block (32, kGroups): 32 columns, kGroups interleaved chunk groups combined in a fixed order.
constexpr int kGroups = 32;

// Thread row y's share of a column's terms: Σ term(p) over p ≡ y (mod kGroups), p < count, in p
// order, with a batch of kBatch terms' loads in flight before their adds (the same sums as one at
// a time; at four in flight a 512-chunk column took four memory round trips, and these kernels
// run a few hundred times a step).
template <typename Term> __device__ __forceinline__ float group_share(int64_t count, Term term) {
  constexpr int kBatch = 16;
  float total = 0.0f;
  int64_t p = threadIdx.y;
  for (; p + (kBatch - 1) * kGroups < count; p += kBatch * kGroups) {
    float batch[kBatch];
#pragma unroll
    for (int j = 0; j < kBatch; ++j) batch[j] = term(p + j * kGroups);
#pragma unroll
    for (int j = 0; j < kBatch; ++j) total += batch[j];
  }
  for (; p < count; p += kGroups) total += term(p);
  return total;
}

// The block's thread rows' shares of its 32 columns added in group order; the column's sum in
// thread row 0 (0 elsewhere). Every thread of the block must call it.
__device__ __forceinline__ float sum_of_group_shares(float share) {
  __shared__ float group_sums[kGroups][33];
  group_sums[threadIdx.y][threadIdx.x] = share;
  __syncthreads();
  float sum = 0.0f;
  if (threadIdx.y == 0) {
#pragma unroll
    for (int g = 0; g < kGroups; ++g) sum += group_sums[g][threadIdx.x];
  }
  return sum;
}

template <typename G>
__global__ void reduce_partials_kernel(const float* partials, int64_t chunks, int64_t cols, G* out, bool accumulate) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const float share = c < cols ? group_share(chunks, [&](int64_t p) { return partials[p * cols + c]; }) : 0.0f;
  const float sum = sum_of_group_shares(share);
  if (threadIdx.y == 0 && c < cols) out[c] = from_float<G>(accumulate ? to_float<G>(out[c]) + sum : sum);
}

// Backend::qkv_bias_gradient's second stage, block (32, kGroups) over 32 of the 3·hidden
// columns: a query column sums dq's chunk partials (as reduce_partials_kernel), a key column is
// zero, a value column j is Σ_i out_bias[i]·out_weight[i, j] (thread row y takes i ≡ y mod
// kGroups, reading 32 consecutive j of a weight row: coalesced); group sums then in order.
template <typename G, typename W>
__global__ void qkv_bias_kernel(const float* partials, int64_t chunks, int64_t hidden, const G* out_bias,
                                const W* out_weight, G* bias, bool accumulate) {
  const int64_t c = static_cast<int64_t>(blockIdx.x) * 32 + threadIdx.x;
  const int part = c < hidden ? 0 : c < 2 * hidden ? 1 : 2;
  float share = 0.0f;
  if (c < 3 * hidden) {
    if (part == 0) {
      share = group_share(chunks, [&](int64_t p) { return partials[p * hidden + c]; });
    } else if (part == 2) {
      const int64_t j = c - 2 * hidden;
      share = group_share(hidden, [&](int64_t i) {
        return to_float<G>(out_bias[i]) * to_float<W>(out_weight[i * hidden + j]);
      });
    }
  }
  const float sum = sum_of_group_shares(share);
  if (threadIdx.y == 0 && c < 3 * hidden) {
    if (part == 0) bias[c] = from_float<G>(accumulate ? to_float<G>(bias[c]) + sum : sum);
    else if (part == 1) {
      if (!accumulate) bias[c] = from_float<G>(0.0f);
    } else {
      bias[c] = from_float<G>(sum);
    }
  }
}

template <typename G> __global__ void accumulate_kernel(const float* values, G* out, int64_t n, bool accumulate) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = from_float<G>(accumulate ? to_float<G>(out[i]) + values[i] : values[i]);
}

}  // namespace

void sum(const Tensor& x, const Tensor& out, bool accumulate, bool squares, float* partials, cudaStream_t stream) {
  const int64_t n = x.numel();
  float* o = static_cast<float*>(out.data);
  if (n == 0) {
    if (!accumulate) {
      MXTRAIN_CUDA_CHECK(cudaMemsetAsync(o, 0, sizeof(float), stream));
    }
    return;
  }
  const bool vector = n % 8 == 0 && aligned16(x);
  const int64_t vectors = vector ? n / 8 : n;
  const int blocks = static_cast<int>(std::min<int64_t>(kSumMaxBlocks, (vectors + kSumThreads * 4 - 1) /
                                                                          (kSumThreads * 4)));
  dispatch_float<true>(x.dtype, squares ? "sum_of_squares" : "sum", [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(x.data);
    if (vector) {
      if (squares) sum_partials_kernel<8, T, true><<<blocks, kSumThreads, 0, stream>>>(data, vectors, partials);
      else sum_partials_kernel<8, T, false><<<blocks, kSumThreads, 0, stream>>>(data, vectors, partials);
    } else {
      if (squares) sum_partials_kernel<1, T, true><<<blocks, kSumThreads, 0, stream>>>(data, vectors, partials);
      else sum_partials_kernel<1, T, false><<<blocks, kSumThreads, 0, stream>>>(data, vectors, partials);
    }
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
  sum_final_kernel<<<1, kSumMaxBlocks, 0, stream>>>(partials, blocks, o, accumulate);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

void sum_partials_final(const float* partials, int64_t count, float* out, bool accumulate, cudaStream_t stream) {
  MXTRAIN_ASSERT(count >= 1, "sum_partials_final: %lld partials", static_cast<long long>(count));
  sum_final_kernel<<<1, kSumMaxBlocks, 0, stream>>>(partials, count, out, accumulate);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

void reduce_column_partials(const float* partials, int64_t chunks, const Tensor& out, bool accumulate,
                            cudaStream_t stream) {
  const int64_t cols = out.numel();
  if (cols == 0) return;
  dispatch_float<true>(out.dtype, "column reduction", [&](auto tag) {
    using G = decltype(tag);
    reduce_partials_kernel<G><<<blocks_for(cols, 32), dim3(32, kGroups), 0, stream>>>(partials, chunks, cols,
                                                                                static_cast<G*>(out.data), accumulate);
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void column_sum(Backend& backend, const Tensor& x, const Tensor& out, bool accumulate, cudaStream_t stream) {
  const int64_t rows = x.rows(), cols = x.cols();
  MXTRAIN_ASSERT(out.numel() == cols, "column sum: out %s for x %s", out.describe().c_str(), x.describe().c_str());
  if (x.numel() == 0) {
    if (!accumulate) fill(out, 0.0f, stream);
    return;
  }
  std::vector<Buffer> scratch = private_buffers::allocate_private(backend, private_buffers::column_sum(x));
  float* p = scratch.at(0).tensor().ptr<float>();
  const int64_t chunks = column_partials(x, p, stream);
  reduce_column_partials(p, chunks, out, accumulate, stream);
}

void qkv_bias_gradient(Backend& backend, const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                       const Tensor& qkv_bias_grad, bool accumulate, cudaStream_t stream) {
  const int64_t hidden = out_bias_grad.numel();
  if (hidden == 0) return;
  const Tensor dq = dqkv.flatten_rows().narrow(1, 0, hidden);
  std::vector<Buffer> scratch =
      private_buffers::allocate_private(backend, private_buffers::qkv_bias_gradient(dqkv, hidden));
  float* partials = scratch.empty() ? nullptr : scratch.front().tensor().ptr<float>();
  const int64_t chunks = partials == nullptr ? 0 : column_partials(dq, partials, stream);
  dispatch_float<true>(qkv_bias_grad.dtype, "qkv bias gradient", [&](auto grad_tag) {
    using G = decltype(grad_tag);
    dispatch_float<true>(out_weight.dtype, "qkv bias gradient's weight", [&](auto weight_tag) {
      using W = decltype(weight_tag);
      qkv_bias_kernel<G, W><<<blocks_for(3 * hidden, 32), dim3(32, kGroups), 0, stream>>>(
          partials, chunks, hidden, static_cast<const G*>(out_bias_grad.data), static_cast<const W*>(out_weight.data),
          static_cast<G*>(qkv_bias_grad.data), accumulate);
      MXTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

int64_t column_partials(const Tensor& x, float* partials, cudaStream_t stream) {
  const int64_t rows = x.rows(), cols = x.cols();
  if (x.numel() == 0) return 0;
  const int64_t ld = column_sum_row_stride(x);
  const int64_t chunks = private_buffers::column_reduction_chunks(rows);
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  float* p = partials;
  const bool vector = cols % 8 == 0 && ld % 8 == 0 && aligned16(x);
  dispatch_float<true>(x.dtype, "column sum", [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(x.data);
    if (vector) {
      dim3 grid(blocks_for(cols / 8, kColumnThreads), static_cast<unsigned>(chunks));
      column_partials_kernel<8><<<grid, kColumnThreads, 0, stream>>>(data, p, rows, cols, ld, rows_per_chunk);
    } else {
      dim3 grid(blocks_for(cols, kColumnThreads), static_cast<unsigned>(chunks));
      column_partials_kernel<1><<<grid, kColumnThreads, 0, stream>>>(data, p, rows, cols, ld, rows_per_chunk);
    }
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
  return chunks;
}

void accumulate_f32(const float* values, const Tensor& out, bool accumulate, cudaStream_t stream) {
  const int64_t n = out.numel();
  if (n == 0) return;
  dispatch_float<true>(out.dtype, "accumulate", [&](auto tag) {
    using G = decltype(tag);
    accumulate_kernel<G><<<blocks_for(n, 256), 256, 0, stream>>>(values, static_cast<G*>(out.data), n, accumulate);
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mxtrain::cuda_kernels
