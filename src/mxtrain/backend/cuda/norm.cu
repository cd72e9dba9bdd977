// RMSNorm and LayerNorm, forward (optionally fused with the residual add) and backward.
//
// Forward: one warp per row. The row is read once for the statistics (twice for LayerNorm:
// mean, then the centred variance, as the CPU oracle does) and once more to write the output;
// the re-reads hit L1/L2, so DRAM sees one read of the input and one write of the output. Rows
// of at most 4096 16-bit values stay in registers instead (norm_forward_held_kernel: all of a
// row's loads in flight at once; same sums in the same order). The fused add writes
// sum = round(a + b) and normalises the rounded sum, exactly what a separate add followed by a
// norm would compute.
//
// Backward: one warp per row computes dx (two row reductions, then the elementwise formula)
// and, in the same pass, adds dout * xhat (and dout) into the warp's own row of shared memory,
// so dout and x are read from device memory once (for hidden <= 2048 in bf16 the row stays in
// registers between the passes: one memory round trip per row). Each block owns a fixed chunk
// of rows; its warps' rows are summed in warp order into one f32 partial row per chunk, and a
// second kernel adds the chunks' partials in chunk order into dweight/dbias. No float atomics,
// so the result is bit-reproducible. 16-bit rows of 2049-4096 columns, and a LayerNorm's of
// 1025-2048, are split over a pair of warps, each holding its part in registers like a row of at
// most 2048 (1024) columns; the pair adds its halves of the two row sums through shared memory.
// Rows too wide for the fused kernel (more than 16 vectors per lane, hidden > 4096 in bf16, or
// over 96 KB of shared rows) use a separate column-partials kernel that reads dout and x a second
// time.
#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kRowThreads = 256;  // 8 rows (warps) per block
constexpr int kColumnThreads = 64;
constexpr int kFusedWarps = private_buffers::kNormFusedWarps;  // the fused backward's block: a row per warp at a time

// The fused backward's per-warp rows of column sums in shared memory. Lane `lane`'s vector k
// holds columns (k * 32 + lane) * W + [0, W). For W = 8 the two 4-float halves of that vector are
// stored lane-interleaved: half h at ((k * 2 + h) * 32 + lane) * 4, so a warp's 16-byte accesses
// cover 512 contiguous bytes (no bank conflicts; lane-contiguous 32-byte vectors conflicted
// 5-way in ncu, and the norm backward took 9.56 against 9.33 ms a step of gpt2-1.5b, 4.41
// against 4.28 of llama-1b, on an H200). A row holds shared_row_floats(cols) floats.
template <int W> __host__ __device__ constexpr int64_t shared_row_floats(int64_t cols) {
  return private_buffers::norm_fused_row_floats(cols, W == 8);
}
template <int W> __device__ __forceinline__ int64_t shared_slot(int64_t c) {
  if constexpr (W == 1) {
    return c;
  } else {
    return ((c / 256 * 2 + c % 8 / 4) * 32 + c / 8 % 32) * 4 + c % 4;
  }
}

// row[vector k of this lane] += v (layout above).
template <int W> __device__ __forceinline__ void add_to_shared(float* row, int k, int lane, const float (&v)[W]) {
  if constexpr (W == 1) {
    row[k * 32 + lane] += v[0];
  } else {
    float4* p0 = reinterpret_cast<float4*>(row + ((k * 2) * 32 + lane) * 4);
    float4* p1 = reinterpret_cast<float4*>(row + ((k * 2 + 1) * 32 + lane) * 4);
    float4 a = *p0, b = *p1;
    a.x += v[0]; a.y += v[1]; a.z += v[2]; a.w += v[3];
    b.x += v[4]; b.y += v[5]; b.z += v[6]; b.w += v[7];
    *p0 = a;
    *p1 = b;
  }
}

// A W-wide vector of E as loaded (16-byte accesses for W = 8: one for a 2-byte E, two for
// float), widened to floats where it is used. The held-row kernels keep a row's vectors in arrays
// of these, the fused backward a few more as a ring of loads issued vectors ahead of their use;
// the indices are compile-time (unrolled loops), so both live in registers.
template <int W, typename E> struct RawVec;
template <typename E> struct RawVec<1, E> {
  E value;
  __device__ __forceinline__ void load(const E* p) { value = *p; }
  __device__ __forceinline__ void widen(float (&v)[1]) const { v[0] = to_float<E>(value); }
};
template <typename E> struct RawVec<8, E> {
  static constexpr int kWords = static_cast<int>(sizeof(E)) / 2;
  uint4 words[kWords];
  __device__ __forceinline__ void load(const E* p) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) words[i] = reinterpret_cast<const uint4*>(p)[i];
  }
  __device__ __forceinline__ void widen(float (&v)[8]) const {
    const E* e = reinterpret_cast<const E*>(words);
#pragma unroll
    for (int i = 0; i < 8; ++i) v[i] = to_float<E>(e[i]);
  }
};

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

  if (lane == 0) {
    rstd_out[row] = rstd;
    if constexpr (kLayer) mean_out[row] = mean;
  }
  if (out == nullptr) return;  // statistics only (and the sum): a cast computes the output (CastFromNorm)
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
      for (int i = 0; i < W; ++i) y[i] = layer_norm_value(v[i], mean, rstd, w[i], bb[i]);
    } else {
#pragma unroll
      for (int i = 0; i < W; ++i) y[i] = rms_norm_value(v[i], rstd, w[i]);
    }
    store<W>(out + base + c, y);
    if (amax_out != nullptr) {
#pragma unroll
      for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(y[i]));
    }
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);  // a row per warp: all lanes are here
}

// The forward for rows of at most 32 * 8 * K 16-bit values (K <= 16: hidden <= 4096): each lane
// loads its K vectors of the row (of a and b, for the fused add) back to back and keeps them in
// registers, so a row costs one memory round trip instead of a dependent load per vector; the
// sums run in the generic kernel's order (vector by vector, element by element), so both give
// the same bits.
template <int K, typename T, typename Wt, bool kLayer, bool kAdd>
__global__ void norm_forward_held_kernel(const T* a, const T* b, T* x, const Wt* weight, const Wt* bias, T* out,
                                         float* mean_out, float* rstd_out, int64_t rows, int cols, float eps,
                                         unsigned* amax_out) {
  static_assert(sizeof(T) == 2, "16-bit rows");
  const int64_t row = static_cast<int64_t>(blockIdx.x) * (blockDim.x / 32) + threadIdx.x / 32;
  if (row >= rows) return;
  const int lane = threadIdx.x % 32;
  const int64_t base = row * cols;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  RawVec<8, T> held[K];  // the row's values as stored (the rounded sum, for the fused add)
  if constexpr (kAdd) {
    RawVec<8, T> held_b[K];
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * 8;
      if (c < cols) {
        held[k].load(a + base + c);
        held_b[k].load(b + base + c);
      }
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * 8;
      if (c < cols) {
        float va[8], vb[8], v[8];
        held[k].widen(va);
        held_b[k].widen(vb);
#pragma unroll
        for (int i = 0; i < 8; ++i) v[i] = va[i] + vb[i];
        store<8>(x + base + c, v);  // rounds to T
        store<8>(reinterpret_cast<T*>(held[k].words), v);
      }
    }
  } else {
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * 8;
      if (c < cols) held[k].load(x + base + c);
    }
  }
  // Σ term(v) over the row's held values, in the generic kernel's order, summed over the warp.
  auto row_sum = [&](auto term) {
    float sum = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      if ((k * 32 + lane) * 8 >= cols) break;
      float v[8];
      held[k].widen(v);
#pragma unroll
      for (int i = 0; i < 8; ++i) sum += term(v[i]);
    }
    return warp_sum(sum);
  };
  const float total = row_sum([](float v) { return kLayer ? v : v * v; });
  float mean = 0.0f, rstd;
  if constexpr (kLayer) {
    mean = total * inv_cols;
    const float centred = row_sum([mean](float v) { return (v - mean) * (v - mean); });
    rstd = 1.0f / sqrtf(centred * inv_cols + eps);
  } else {
    rstd = 1.0f / sqrtf(total * inv_cols + eps);
  }
  if (lane == 0) {
    rstd_out[row] = rstd;
    if constexpr (kLayer) mean_out[row] = mean;
  }
  if (out == nullptr) return;  // statistics only (and the sum): a cast computes the output (CastFromNorm)
  unsigned amax = 0;
#pragma unroll
  for (int k = 0; k < K; ++k) {
    const int c = (k * 32 + lane) * 8;
    if (c >= cols) break;
    float v[8], w[8], y[8];
    held[k].widen(v);
    load<8>(weight + c, w);
    if constexpr (kLayer) {
      float bb[8];
      if (bias != nullptr) {
        load<8>(bias + c, bb);
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) bb[i] = 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = layer_norm_value(v[i], mean, rstd, w[i], bb[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) y[i] = rms_norm_value(v[i], rstd, w[i]);
    }
    store<8>(out + base + c, y);
    if (amax_out != nullptr) {
#pragma unroll
      for (int i = 0; i < 8; ++i) amax = max(amax, abs_bits(y[i]));
    }
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);
}

// dx = rstd * (dxhat - mean(dxhat) - xhat * mean(dxhat * xhat)), dxhat = dout * weight
// (RMSNorm drops the mean(dxhat) term and uses xhat = x * rstd). Both backward kernels use these
// three pieces, so the plain and the fused path give the same bits (but for a row the fused kernel
// splits over a pair of warps, which the plain kernel never takes).
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

// The row's two means from each lane's partial sums (one row per warp). inv_cols = 1.0f / cols,
// IEEE-rounded, passed in by the launch: a division here cost the fused kernel a register it
// spilled.
template <bool kLayer>
__device__ __forceinline__ void dx_row_means(float sum_dxhat, float sum_dxhat_xhat, float inv_cols, float& mean_dxhat,
                                             float& mean_dxhat_xhat) {
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
  dx_row_means<kLayer>(sum_dxhat, sum_dxhat_xhat, 1.0f / static_cast<float>(cols), mean_dxhat, mean_dxhat_xhat);

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
    for (int i = 0; i < W; ++i) g[i] += dx_value(d[i], w[i], (v[i] - mean) * rstd, rstd, mean_dxhat, mean_dxhat_xhat);
    store<W>(dx + base + c, g);
    if (amax_out != nullptr) {
#pragma unroll
      for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(g[i]));
    }
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);
}

// The fused backward: dx plus per-chunk partials of dweight (and dbias), K vectors per lane.
// With 16-byte vectors of a 2-byte type and K <= 8 (kHold: hidden <= 2048 in bf16) the first
// pass keeps the row's dout, x and (kHoldDx, when accumulating) dx in registers as loaded, so a
// row costs one round trip to memory; wider rows re-read dout and x in the second pass. Each
// warp adds its rows' dout * xhat (and dout) into its own shared-memory row, in row order; the
// block then sums its warps' rows in warp order into one partial row per chunk.
// Without dx's column sums the kernel is held to 128 registers, four blocks (16 warps) an SM:
// for llama-1b's rows (8 vectors a lane) its time in a step fell from 4.33 to 3.87 ms (CUPTI,
// H200); at 165 registers only 12 warps fit. Its loop bounds are 32-bit and 1 / cols comes from
// the launch, so at 128 registers it spills nothing (it spilled 20 bytes before: one launch
// 82.1 -> 77.0 us in ncu, 3.86 -> 3.63 ms a step in CUPTI). A LayerNorm's 8-vector rows (its
// mean, and with a bias a second row of sums, live beside the held row) fit 128 registers only
// by loading the incoming dx in the second pass instead of holding it (kHoldDx; held, the bias
// variant took 168 registers, three blocks an SM, and GPT-2 1.5B's 512 chunks 1.3 waves); that
// costs a row several memory latencies, so 16-bit LayerNorm rows of 5-8 vectors a lane now run
// split (below) and only split halves of 2049-4096-column rows keep the 8-vector form.
// kDx: dx's column sums as it comes in and as it leaves (DxColumnSums; accumulate is then set),
// two more rows of sums a warp, into partial_dx [2][chunks][cols]; their shared rows allow at
// most two blocks an SM, so that variant is not held to 128 registers. Asking L2 for each warp's
// next row as it starts one (prefetch.global.L2) made it a quarter slower on an H100
// (bench/results/h100_norm_prefetch_tried_6c7b8aa.md). kPair: the row split over a pair of
// warps, K vectors a lane each (held; private_buffers::norm_split_columns): the 16-vector
// variant re-reads its row from memory in the second pass and ran at 1.7-1.9 TB/s on an H100
// at Llama-3B's rows, split 2.3 TB/s (bench/results/h100_norm_split_5755cdd.md). A LayerNorm's
// rows of 1025-2048 columns split into halves of 4 vectors a lane, which hold the incoming dx
// too (GPT-2 1.5B's rows in a step on an H100: 90 -> 83 us a launch;
// bench/results/h100_norm_layer_split_61b8e5c.md).
template <int W, int K, typename T, typename Wt, bool kLayer, bool kBias, bool kDx, bool kPair>
__global__ void __launch_bounds__(kFusedWarps * 32, kDx ? 1 : 4)
norm_backward_fused_kernel(const T* dout, const T* x, const Wt* weight, const float* mean_in, const float* rstd_in,
                           T* dx, float* partial_weight, float* partial_bias, float* partial_dx, int64_t rows,
                           int cols, float inv_cols, int rows_per_chunk, int row_floats, int split, bool accumulate,
                           unsigned* amax_out) {
  constexpr bool kHold = W == 8 && sizeof(T) == 2 && K <= 8;
  constexpr int kHeld = kHold ? K : 1;
  constexpr bool kHoldDx = K <= 4 || !kLayer || kDx;  // otherwise the second pass loads dx
  // How far ahead of its use a vector's load goes (below), as far as the 128 registers allow
  // without spilling (ptxas -v): a fully held row leaves no room for the weight's ring (the
  // 8-vector RMSNorm spilled 316 bytes with it), so that one loads its weight where it is used.
  constexpr int kAhead = sizeof(T) > 2 ? 1 : kHold ? 2 : 4;
  constexpr int kAheadW = kHold && (kHoldDx || sizeof(Wt) > 2) ? 0 : 1;
  constexpr int kSums = (kBias ? 2 : 1) + (kDx ? 2 : 0);
  constexpr int kDxRow = kBias ? 2 : 1;  // the first of dx's two rows
  constexpr int warps = kFusedWarps;
  static_assert(!kPair || (kHold && !kDx), "split rows are held halves without dx's column sums");
  // [warps][kSums][row]: dweight's row, then dbias's, then dx's in and out; split rows then the
  // pairs' exchange of row sums [2][warps / 2][2][2]
  extern __shared__ float warp_partials[];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  // kPair (private_buffers::norm_split_columns): warps 2p and 2p + 1 take the chunk's rows p,
  // p + warps / 2, ... together, the first their columns [0, split), the second [split, cols)
  // (its operands' pointers moved to that column, `width` columns of each row); otherwise a
  // warp takes whole rows warp, warp + warps, ...
  const int half = kPair ? warp % 2 : 0, pair = warp / 2;
  const int first_row = kPair ? pair : warp, row_step = kPair ? warps / 2 : warps;
  const int width = kPair ? (half == 0 ? split : cols - split) : cols;
  if constexpr (kPair) {
    dout += half * split;
    x += half * split;
    weight += half * split;
    dx += half * split;
  }
  const int64_t chunk = blockIdx.x;
  const int64_t begin = chunk * rows_per_chunk;
  // The chunk's rows in 32-bit (at most rows_per_chunk): with a 64-bit bound and 1 / cols held
  // across the row loop, the 8-vector RMSNorm kernel spilled both at its 128-register cap and
  // reloaded them from L2 at every row (a fifth of its stall samples in ncu, H200).
  const int count = static_cast<int>(min(rows - begin, static_cast<int64_t>(rows_per_chunk)));
  float* sum_w = warp_partials + static_cast<int64_t>(warp) * kSums * row_floats;
  float* sum_b = sum_w + row_floats;
  float* sum_in = sum_w + kDxRow * row_floats;
  float* sum_out = sum_in + row_floats;
  for (int64_t c = lane; c < kSums * row_floats; c += 32) sum_w[c] = 0.0f;  // the warp's own rows
  __syncwarp();

  unsigned amax = 0;
  for (int r = first_row; r < count; r += row_step) {
    const int64_t row = begin + r;
    const int64_t base = row * cols;
    const float mean = kLayer ? mean_in[row] : 0.0f;
    const float rstd = rstd_in[row];
    RawVec<W, T> held_d[kHeld], held_x[kHeld], held_g[kHoldDx ? kHeld : 1];
    if constexpr (kHold) {
      // All of the row's loads first, then the math: one memory latency per row.
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const int c = (k * 32 + lane) * W;
        if (c < width) {
          held_d[k].load(dout + base + c);
          held_x[k].load(x + base + c);
          if (kHoldDx && accumulate) held_g[k].load(dx + base + c);
        }
      }
    }
    // Every other load of the row is issued ahead of its use from a ring: the norm weight one
    // vector ahead (an L1 hit), and what comes from device memory (a non-held row's dout and x,
    // the incoming dx where it is not held) kAhead vectors ahead. Loaded where it was used, each
    // vector waited for its own load (in the SASS, every load sat behind the previous vector's
    // branch). The arithmetic is the same, so are the bits. CUPTI, H100, the kernel's time in a
    // step: llama-3b fp8 (3072 columns, 12 vectors a lane of the 16-vector variant) 7.33 ->
    // 5.95 ms, gpt2-1.5b (held LayerNorm, the incoming dx in the ring) 9.09 -> 8.90 ms
    // (bench/results/h100_norm_rings_4325add.md).
    RawVec<W, T> ring_d[kAhead], ring_x[kAhead], ring_g[kAhead];
    constexpr int kRingW = kAheadW > 0 ? kAheadW : 1;
    RawVec<W, Wt> ring_w[kRingW];
    auto fetch_weight = [&](int k) {
      const int c = (k * 32 + lane) * W;
      if (kAheadW > 0 && k < K && c < width) ring_w[k % kRingW].load(weight + c);
    };
    // Vector k's weight, widened (from the ring, or loaded here without one).
    auto weight_at = [&](int k, float (&w)[W]) {
      if constexpr (kAheadW == 0) {
        ring_w[0].load(weight + (k * 32 + lane) * W);
      }
      ring_w[k % kRingW].widen(w);
      fetch_weight(k + kAheadW);
    };
    // first: the first pass (dout and x of a non-held row); else the second (those and dx)
    auto fetch_row = [&](int k, bool first) {
      const int c = (k * 32 + lane) * W;
      if (k < K && c < width) {
        if constexpr (!kHold) {
          ring_d[k % kAhead].load(dout + base + c);
          ring_x[k % kAhead].load(x + base + c);
        }
        if constexpr (!(kHold && kHoldDx)) {
          if (!first && accumulate) ring_g[k % kAhead].load(dx + base + c);
        }
      }
    };
#pragma unroll
    for (int k = 0; k < kAheadW; ++k) fetch_weight(k);
#pragma unroll
    for (int k = 0; k < kAhead; ++k) fetch_row(k, true);
    float sum_dxhat = 0.0f, sum_dxhat_xhat = 0.0f;
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * W;
      if (c >= width) break;
      float d[W], v[W], w[W];
      if constexpr (kHold) {
        held_d[k].widen(d);
        held_x[k].widen(v);
      } else {
        ring_d[k % kAhead].widen(d);
        ring_x[k % kAhead].widen(v);
        fetch_row(k + kAhead, true);
      }
      weight_at(k, w);
      add_dx_sums<W>(d, v, w, mean, rstd, sum_dxhat, sum_dxhat_xhat);
    }
    // The second pass's first loads go out before the row's warp reductions.
#pragma unroll
    for (int k = 0; k < kAheadW; ++k) fetch_weight(k);
#pragma unroll
    for (int k = 0; k < kAhead; ++k) fetch_row(k, false);
    float mean_dxhat, mean_dxhat_xhat;
    if constexpr (kPair) {
      // Each half's warp sums, then the pair's: the first half's plus the second's. (So a split
      // row's sums differ in order from the plain dx kernel's; that kernel never takes these
      // rows: the norm's backward requires dweight, and these rows' sums always fit the fused
      // kernel.) The slots alternate by row (r / 2 counts the pair's rows), so a warp that runs a
      // row ahead writes the other slot while its partner reads this one.
      float* exchange = warp_partials + static_cast<int64_t>(warps) * kSums * row_floats +
                        (((r / 2) % 2) * (warps / 2) + pair) * 4;
      const float a = kLayer ? warp_sum(sum_dxhat) : 0.0f, b = warp_sum(sum_dxhat_xhat);
      if (lane == 0) {
        exchange[half * 2] = a;
        exchange[half * 2 + 1] = b;
      }
      asm volatile("bar.sync %0, 64;" ::"r"(1 + pair) : "memory");  // the pair's two warps
      mean_dxhat = kLayer ? (exchange[0] + exchange[2]) * inv_cols : 0.0f;
      mean_dxhat_xhat = (exchange[1] + exchange[3]) * inv_cols;
    } else {
      dx_row_means<kLayer>(sum_dxhat, sum_dxhat_xhat, inv_cols, mean_dxhat, mean_dxhat_xhat);
    }
#pragma unroll
    for (int k = 0; k < K; ++k) {
      const int c = (k * 32 + lane) * W;
      if (c >= width) break;
      float d[W], v[W], w[W], g[W];
      if constexpr (kHold) {
        held_d[k].widen(d);
        held_x[k].widen(v);
        if (accumulate) {
          if constexpr (kHoldDx) held_g[k].widen(g);
          else ring_g[k % kAhead].widen(g);
        }
      } else {
        ring_d[k % kAhead].widen(d);
        ring_x[k % kAhead].widen(v);
        if (accumulate) ring_g[k % kAhead].widen(g);
      }
      if constexpr (!(kHold && kHoldDx)) fetch_row(k + kAhead, false);
      if (!accumulate) {
#pragma unroll
        for (int i = 0; i < W; ++i) g[i] = 0.0f;
      }
      weight_at(k, w);
      if constexpr (kDx) add_to_shared<W>(sum_in, k, lane, g);
      float pw[W], pb[W];
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const float xhat = (v[i] - mean) * rstd;
        g[i] += dx_value(d[i], w[i], xhat, rstd, mean_dxhat, mean_dxhat_xhat);
        pw[i] = d[i] * xhat;
        pb[i] = d[i];
      }
      store<W>(dx + base + c, g);
      add_to_shared<W>(sum_w, k, lane, pw);
      if constexpr (kBias) add_to_shared<W>(sum_b, k, lane, pb);
      if constexpr (kDx) {
        // The sum of what was stored: dx rounded to T, as a separate pass would read it.
        float stored[W];
#pragma unroll
        for (int i = 0; i < W; ++i) stored[i] = round_to<T>(g[i]);
        add_to_shared<W>(sum_out, k, lane, stored);
      }
      if (amax_out != nullptr) {
#pragma unroll
        for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(g[i]));
      }
    }
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);

  // Warp rows -> one partial row per chunk, summed in warp order (split rows: each column's
  // half, over the pairs in order).
  __syncthreads();
  for (int c = threadIdx.x; c < cols; c += blockDim.x) {
    const int h = kPair && c >= split ? 1 : 0;
    const int64_t slot = shared_slot<W>(c - h * split);
    float total[kSums] = {};
    for (int w = h; w < warps; w += kPair ? 2 : 1) {
#pragma unroll
      for (int r = 0; r < kSums; ++r) total[r] += warp_partials[(static_cast<int64_t>(w) * kSums + r) * row_floats + slot];
    }
    partial_weight[chunk * cols + c] = total[0];
    if constexpr (kBias) partial_bias[chunk * cols + c] = total[1];
    if constexpr (kDx) {
      partial_dx[chunk * cols + c] = total[kDxRow];
      partial_dx[(static_cast<int64_t>(gridDim.x) + chunk) * cols + c] = total[kDxRow + 1];
    }
  }
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
  // 16-byte vectors of a 16-bit type, 4, 8 or at most 16 per lane (hidden <= 4096), as the fused
  // backward counts them: the held-row kernel.
  const int held_k = vector && sizeof(T) == 2 ? private_buffers::norm_fused_vectors_per_lane(cols, 8) : 0;
  auto go = [&](auto width, auto layer, auto fused) {
    constexpr int W = decltype(width)::value;
    constexpr bool kLayer = decltype(layer)::value;
    constexpr bool kAdd = decltype(fused)::value;
    if constexpr (W == 8 && sizeof(T) == 2) {
      if (held_k > 0) {
        auto kernel = held_k == 4   ? norm_forward_held_kernel<4, T, Wt, kLayer, kAdd>
                      : held_k == 8 ? norm_forward_held_kernel<8, T, Wt, kLayer, kAdd>
                                    : norm_forward_held_kernel<16, T, Wt, kLayer, kAdd>;
        // 16 vectors a lane take 130-165 registers (ptxas -v; capped at 128 they spill): blocks of
        // 4 warps let 12 warps share an SM where blocks of 8 would let 8.
        const int threads = held_k == 16 ? kRowThreads / 2 : kRowThreads;
        kernel<<<blocks_for(rows, threads / 32), threads, 0, stream>>>(
            data_or_null<const T>(a), data_or_null<const T>(b), static_cast<T*>(x.data),
            static_cast<const Wt*>(weight.data), data_or_null<const Wt>(bias), static_cast<T*>(out.data),
            data_or_null<float>(mean), static_cast<float*>(rstd.data), rows, cols, eps, amax);
        return;
      }
    }
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

template <typename T, typename Wt>
void launch_backward_fused(NormKind kind, bool vector, bool with_bias, bool dx_sums, int lanes_k, int64_t split,
                           const Tensor& dout,
                           const Tensor& x, const Tensor& weight, const Tensor& mean, const Tensor& rstd,
                           const Tensor& dx, bool accumulate, float* partial_weight, float* partial_bias,
                           float* partial_dx, int64_t chunks, unsigned* amax, cudaStream_t stream) {
  const int64_t rows = x.rows();
  const int cols = static_cast<int>(x.cols());
  const int rows_per_chunk = static_cast<int>((rows + chunks - 1) / chunks);  // <= max(32, rows / 512 + 1)
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const size_t shared_bytes = private_buffers::norm_fused_shared_bytes(cols, with_bias, vector, dx_sums, split);
  // A split row's vectors a lane in its (larger) first part.
  const int half_k = split > 0 ? private_buffers::norm_fused_vectors_per_lane(split, 8) : 0;
  auto go = [&](auto width, auto vectors, auto layer, auto has_bias, auto has_dx, auto paired) {
    constexpr int W = decltype(width)::value;
    constexpr int K = decltype(vectors)::value;
    constexpr bool kLayer = decltype(layer)::value;
    constexpr bool kBias = decltype(has_bias)::value;
    constexpr bool kDx = decltype(has_dx)::value;
    constexpr bool kPair = decltype(paired)::value;
    auto kernel = norm_backward_fused_kernel<W, K, T, Wt, kLayer, kBias, kDx, kPair>;
    if (shared_bytes > 48 * 1024)
      MXTRAIN_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              static_cast<int>(shared_bytes)));
    kernel<<<static_cast<unsigned>(chunks), kFusedWarps * 32, shared_bytes, stream>>>(
        static_cast<const T*>(dout.data), static_cast<const T*>(x.data), static_cast<const Wt*>(weight.data),
        data_or_null<const float>(mean), static_cast<const float*>(rstd.data), static_cast<T*>(dx.data),
        partial_weight, partial_bias, partial_dx, rows, cols, inv_cols, rows_per_chunk,
        static_cast<int>(shared_row_floats<W>(split > 0 ? split : cols)), static_cast<int>(split), accumulate, amax);
  };
  using V8 = std::integral_constant<int, 8>;
  using V1 = std::integral_constant<int, 1>;
  using K4 = std::integral_constant<int, 4>;
  using K8 = std::integral_constant<int, 8>;
  using K16 = std::integral_constant<int, 16>;
  using Yes = std::true_type;
  using No = std::false_type;
  auto with_k = [&](auto width, auto layer, auto has_bias) {
    // dx's column sums are built for 8-wide 16-bit rows of at most 8 vectors a lane with norm
    // weights of the activations' dtype (private_buffers::norm_backward decides the same).
    constexpr bool kDxBuilt = decltype(width)::value == 8 && sizeof(T) == 2 && std::is_same_v<T, Wt>;
    // Split rows (8-wide 16-bit, never with dx's sums): held halves of 8 vectors a lane for rows
    // of 2049-4096 columns, of 4 for a LayerNorm's rows of 1025-2048 columns. Every 16-bit row of
    // 9-16 vectors a lane, and every 16-bit LayerNorm row of 5-8, is split, so the unsplit kernels
    // are not built for them.
    constexpr bool kPairBuilt = decltype(width)::value == 8 && sizeof(T) == 2;
    if (split > 0) {
      if constexpr (kPairBuilt) {
        if constexpr (decltype(layer)::value) {
          if (half_k == 4) return go(width, K4{}, layer, has_bias, No{}, Yes{});
        }
        return go(width, K8{}, layer, has_bias, No{}, Yes{});
      }
    }
    if (lanes_k == 4) {
      if constexpr (kDxBuilt) {
        if (dx_sums) return go(width, K4{}, layer, has_bias, Yes{}, No{});
      }
      go(width, K4{}, layer, has_bias, No{}, No{});
    } else if (lanes_k == 8) {
      if constexpr (kPairBuilt && decltype(layer)::value) {
        MXTRAIN_ASSERT(false, "norm_backward: a 16-bit LayerNorm row of 1025-2048 columns planned unsplit");
      } else {
        if constexpr (kDxBuilt) {
          if (dx_sums) return go(width, K8{}, layer, has_bias, Yes{}, No{});
        }
        go(width, K8{}, layer, has_bias, No{}, No{});
      }
    } else if constexpr (kPairBuilt) {
      MXTRAIN_ASSERT(false, "norm_backward: a 16-bit row of 2049-4096 columns planned unsplit");
    } else {
      go(width, K16{}, layer, has_bias, No{}, No{});
    }
  };
  MXTRAIN_ASSERT(!dx_sums || (vector && lanes_k <= 8 && sizeof(T) == 2 && std::is_same_v<T, Wt>),
                 "norm_backward: dx column sums planned for a kernel that does not take them");
  MXTRAIN_ASSERT(split == 0 || (vector && sizeof(T) == 2 && !dx_sums && split % 8 == 0 && cols - split <= split &&
                                split < cols &&
                                ((lanes_k == 16 && split % 256 == 0) ||
                                 (lanes_k == 8 && kind == NormKind::layer && half_k == 4))),
                 "norm_backward: a split row planned for a kernel that does not take it");
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
                   const DxColumnSums& dx_sums, cudaStream_t stream) {
  require_activation_dtypes("norm_backward", {&x, &dout, &dx});
  unsigned* amax = start_amax_record(dx_amax, stream);
  if (x.numel() == 0) {
    if (!accumulate_dparams && dweight.defined()) fill(dweight, 0.0f, stream);
    if (!accumulate_dparams && dbias.defined()) fill(dbias, 0.0f, stream);
    if (!dx_sums.accumulate_in && dx_sums.in.defined()) fill(dx_sums.in, 0.0f, stream);
    if (!dx_sums.accumulate_out && dx_sums.out.defined()) fill(dx_sums.out, 0.0f, stream);
    return;
  }
  const int64_t cols = x.cols();
  // The path (fused or two kernels), its row chunks and its partials: private_buffers.hpp.
  const private_buffers::NormBackwardPlan plan =
      private_buffers::norm_backward(kind, dout, x, weight, dx, dweight, dbias, dx_sums);
  const bool with_bias = plan.with_bias, vector = plan.vector;
  const int lanes_k = plan.lanes;
  const int64_t chunks = plan.chunks;
  // dx's column sums that the fused kernel does not take: column-sum kernels before and after.
  if (!plan.dx_sums && dx_sums.in.defined()) column_sum(backend, dx, dx_sums.in, dx_sums.accumulate_in, stream);
  auto sum_out_apart = [&] {
    if (!plan.dx_sums && dx_sums.out.defined()) column_sum(backend, dx, dx_sums.out, dx_sums.accumulate_out, stream);
  };
  if (plan.fused) {
    {
      std::vector<Buffer> scratch = private_buffers::allocate_private(backend, plan.buffers);
      float* partial_weight = scratch.at(0).tensor().ptr<float>();
      float* partial_bias = with_bias ? partial_weight + chunks * cols : nullptr;
      float* partial_dx = plan.dx_sums ? partial_weight + (with_bias ? 2 : 1) * chunks * cols : nullptr;
      dispatch_float<true>(x.dtype, "norm_backward", [&](auto tag) {
        using T = decltype(tag);
        dispatch_float<true>(weight.dtype, "norm_backward (weight)", [&](auto weight_tag) {
          using Wt = decltype(weight_tag);
          launch_backward_fused<T, Wt>(kind, vector, with_bias, plan.dx_sums, lanes_k, plan.split, dout, x, weight,
                                       mean, rstd, dx, accumulate_dx, partial_weight, partial_bias, partial_dx, chunks,
                                       amax, stream);
        });
      });
      reduce_column_partials(partial_weight, chunks, dweight, accumulate_dparams, stream);
      if (with_bias) reduce_column_partials(partial_bias, chunks, dbias, accumulate_dparams, stream);
      if (plan.dx_sums) {
        reduce_column_partials(partial_dx, chunks, dx_sums.in, dx_sums.accumulate_in, stream);
        reduce_column_partials(partial_dx + chunks * cols, chunks, dx_sums.out, dx_sums.accumulate_out, stream);
      }
    }
    sum_out_apart();
    return;
  }
  dispatch_float<true>(x.dtype, "norm_backward", [&](auto tag) {
    using T = decltype(tag);
    dispatch_float<true>(weight.dtype, "norm_backward (weight)", [&](auto weight_tag) {
      using Wt = decltype(weight_tag);
      launch_backward_dx<T, Wt>(kind, vector, dout, x, weight, mean, rstd, dx, accumulate_dx, amax, stream);
    });
  });
  if (!dweight.defined()) {
    sum_out_apart();
    return;
  }
  std::vector<Buffer> scratch = private_buffers::allocate_private(backend, plan.buffers);
  float* partial_weight = scratch.at(0).tensor().ptr<float>();
  float* partial_bias = with_bias ? partial_weight + chunks * cols : nullptr;
  dispatch_float<true>(x.dtype, "norm_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_backward_partials<T>(kind, vector, with_bias, dout, x, mean, rstd, partial_weight, partial_bias, chunks,
                                stream);
  });
  reduce_column_partials(partial_weight, chunks, dweight, accumulate_dparams, stream);
  if (with_bias) reduce_column_partials(partial_bias, chunks, dbias, accumulate_dparams, stream);
  scratch.clear();
  sum_out_apart();
}

}  // namespace mxtrain::cuda_kernels
