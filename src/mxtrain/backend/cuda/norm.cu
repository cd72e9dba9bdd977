// RMSNorm and LayerNorm, forward (optionally fused with the residual add) and backward.
//
// Forward: one warp per row. The row is read once for the statistics (twice for LayerNorm:
// mean, then the centred variance, as the CPU oracle does) and once more to write the output;
// the re-reads hit L1/L2, so DRAM sees one read of the input and one write of the output. The
// fused add writes sum = round(a + b) and normalises the rounded sum, exactly what a separate
// add followed by a norm would compute.
//
// Backward: one warp per row computes dx (two row reductions, then the elementwise formula)
// and, in the same pass, adds dout * xhat (and dout) into per-lane registers for its columns, so
// dout and x are read from device memory once. Each block owns a fixed chunk of rows; its
// warps' register partials are summed in warp order through shared memory into one f32
// partial row per chunk, and a second kernel adds the chunks' partials in chunk order into
// dweight/dbias. No float atomics, so the result is bit-reproducible. Rows too wide for the
// register partials (more than 16 vectors per lane, hidden > 4096 in bf16) use a separate
// column-partials kernel that reads dout and x a second time.
#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kRowThreads = 256;  // 8 rows (warps) per block
constexpr int kColumnThreads = 64;

template <int W, typename T, typename Wt, bool kLayer, bool kAdd>
__global__ void norm_forward_kernel(const T* a, const T* b, T* x, const Wt* weight, const Wt* bias, T* out,
                                    float* mean_out, float* rstd_out, int64_t rows, int cols, float eps,
                                    unsigned* amax_out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t base = row * cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);

  float total = 0.0f;
  for (int c = lane * W; c < cols; c += 32 * W) {
    float v[W];
    if constexpr (kAdd) {
      float va[W], vb[W];
      load<W>(a + base + c, va);
      load<W>(b + base + c, vb);
#pragma unroll
      for (int i = 0; i < W; ++i) v[i] = round_to<T>(va[i] + vb[i]);
      store<W>(x + base + c, v);
    } else {
      load<W>(x + base + c, v);
    }
#pragma unroll
    for (int i = 0; i < W; ++i) total += kLayer ? v[i] : v[i] * v[i];
  }
  total = warp_sum(total);

  float mean = 0.0f, rstd;
  if constexpr (kLayer) {
    mean = total * inv_cols;
    float centred = 0.0f;
    for (int c = lane * W; c < cols; c += 32 * W) {
      float v[W];
      load<W>(x + base + c, v);
#pragma unroll
      for (int i = 0; i < W; ++i) centred += (v[i] - mean) * (v[i] - mean);
    }
    centred = warp_sum(centred);
    rstd = 1.0f / sqrtf(centred * inv_cols + eps);
  } else {
    rstd = 1.0f / sqrtf(total * inv_cols + eps);
  }

  unsigned amax = 0;
  for (int c = lane * W; c < cols; c += 32 * W) {
    float v[W], w[W], y[W];
    load<W>(x + base + c, v);
    load<W>(weight + c, w);
    if constexpr (kLayer) {
      float bb[W];
      if (bias != nullptr) {
        load<W>(bias + c, bb);
      } else {
#pragma unroll
        for (int i = 0; i < W; ++i) bb[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < W; ++i) y[i] = (v[i] - mean) * rstd * w[i] + bb[i];
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) y[i] = v[i] * rstd * w[i];
    }
    store<W>(out + base + c, y);
#pragma unroll
    for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(y[i]));
  }
  if (lane == 0) {
    rstd_out[row] = rstd;
    if constexpr (kLayer) mean_out[row] = mean;
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);  // a row per warp: all lanes are here
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * weight
// (RMSNorm drops the mean(dxhat) term and uses xhat = x * rstd). Both backward kernels use these
// three pieces, so the plain and the fused path give the same bits.
template <int W>
__device__ __forceinline__ void add_dx_sums(const float (&d)[W], const float (&v)[W], const float (&w)[W], float mean,
                                            float rstd, float& sum_dxhat, float& sum_dxhat_xhat) {
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const float dxhat = d[i] * w[i];
    sum_dxhat += dxhat;
    sum_dxhat_xhat += dxhat * (v[i] - mean) * rstd;
  }
}

// The row's two means from each lane's partial sums (one row per warp).
template <bool kLayer>
__device__ __forceinline__ void dx_row_means(float sum_dxhat, float sum_dxhat_xhat, int cols, float& mean_dxhat,
                                             float& mean_dxhat_xhat) {
  const float inv_cols = 1.0f / static_cast<float>(cols);
  mean_dxhat = kLayer ? warp_sum(sum_dxhat) * inv_cols : 0.0f;
  mean_dxhat_xhat = warp_sum(sum_dxhat_xhat) * inv_cols;
}

__device__ __forceinline__ float dx_value(float d, float w, float xhat, float rstd, float mean_dxhat,
                                          float mean_dxhat_xhat) {
  return rstd * (d * w - mean_dxhat - xhat * mean_dxhat_xhat);
}

template <int W, typename T, typename Wt, bool kLayer>
__global__ void norm_backward_dx_kernel(const T* dout, const T* x, const Wt* weight, const float* mean_in,
                                        const float* rstd_in, T* dx, int64_t rows, int cols, bool accumulate,
                                        unsigned* amax_out) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t base = row * cols;
  const float mean = kLayer ? mean_in[row] : 0.0f;
  const float rstd = rstd_in[row];

  float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
  for (int c = lane * W; c < cols; c += 32 * W) {
    float d[W], v[W], w[W];
    load<W>(dout + base + c, d);
    load<W>(x + base + c, v);
    load<W>(weight + c, w);
    add_dx_sums<W>(d, v, w, mean, rstd, sum_dxhat, sum_dxhat_xhat);
  }
  float mean_dxhat, mean_dxhat_xhat;
  dx_row_means<kLayer>(sum_dxhat, sum_dxhat_xhat, cols, mean_dxhat, mean_dxhat_xhat);

  unsigned amax = 0;
  for (int c = lane * W; c < cols; c += 32 * W) {
    float d[W], v[W], w[W], g[W];
    load<W>(dout + base + c, d);
    load<W>(x + base + c, v);
    load<W>(weight + c, w);
    if (accumulate) {
      load<W>(dx + base + c, g);
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) g[i] = 0.0f;
    }
#pragma unroll
    for (int i = 0; i < W; ++i) {
      g[i] += dx_value(d[i], w[i], (v[i] - mean) * rstd, rstd, mean_dxhat, mean_dxhat_xhat);
      amax = max(amax, abs_bits(g[i]));
    }
    store<W>(dx + base + c, g);
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);
}

// The fused backward: dx plus per-chunk partials of dweight (and dbias), K vectors per lane.
template <int W, int K, typename T, typename Wt, bool kLayer, bool kBias>
__global__ void norm_backward_fused_kernel(const T* dout, const T* x, const Wt* weight, const float* mean_in,
                                           const float* rstd_in, T* dx, float* partial_weight, float* partial_bias,
                                           int64_t rows, int cols, int64_t rows_per_chunk, bool accumulate,
                                           unsigned* amax_out) {
  extern __shared__ float warp_partials[];  // [warps][cols]
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  const int64_t chunk = blockIdx.x;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float acc_w[K][W], acc_b[K][W];
#pragma unroll
  for (int k = 0; k < K; ++k)
#pragma unroll
    for (int i = 0; i < W; ++i) acc_w[k][i] = acc_b[k][i] = 0.0f;

  unsigned amax = 0;
  for (int64_t row = begin + warp; row < end; row += warps) {
    const int64_t base = row * cols;
    const float mean = kLayer ? mean_in[row] : 0.0f;
    const float rstd = rstd_in[row];
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * W;
      if (c >= cols) break;
      float d[W], v[W], w[W];
      load<W>(dout + base + c, d);
      load<W>(x + base + c, v);
      load<W>(weight + c, w);
      add_dx_sums<W>(d, v, w, mean, rstd, sum_dxhat, sum_dxhat_xhat);
    }
    float mean_dxhat, mean_dxhat_xhat;
    dx_row_means<kLayer>(sum_dxhat, sum_dxhat_xhat, cols, mean_dxhat, mean_dxhat_xhat);
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * W;
      if (c >= cols) break;
      float d[W], v[W], w[W], g[W];
      load<W>(dout + base + c, d);
      load<W>(x + base + c, v);
      load<W>(weight + c, w);
      if (accumulate) {
        load<W>(dx + base + c, g);
      } else {
#pragma unroll
        for (int i = 0; i < W; ++i) g[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float xhat = (v[i] - mean) * rstd;
        g[i] += dx_value(d[i], w[i], xhat, rstd, mean_dxhat, mean_dxhat_xhat);
        acc_w[k][i] += d[i] * xhat;
        if constexpr (kBias) acc_b[k][i] += d[i];
        amax = max(amax, abs_bits(g[i]));
      }
      store<W>(dx + base + c, g);
    }
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);

  // Warp partials -> one partial row per chunk, summed in warp order.
  auto publish = [&](float (&acc)[K][W], float* out) {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * W;
      if (c < cols) {
#pragma unroll
        for (int i = 0; i < W; ++i) warp_partials[warp * cols + c + i] = acc[k][i];
      }
    }
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      float total = 0.0f;
      for (int w = 0; w < warps; ++w) total += warp_partials[w * cols + c];
      out[chunk * cols + c] = total;
    }
    __syncthreads();
  };
  publish(acc_w, partial_weight);
  if constexpr (kBias) publish(acc_b, partial_bias);
}

// partial_weight[chunk, c] = sum over the chunk's rows of dout * xhat; partial_bias likewise of dout.
template <int W, typename T, bool kLayer, bool kBias>
__global__ void norm_backward_partials_kernel(const T* dout, const T* x, const float* mean_in, const float* rstd_in,
                                              float* partial_weight, float* partial_bias, int64_t rows, int cols,
                                              int64_t rows_per_chunk) {
  const int c = (blockIdx.x * blockDim.x + threadIdx.x) * W;
  if (c >= cols) return;
  const int64_t chunk = blockIdx.y;
  const int64_t begin = chunk * rows_per_chunk;
  const int64_t end = min(rows, begin + rows_per_chunk);
  float acc_w[W], acc_b[W];
#pragma unroll
  for (int i = 0; i < W; ++i) acc_w[i] = acc_b[i] = 0.0f;
#pragma unroll 4
  for (int64_t r = begin; r < end; ++r) {
    float d[W], v[W];
    load<W>(dout + r * cols + c, d);
    load<W>(x + r * cols + c, v);
    const float mean = kLayer ? mean_in[r] : 0.0f;
    const float rstd = rstd_in[r];
#pragma unroll
    for (int i = 0; i < W; ++i) {
      acc_w[i] += d[i] * (v[i] - mean) * rstd;
      if constexpr (kBias) acc_b[i] += d[i];
    }
  }
  store<W>(partial_weight + chunk * cols + c, acc_w);
  if constexpr (kBias) store<W>(partial_bias + chunk * cols + c, acc_b);
}

template <typename T, typename Wt>
void launch_forward(NormKind kind, bool fused_add, bool vector, const Tensor& a, const Tensor& b, const Tensor& x,
                    const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& mean,
                    const Tensor& rstd, float eps, unsigned* amax, cudaStream_t stream) {
  const int64_t rows = x.rows();
  const int cols = static_cast<int>(x.cols());
  const unsigned blocks = blocks_for(rows, kRowThreads / 32);
  auto go = [&](auto width, auto layer, auto fused) {
    constexpr int W = decltype(width)::value;
    constexpr bool kLayer = decltype(layer)::value;
    constexpr bool kAdd = decltype(fused)::value;
    norm_forward_kernel<W, T, Wt, kLayer, kAdd><<<blocks, kRowThreads, 0, stream>>>(
        data_or_null<const T>(a), data_or_null<const T>(b), static_cast<T*>(x.data),
        static_cast<const Wt*>(weight.data), data_or_null<const Wt>(bias), static_cast<T*>(out.data),
        data_or_null<float>(mean), static_cast<float*>(rstd.data), rows, cols, eps, amax);
  };
  using V8 = std::integral_constant<int, 8>;
  using V1 = std::integral_constant<int, 1>;
  using Yes = std::true_type;
  using No = std::false_type;
  const bool layer = kind == NormKind::layer;
  if (vector) {
    if (layer) fused_add ? go(V8{}, Yes{}, Yes{}) : go(V8{}, Yes{}, No{});
    else fused_add ? go(V8{}, No{}, Yes{}) : go(V8{}, No{}, No{});
  } else {
    if (layer) fused_add ? go(V1{}, Yes{}, Yes{}) : go(V1{}, Yes{}, No{});
    else fused_add ? go(V1{}, No{}, Yes{}) : go(V1{}, No{}, No{});
  }
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T, typename Wt>
void launch_backward_dx(NormKind kind, bool vector, const Tensor& dout, const Tensor& x, const Tensor& weight,
                        const Tensor& mean, const Tensor& rstd, const Tensor& dx, bool accumulate,
                        unsigned* amax, cudaStream_t stream) {
  const int64_t rows = x.rows();
  const int cols = static_cast<int>(x.cols());
  const unsigned blocks = blocks_for(rows, kRowThreads / 32);
  auto go = [&](auto width, auto layer) {
    constexpr int W = decltype(width)::value;
    constexpr bool kLayer = decltype(layer)::value;
    norm_backward_dx_kernel<W, T, Wt, kLayer><<<blocks, kRowThreads, 0, stream>>>(
        static_cast<const T*>(dout.data), static_cast<const T*>(x.data), static_cast<const Wt*>(weight.data),
        data_or_null<const float>(mean), static_cast<const float*>(rstd.data), static_cast<T*>(dx.data), rows, cols,
        accumulate, amax);
  };
  using V8 = std::integral_constant<int, 8>;
  using V1 = std::integral_constant<int, 1>;
  const bool layer = kind == NormKind::layer;
  if (vector) layer ? go(V8{}, std::true_type{}) : go(V8{}, std::false_type{});
  else layer ? go(V1{}, std::true_type{}) : go(V1{}, std::false_type{});
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
void launch_backward_partials(NormKind kind, bool vector, bool with_bias, const Tensor& dout, const Tensor& x,
                              const Tensor& mean, const Tensor& rstd, float* partial_weight, float* partial_bias,
                              int64_t chunks, cudaStream_t stream) {
  const int64_t rows = x.rows();
  const int cols = static_cast<int>(x.cols());
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  auto go = [&](auto width, auto layer, auto has_bias) {
    constexpr int W = decltype(width)::value;
    constexpr bool kLayer = decltype(layer)::value;
    constexpr bool kBias = decltype(has_bias)::value;
    dim3 grid(blocks_for(cols / W, kColumnThreads), static_cast<unsigned>(chunks));
    norm_backward_partials_kernel<W, T, kLayer, kBias><<<grid, kColumnThreads, 0, stream>>>(
        static_cast<const T*>(dout.data), static_cast<const T*>(x.data), data_or_null<const float>(mean),
        static_cast<const float*>(rstd.data), partial_weight, partial_bias, rows, cols, rows_per_chunk);
  };
  using V8 = std::integral_constant<int, 8>;
  using V1 = std::integral_constant<int, 1>;
  using Yes = std::true_type;
  using No = std::false_type;
  const bool layer = kind == NormKind::layer;
  if (vector) {
    if (layer) with_bias ? go(V8{}, Yes{}, Yes{}) : go(V8{}, Yes{}, No{});
    else go(V8{}, No{}, No{});
  } else {
    if (layer) with_bias ? go(V1{}, Yes{}, Yes{}) : go(V1{}, Yes{}, No{});
    else go(V1{}, No{}, No{});
  }
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

constexpr int kFusedWarps = 4;

// Rows per chunk of the fused backward: enough chunks (about 1024) to fill the GPU with
// kFusedWarps warps each, at least 16 rows per chunk; a function of the row count only.
int64_t fused_chunks(int64_t rows) {
  const int64_t rows_per_chunk = std::max<int64_t>(16, (rows + 1023) / 1024);
  return (rows + rows_per_chunk - 1) / rows_per_chunk;
}

// Vectors per lane the fused kernel needs for `cols`, rounded up to 4, 8 or 16; 0 = too wide.
int fused_vectors_per_lane(int64_t cols, int width) {
  const int64_t needed = (cols / width + 31) / 32;
  if (needed <= 4) return 4;
  if (needed <= 8) return 8;
  if (needed <= 16) return 16;
  return 0;
}

template <typename T, typename Wt>
void launch_backward_fused(NormKind kind, bool vector, bool with_bias, int lanes_k, const Tensor& dout,
                           const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, bool accumulate, float* partial_weight, float* partial_bias,
                           int64_t chunks, unsigned* amax, cudaStream_t stream) {
  const int64_t rows = x.rows();
  const int cols = static_cast<int>(x.cols());
  const int64_t rows_per_chunk = (rows + chunks - 1) / chunks;
  const size_t shared_bytes = static_cast<size_t>(kFusedWarps) * cols * sizeof(float);
  auto go = [&](auto width, auto vectors, auto layer, auto has_bias) {
    constexpr int W = decltype(width)::value;
    constexpr int K = decltype(vectors)::value;
    constexpr bool kLayer = decltype(layer)::value;
    constexpr bool kBias = decltype(has_bias)::value;
    auto kernel = norm_backward_fused_kernel<W, K, T, Wt, kLayer, kBias>;
    if (shared_bytes > 48 * 1024)
      MXTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(shared_bytes)));
    kernel<<<static_cast<unsigned>(chunks), kFusedWarps * 32, shared_bytes, stream>>>(
        static_cast<const T*>(dout.data), static_cast<const T*>(x.data), static_cast<const Wt*>(weight.data),
        data_or_null<const float>(mean), static_cast<const float*>(rstd.data), static_cast<T*>(dx.data),
        partial_weight, partial_bias, rows, cols, rows_per_chunk, accumulate, amax);
  };
  using V8 = std::integral_constant<int, 8>;
  using V1 = std::integral_constant<int, 1>;
  using K4 = std::integral_constant<int, 4>;
  using K8 = std::integral_constant<int, 8>;
  using K16 = std::integral_constant<int, 16>;
  using Yes = std::true_type;
  using No = std::false_type;
  auto with_k = [&](auto width, auto layer, auto has_bias) {
    if (lanes_k == 4) {
      go(width, K4{}, layer, has_bias);
    } else if (lanes_k == 8) {
      go(width, K8{}, layer, has_bias);
    } else if constexpr (!decltype(has_bias)::value) {
      go(width, K16{}, layer, has_bias);  // with a bias, 16 would spill: norm_backward never asks
    }
  };
  const bool layer = kind == NormKind::layer;
  if (vector) {
    if (layer) with_bias ? with_k(V8{}, Yes{}, Yes{}) : with_k(V8{}, Yes{}, No{});
    else with_k(V8{}, No{}, No{});
  } else {
    if (layer) with_bias ? with_k(V1{}, Yes{}, Yes{}) : with_k(V1{}, Yes{}, No{});
    else with_k(V1{}, No{}, No{});
  }
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

void require_activation_dtypes(const char* op, std::initializer_list<const Tensor*> tensors) {
  DType first = (*tensors.begin())->dtype;
  for (const Tensor* t : tensors)
    if (t->defined() && t->dtype != first)
      throw Error(ErrorKind::unsupported, strf("cuda %s: activations must share one dtype, got %s and %s", op,
                                               std::string(dtype_name(first)).c_str(),
                                               std::string(dtype_name(t->dtype)).c_str()),
                  "pass activations of the model's activation dtype");
}

}  // namespace

void norm_forward(NormKind kind, const Tensor& a, const Tensor& b, const Tensor& x, const Tensor& weight,
                  const Tensor& bias, const Tensor& out, const Tensor& mean, const Tensor& rstd, float eps,
                  const Tensor& out_amax, cudaStream_t stream) {
  const bool fused_add = a.defined();
  require_activation_dtypes("norm_forward", {&x, &out, &a, &b});
  MXTRAIN_ASSERT(rstd.dtype == DType::f32 && (!mean.defined() || mean.dtype == DType::f32),
                 "norm statistics must be f32");
  MXTRAIN_ASSERT(!bias.defined() || bias.dtype == weight.dtype, "norm bias and weight dtypes differ");
  unsigned* amax = start_amax_record(out_amax, stream);
  if (x.numel() == 0) return;
  const bool vector = x.cols() % 8 == 0 && aligned16(x) && aligned16(out) && aligned16(a) && aligned16(b) &&
                      aligned16(weight) && aligned16(bias);
  dispatch_float<true>(x.dtype, "norm_forward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float<true>(weight.dtype, "norm_forward (weight)", [&](auto weight_tag) {
      using Wt = decltype(weight_tag);
      launch_forward<T, Wt>(kind, fused_add, vector, a, b, x, weight, bias, out, mean, rstd, eps, amax, stream);
    });
  });
}

void norm_backward(Backend& backend, NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                   const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                   const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams, const Tensor& dx_amax,
                   cudaStream_t stream) {
  require_activation_dtypes("norm_backward", {&x, &dout, &dx});
  unsigned* amax = start_amax_record(dx_amax, stream);
  if (x.numel() == 0) {
    if (!accumulate_dparams && dweight.defined()) fill(dweight, 0.0f, stream);
    if (!accumulate_dparams && dbias.defined()) fill(dbias, 0.0f, stream);
    return;
  }
  const int64_t rows = x.rows(), cols = x.cols();
  const bool layer = kind == NormKind::layer;
  const bool with_bias = layer && dbias.defined();
  const bool vector = cols % 8 == 0 && aligned16(x) && aligned16(dout) && aligned16(dx) && aligned16(weight);
  const int lanes_k = fused_vectors_per_lane(cols, vector ? 8 : 1);
  const size_t fused_shared = static_cast<size_t>(kFusedWarps) * static_cast<size_t>(cols) * sizeof(float);
  // Layer norm with a bias gradient keeps two register partials per column: at 16 vectors per
  // lane that would spill, so those shapes take the two-kernel path.
  const bool fused = dweight.defined() && lanes_k > 0 && fused_shared <= 96 * 1024 && !(with_bias && lanes_k > 8);
  if (fused) {
    const int64_t chunks = fused_chunks(rows);
    Buffer partials = backend.allocate("norm_backward.partials", Shape{with_bias ? 2 * chunks : chunks, cols},
                                       DType::f32, Lifetime::scratch);
    float* partial_weight = partials.tensor().ptr<float>();
    float* partial_bias = with_bias ? partial_weight + chunks * cols : nullptr;
    dispatch_float<true>(x.dtype, "norm_backward", [&](auto tag) {
      using T = decltype(tag);
      dispatch_float<true>(weight.dtype, "norm_backward (weight)", [&](auto weight_tag) {
        using Wt = decltype(weight_tag);
        launch_backward_fused<T, Wt>(kind, vector, with_bias, lanes_k, dout, x, weight, mean, rstd, dx,
                                     accumulate_dx, partial_weight, partial_bias, chunks, amax, stream);
      });
    });
    reduce_column_partials(partial_weight, chunks, dweight, accumulate_dparams, stream);
    if (with_bias) reduce_column_partials(partial_bias, chunks, dbias, accumulate_dparams, stream);
    return;
  }
  dispatch_float<true>(x.dtype, "norm_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float<true>(weight.dtype, "norm_backward (weight)", [&](auto weight_tag) {
      using Wt = decltype(weight_tag);
      launch_backward_dx<T, Wt>(kind, vector, dout, x, weight, mean, rstd, dx, accumulate_dx, amax, stream);
    });
  });
  if (!dweight.defined()) return;
  const int64_t chunks = column_reduction_chunks(rows);
  Buffer partials = backend.allocate("norm_backward.partials", Shape{with_bias ? 2 * chunks : chunks, cols},
                                     DType::f32, Lifetime::scratch);
  float* partial_weight = partials.tensor().ptr<float>();
  float* partial_bias = with_bias ? partial_weight + chunks * cols : nullptr;
  dispatch_float<true>(x.dtype, "norm_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_backward_partials<T>(kind, vector, with_bias, dout, x, mean, rstd, partial_weight, partial_bias, chunks,
                                stream);
  });
  reduce_column_partials(partial_weight, chunks, dweight, accumulate_dparams, stream);
  if (with_bias) reduce_column_partials(partial_bias, chunks, dbias, accumulate_dparams, stream);
}

}  // namespace mxtrain::cuda_kernels
