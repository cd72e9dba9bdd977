// Token (+ learned position) embedding, forward and a deterministic backward.
//
// Backward without float atomics: the row indices are sorted by token id with a stable radix
// sort (cub), so equal tokens form contiguous runs in ascending row order. One block per run
// start (and per 256-column slice) sums dout over its run in that order and adds the sum to
// the token's gradient row once; every other block exits at once. Tokens outside
// [0, vocab) are mapped to a sentinel key and contribute nothing (the forward writes zeros
// for them), so a bad token can never write outside the table. The position gradient is a
// plain per-position sum over the batch, in batch order.
#include <cub/device/device_radix_sort.cuh>

#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kRunThreads = 32;

template <int W, typename T, typename Wt>
__global__ void embedding_forward_kernel(const int32_t* tokens, const Wt* token_table, const Wt* position_table,
                                         T* out, int64_t vectors, int64_t cols, int64_t vocab, int64_t seq) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vectors) return;
  const int64_t per_row = cols / W;
  const int64_t row = v / per_row, c = (v % per_row) * W;
  const int32_t token = tokens[row];
  float y[W];
  if (token >= 0 && token < vocab) {
    load<W>(token_table + static_cast<int64_t>(token) * cols + c, y);
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) y[i] = 0.0f;
  }
  if (position_table != nullptr) {
    float p[W];
    load<W>(position_table + (row % seq) * cols + c, p);
#pragma unroll
    for (int i = 0; i < W; ++i) y[i] += p[i];
  }
  store<W>(out + row * cols + c, y);
}

__global__ void sort_inputs_kernel(const int32_t* tokens, int32_t* keys, int32_t* rows, int64_t n, int32_t vocab) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int32_t token = tokens[i];
  keys[i] = token >= 0 && token < vocab ? token : vocab;
  rows[i] = static_cast<int32_t>(i);
}

template <int W, typename T, typename G>
__global__ void token_grad_kernel(const int32_t* sorted_keys, const int32_t* sorted_rows, const T* dout, G* dtable,
                                  int64_t n, int64_t cols, int32_t vocab) {
  const int64_t start = blockIdx.x;
  const int32_t key = sorted_keys[start];
  if (key == vocab || (start > 0 && sorted_keys[start - 1] == key)) return;
  const int64_t c = (static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x) * W;
  if (c >= cols) return;
  float acc[W];
#pragma unroll
  for (int i = 0; i < W; ++i) acc[i] = 0.0f;
  for (int64_t r = start; r < n && sorted_keys[r] == key; ++r) {
    float d[W];
    load<W>(dout + static_cast<int64_t>(sorted_rows[r]) * cols + c, d);
#pragma unroll
    for (int i = 0; i < W; ++i) acc[i] += d[i];
  }
  G* target = dtable + static_cast<int64_t>(key) * cols + c;
  float g[W];
  load<W>(target, g);
#pragma unroll
  for (int i = 0; i < W; ++i) g[i] += acc[i];
  store<W>(target, g);
}

template <int W, typename T, typename G>
__global__ void position_grad_kernel(const T* dout, G* dposition, int64_t vectors, int64_t cols, int64_t seq,
                                     int64_t batch) {
  const int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vectors) return;
  const int64_t per_row = cols / W;
  const int64_t position = v / per_row, c = (v % per_row) * W;
  float acc[W];
#pragma unroll
  for (int i = 0; i < W; ++i) acc[i] = 0.0f;
  for (int64_t b = 0; b < batch; ++b) {
    float d[W];
    load<W>(dout + (b * seq + position) * cols + c, d);
#pragma unroll
    for (int i = 0; i < W; ++i) acc[i] += d[i];
  }
  G* target = dposition + position * cols + c;
  float g[W];
  load<W>(target, g);
#pragma unroll
  for (int i = 0; i < W; ++i) g[i] += acc[i];
  store<W>(target, g);
}

}  // namespace

void embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                       const Tensor& out, int64_t seq_len, cudaStream_t stream) {
  const int64_t rows = out.rows(), cols = out.cols();
  if (rows == 0) return;
  MXTRAIN_ASSERT(!position_table.defined() || position_table.dtype == token_table.dtype,
                 "embedding tables must share a dtype");
  MXTRAIN_ASSERT(!position_table.defined() || position_table.rows() >= seq_len,
                 "position table %s shorter than seq_len %lld", position_table.describe().c_str(),
                 static_cast<long long>(seq_len));
  const bool vector = cols % 8 == 0 && aligned16(out) && aligned16(token_table) && aligned16(position_table);
  dispatch_float<true>(out.dtype, "embedding_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float<true>(token_table.dtype, "embedding_forward (table)", [&](auto table_tag) {
      using Wt = decltype(table_tag);
      const int32_t* ids = static_cast<const int32_t*>(tokens.data);
      const Wt* table = static_cast<const Wt*>(token_table.data);
      const Wt* positions = data_or_null<const Wt>(position_table);
      T* o = static_cast<T*>(out.data);
      const int64_t vocab = token_table.rows();
      if (vector) {
        const int64_t vectors = rows * cols / 8;
        embedding_forward_kernel<8, T, Wt><<<blocks_for(vectors, kThreads), kThreads, 0, stream>>>(
            ids, table, positions, o, vectors, cols, vocab, seq_len);
      } else {
        const int64_t vectors = rows * cols;
        embedding_forward_kernel<1, T, Wt><<<blocks_for(vectors, kThreads), kThreads, 0, stream>>>(
            ids, table, positions, o, vectors, cols, vocab, seq_len);
      }
      MXTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

void embedding_backward(Backend& backend, const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                        const Tensor& dposition_table, int64_t seq_len, cudaStream_t stream,
                        private_buffers::DeviceFacts* facts) {
  const int64_t n = dout.rows(), cols = dout.cols();
  if (n == 0) return;
  MXTRAIN_REQUIRE(n < (int64_t{1} << 31), unsupported, "embedding_backward: more than 2^31 tokens in one call",
                  "split the batch into smaller micro-batches");
  const int32_t vocab = static_cast<int32_t>(dtoken_table.rows());
  const bool vector = cols % 8 == 0 && aligned16(dout) && aligned16(dtoken_table) && aligned16(dposition_table);

  // Stable sort of (token, row) pairs by token. cub's temp storage is a device fact: its size
  // query (no pointer is read) comes first, then the buffers of private_buffers.hpp.
  const int bits = private_buffers::embedding_sort_key_bits(vocab);
  size_t temp_bytes = 0;
  MXTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<const int32_t*>(nullptr),
                                                     static_cast<int32_t*>(nullptr), static_cast<int>(n), 0, bits,
                                                     stream));
  if (facts) facts->record(private_buffers::embedding_sort_fact(n, bits), static_cast<int64_t>(temp_bytes));
  std::vector<Buffer> scratch =
      private_buffers::allocate_private(backend, private_buffers::embedding_backward(n, temp_bytes));
  int32_t* keys_in = scratch.at(0).tensor().ptr<int32_t>();
  int32_t* keys_out = keys_in + n;
  int32_t* rows_in = scratch.at(1).tensor().ptr<int32_t>();
  int32_t* rows_out = rows_in + n;
  const Tensor& temp = scratch.at(2).tensor();
  sort_inputs_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(static_cast<const int32_t*>(tokens.data),
                                                                       keys_in, rows_in, n, vocab);
  MXTRAIN_CUDA_CHECK_LAUNCH();
  MXTRAIN_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.data, temp_bytes, keys_in, keys_out, rows_in,
                                                     rows_out, static_cast<int>(n), 0, bits, stream));

  dispatch_float<true>(dout.dtype, "embedding_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float<true>(dtoken_table.dtype, "embedding_backward (gradient)", [&](auto grad_tag) {
      using G = decltype(grad_tag);
      const T* d = static_cast<const T*>(dout.data);
      if (vector) {
        dim3 grid(static_cast<unsigned>(n), blocks_for(cols / 8, kRunThreads));
        token_grad_kernel<8, T, G><<<grid, kRunThreads, 0, stream>>>(keys_out, rows_out, d,
                                                                     static_cast<G*>(dtoken_table.data), n, cols, vocab);
      } else {
        dim3 grid(static_cast<unsigned>(n), blocks_for(cols, kRunThreads));
        token_grad_kernel<1, T, G><<<grid, kRunThreads, 0, stream>>>(keys_out, rows_out, d,
                                                                     static_cast<G*>(dtoken_table.data), n, cols, vocab);
      }
      MXTRAIN_CUDA_CHECK_LAUNCH();
      if (!dposition_table.defined()) return;
      MXTRAIN_ASSERT(dposition_table.dtype == dtoken_table.dtype, "embedding gradient dtypes differ");
      MXTRAIN_ASSERT(dposition_table.rows() >= seq_len && n % seq_len == 0, "position gradient shape");
      const int64_t batch = n / seq_len;
      G* dpos = static_cast<G*>(dposition_table.data);
      if (vector) {
        const int64_t vectors = seq_len * cols / 8;
        position_grad_kernel<8, T, G><<<blocks_for(vectors, kThreads), kThreads, 0, stream>>>(d, dpos, vectors, cols,
                                                                                             seq_len, batch);
      } else {
        const int64_t vectors = seq_len * cols;
        position_grad_kernel<1, T, G><<<blocks_for(vectors, kThreads), kThreads, 0, stream>>>(d, dpos, vectors, cols,
                                                                                             seq_len, batch);
      }
      MXTRAIN_CUDA_CHECK_LAUNCH();
    });
  });
}

}  // namespace mxtrain::cuda_kernels
