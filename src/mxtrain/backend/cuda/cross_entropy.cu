// Softmax cross-entropy over a [rows, V] chunk of logits, in place: one block per row, an
// online max/sum pass (each thread keeps a running max and a rescaled sum, merged across the
// block), then — when a gradient is wanted — a second pass that overwrites the logits with
// grad_scale * (softmax - onehot), zero in padding columns. So full FP32 logits never exist:
// the chunk stays in the activation dtype, and device memory sees one read and one write of the
// logits. Three kernels:
//
// - Streamed (Hopper and later, 16-byte rows, two rows fit in shared memory: GPT-2's and Llama's
//   vocabularies in bf16): one persistent 1024-thread block per SM walks its rows with two row
//   buffers in shared memory, filled by bulk copies (TMA, cp.async.bulk) that one thread starts.
//   Each thread moves its columns of a row into registers, the buffer then takes the row after
//   next, and the row's max, sum and gradient run on the registers with one block reduction, so
//   two rows' reads overlap the math and the gradient writes of a third. (The one-block-per-row
//   kernel below reached 2.5 TB/s on GPT-2 124M's 8192x50304 chunks on an H200: each row's
//   loads, reductions and writes ran one after the other, with two rows per SM to hide them.)
// - Cached: one block per row; the first pass also copies the row into shared memory, so the
//   second pass reads it from there.
// - Uncached (rows too long for shared memory): the second pass reads device memory again.
// The two one-block-per-row kernels are one template sharing fold_row, row_log_sum_exp and
// write_gradient; the streamed kernel has its own row math (each thread's max and sum, merged).
// It sums in a different order, so its last bits differ from the others'; each is checked
// against the CPU oracle.
//
// Exponentials use the hardware ex2 (__expf), a third of the accurate expf's instructions: the
// kernel moved only 2.2 TB/s on GPT-2's 8192x50304 chunk on an H200 with expf, two of them per
// element. The approximation's error (a few ulp, growing with |x|) stays far inside the op's
// 1e-5 tolerance against the CPU oracle.
//
// The target logit is read before the block's first barrier (from the row buffer, in the
// streamed kernel), so the in-place gradient cannot overwrite it first. A target outside
// [0, valid_vocab) is a data bug (the CPU oracle asserts); here it makes that row's loss NaN,
// which the trainer's NaN-loss check turns into an error.
#include <type_traits>

#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

// Folds this thread's valid columns of `row` into its running max and rescaled sum; copies
// them to `copy` on the way when kCopy.
template <int W, typename T, bool kCopy>
__device__ __forceinline__ void fold_row(const T* row, T* copy, int64_t valid_vocab, float& running_max,
                                         float& running_sum) {
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < valid_vocab; c += static_cast<int64_t>(blockDim.x) * W) {
    float v[W];
    load<W>(row + c, v);
    if constexpr (kCopy) store<W>(copy + c, v);
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
}

// The row's log-sum-exp from every thread's running max and sum (block reductions: all threads).
// A thread with no finite value (max -inf) adds its sum as it is: 0, or NaN from NaN logits.
__device__ __forceinline__ float row_log_sum_exp(float running_max, float running_sum) {
  const float row_max = block_max(running_max);
  const float scaled = running_max == -INFINITY ? running_sum : running_sum * __expf(running_max - row_max);
  const float row_sum = block_sum(scaled);
  return row_max + logf(row_sum);
}

// out[c] = grad_scale * (softmax - onehot) for this thread's columns, from the logits in `row`
// (out may be row itself); zero in the padding columns.
template <int W, typename T>
__device__ __forceinline__ void write_gradient(const T* row, T* out, int64_t cols, int64_t valid_vocab, int32_t target,
                                               float log_sum_exp, float grad_scale) {
  for (int64_t c = static_cast<int64_t>(threadIdx.x) * W; c < cols; c += static_cast<int64_t>(blockDim.x) * W) {
    float v[W], g[W];
    if (c < valid_vocab) load<W>(row + c, v);  // columns past valid_vocab become 0 below
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const int64_t column = c + i;
      const float probability = column < valid_vocab ? __expf(v[i] - log_sum_exp) : 0.0f;
      g[i] = grad_scale * (column == target ? probability - 1.0f : probability);
    }
    store<W>(out + c, g);
  }
}

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
  fold_row<W, T, kCache>(row_logits, cache, valid_vocab, running_max, running_sum);
  const float log_sum_exp = row_log_sum_exp(running_max, running_sum);  // its barriers publish target_logit
  if (threadIdx.x == 0) losses[row] = log_sum_exp - target_logit;
  if (grad_scale == 0.0f) return;
  write_gradient<W, T>(kCache ? cache : row_logits, row_logits, cols, valid_vocab, target, log_sum_exp, grad_scale);
}

// ---- streamed kernel (sm_90+) ----------------------------------------------------------------
constexpr int kStreamThreads = 1024;

__device__ __forceinline__ uint32_t shared_address(const void* pointer) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

// Starts the bulk copy of `bytes` (a multiple of 16, both addresses 16-byte aligned) from global
// memory into shared memory; `barrier` completes when they have landed.
__device__ __forceinline__ void start_row_copy(void* destination, const void* source, uint32_t bytes,
                                               uint64_t* barrier) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The buffer was last read through ordinary loads; order those before the async proxy's writes.
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(shared_address(barrier)), "r"(bytes)
               : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                   shared_address(destination)),
               "l"(source), "r"(bytes), "r"(shared_address(barrier))
               : "memory");
#endif
}

__device__ __forceinline__ void wait_barrier(uint64_t* barrier, uint32_t parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "wait_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra wait_%=;\n"
      "}\n" ::"r"(shared_address(barrier)),
      "r"(parity)
      : "memory");
#endif
}

// The streamed kernel's row math. Each thread takes its columns of the row out of the shared
// buffer into registers once (kVectors 16-byte vectors, the packed 16-bit values), so the buffer
// is free for the row after next as soon as every thread has them; the max, the sum of
// exponentials and the gradient then run on the registers:
//
// - the thread's max m over its valid columns, on packed pairs (NaN-propagating);
// - e = exp(v - m) for each column, added to the thread's sum in FP32 and kept in the registers
//   of the logits as FP16 (e <= 1; FP16's 11-bit significand against the gradient's 8 bits);
// - one block reduction of the threads' (m, sum) pairs, merged as
//   (m, s) + (m', s') = (M, s·exp(m - M) + s'·exp(m' - M)): a warp's 32 in shuffles, the block's
//   32 warps' pairs through shared memory, each warp merging those itself, so one barrier a row;
// - the gradient grad_scale · e · exp(m - lse): one multiply a column, the exponential once a
//   thread; the target's column from its logit, kept aside, as grad_scale · (exp(v - lse) - 1),
//   since e's rounding would swamp p - 1 where p is near 1.
//
// So one exponential a column instead of two (the ex2 unit runs at an eighth of the FP32 rate)
// and no second conversion of the logits. Before: three passes over the row in shared memory
// with two block reductions, seven barriers a row; the kernel ran at 3.3 TB/s on GPT-2's
// 8192x50304 chunk on an H200 in a burst and at 2.4 TB/s inside a real training step, where the
// power-capped clock slows what is issue-bound; now 3.6 and 3.4 TB/s, and 3.4 TB/s at Llama's
// 8192x32000 (2.7 before; bench/results/h200_cross_entropy_eef9d23.md). exp(v - m) is one FFMA
// and one ex2: 2^(v·log2e - m·log2e). The gradient is rounded twice (e to FP16, then the
// product to the logits' type); the op's tests hold it to the CPU oracle's tolerance.
constexpr float kLog2e = 1.4426950408889634f;

__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Merges the pair (other_max, other_sum) into (max, sum). A side with max -inf has no finite
// value: its sum is 0 (no values, or all -inf) and is taken as it is. NaN logits make the
// thread's max NaN and so every sum they touch.
__device__ __forceinline__ void merge_max_sum(float& max, float& sum, float other_max, float other_sum) {
  const float merged = fmaxf(max, other_max);
  const float mine = max == -INFINITY ? sum : sum * fast_exp2((max - merged) * kLog2e);
  const float theirs = other_max == -INFINITY ? other_sum : other_sum * fast_exp2((other_max - merged) * kLog2e);
  max = merged;
  sum = mine + theirs;
}

__device__ __forceinline__ void warp_merge_max_sum(float& max, float& sum) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float other_max = __shfl_xor_sync(0xffffffffu, max, offset);
    const float other_sum = __shfl_xor_sync(0xffffffffu, sum, offset);
    merge_max_sum(max, sum, other_max, other_sum);
  }
}

template <typename T> struct PackedPair;
template <> struct PackedPair<bf16> { using type = __nv_bfloat162; };
template <> struct PackedPair<f16> { using type = __half2; };

// The NaN-propagating max of a vector's eight 16-bit values, as pairs.
template <typename T>
__device__ __forceinline__ typename PackedPair<T>::type vector_max(const uint4& raw) {
  using T2 = typename PackedPair<T>::type;
  const T2* p = reinterpret_cast<const T2*>(&raw);
  return __hmax2_nan(__hmax2_nan(p[0], p[1]), __hmax2_nan(p[2], p[3]));
}

// The 16-bit values of a vector as floats.
template <typename T> __device__ __forceinline__ void unpack8(const uint4& raw, float (&v)[8]) {
  const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
  for (int i = 0; i < 8; ++i) v[i] = to_float<T>(e[i]);
}

__device__ __forceinline__ uint4 pack8_half(const float (&e)[8]) {
  uint4 raw;
  __half2* h = reinterpret_cast<__half2*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) h[k] = __floats2half2_rn(e[2 * k], e[2 * k + 1]);
  return raw;
}

__device__ __forceinline__ void unpack8_half(const uint4& raw, float (&e)[8]) {
  const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float2 f = __half22float2(h[k]);
    e[2 * k] = f.x;
    e[2 * k + 1] = f.y;
  }
}

__device__ __forceinline__ float nan_max(float a, float b) { return a != a || b != b ? NAN : fmaxf(a, b); }

// Rows blockIdx.x, blockIdx.x + gridDim.x, ...: the block's k-th row lands in buffer k % 2.
// row_stride: the bytes of one row's buffer (the row's bytes rounded up to 128). kVectors: the
// 8-column vectors a thread holds, cols <= kVectors * 8 * kStreamThreads.
template <typename T, int kVectors>
__global__ void __launch_bounds__(kStreamThreads, 1)
cross_entropy_streamed_kernel(T* logits, const int32_t* targets, float* losses, int64_t rows, int64_t cols,
                              int64_t valid_vocab, float grad_scale, uint32_t row_stride) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  using T2 = typename PackedPair<T>::type;
  extern __shared__ __align__(128) unsigned char stream_shared[];
  __shared__ __align__(8) uint64_t full[2];
  __shared__ float2 partial[2][32];  // by the row's buffer: each warp's (max, sum)
  auto buffer = [&](int b) { return reinterpret_cast<T*>(stream_shared + b * row_stride); };
  const uint32_t row_bytes = static_cast<uint32_t>(cols * static_cast<int64_t>(sizeof(T)));
  if (threadIdx.x == 0) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&full[0])) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(shared_address(&full[1])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    for (int b = 0; b < 2; ++b) {
      const int64_t row = blockIdx.x + static_cast<int64_t>(b) * gridDim.x;
      if (row < rows) start_row_copy(buffer(b), logits + row * cols, row_bytes, &full[b]);
    }
  }
  __syncthreads();
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int valid = static_cast<int>(valid_vocab), width = static_cast<int>(cols);
  int k = 0;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x, ++k) {
    const int b = k & 1;
    const int32_t target = targets[row];
    wait_barrier(&full[b], static_cast<uint32_t>(k >> 1) & 1u);
    const T* row_values = buffer(b);
    uint4 raw[kVectors];
    T2 pair_max;
    pair_max.x = pair_max.y = from_float<T>(-INFINITY);
    float edge_max = -INFINITY;  // the vector holding the end of the valid columns
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      const int c = (threadIdx.x + j * kStreamThreads) * 8;
      if (c < width) raw[j] = *reinterpret_cast<const uint4*>(row_values + c);
      if (c + 8 <= valid) {
        pair_max = __hmax2_nan(pair_max, vector_max<T>(raw[j]));
      } else if (c < valid) {
        float v[8];
        unpack8<T>(raw[j], v);
#pragma unroll
        for (int i = 0; i < 8; ++i)
          if (c + i < valid) edge_max = nan_max(edge_max, v[i]);
      }
    }
    const float max = nan_max(to_float<T>(__hmax_nan(pair_max.x, pair_max.y)), edge_max);
    // e = exp(v - max) into the registers of the logits (FP16), the target's logit kept aside.
    // With no finite value the shift is 0: -inf values give 0.
    const float local_shift = max == -INFINITY ? 0.0f : max * kLog2e;
    float sum = 0.0f, target_value = 0.0f;
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      const int c = (threadIdx.x + j * kStreamThreads) * 8;
      if (c < valid) {
        float v[8];
        unpack8<T>(raw[j], v);
        const int count = min(8, valid - c);
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          if (c + i == target) target_value = v[i];
          v[i] = i < count ? fast_exp2(fmaf(v[i], kLog2e, -local_shift)) : 0.0f;
          sum += v[i];
        }
        raw[j] = pack8_half(v);
      }
    }
    float row_max = max, row_sum = sum;
    warp_merge_max_sum(row_max, row_sum);
    if (lane == 0) partial[b][warp] = make_float2(row_max, row_sum);
    // Every thread holds its columns and its warp's pair is published: buffer b takes the row after next.
    __syncthreads();
    if (threadIdx.x == 0) {
      const int64_t after_next = row + 2 * static_cast<int64_t>(gridDim.x);
      if (after_next < rows) start_row_copy(buffer(b), logits + after_next * cols, row_bytes, &full[b]);
    }
    const float2 pair = partial[b][lane];
    row_max = pair.x;
    row_sum = pair.y;
    warp_merge_max_sum(row_max, row_sum);
    const float log_sum_exp = row_max + logf(row_sum);
    // The target's owner has its logit; an invalid target makes the loss NaN (the trainer stops).
    const bool target_valid = target >= 0 && target < valid;
    if (target_valid ? (target / 8) % kStreamThreads == static_cast<int>(threadIdx.x) : threadIdx.x == 0)
      losses[row] = target_valid ? log_sum_exp - target_value : NAN;
    if (grad_scale == 0.0f) continue;
    // The thread's columns: grad_scale · e · exp(max - lse).
    const float scale = max == -INFINITY ? 0.0f : grad_scale * fast_exp2((max - log_sum_exp) * kLog2e);
    const float target_gradient = grad_scale * (fast_exp2(fmaf(target_value, kLog2e, -log_sum_exp * kLog2e)) - 1.0f);
    T* row_logits = logits + row * cols;
#pragma unroll
    for (int j = 0; j < kVectors; ++j) {
      const int c = (threadIdx.x + j * kStreamThreads) * 8;
      if (c >= width) continue;
      float g[8];
      if (c < valid) {
        unpack8_half(raw[j], g);
#pragma unroll
        for (int i = 0; i < 8; ++i) g[i] *= scale;  // columns past valid_vocab: e = 0
        if (static_cast<unsigned>(target - c) < 8u) {
#pragma unroll
          for (int i = 0; i < 8; ++i)
            if (c + i == target) g[i] = target_gradient;
        }
      } else {
#pragma unroll
        for (int i = 0; i < 8; ++i) g[i] = 0.0f;
      }
      store<8>(row_logits + c, g);
    }
  }
#endif
}

int device_attribute(cudaDeviceAttr attribute) {
  int device = 0, value = 0;
  MXTRAIN_CUDA_CHECK(cudaGetDevice(&device));
  MXTRAIN_CUDA_CHECK(cudaDeviceGetAttribute(&value, attribute, device));
  return value;
}

size_t shared_memory_limit() {
  static const size_t limit = static_cast<size_t>(device_attribute(cudaDevAttrMaxSharedMemoryPerBlockOptin));
  return limit;
}

// Allows `kernel` the device's whole opt-in shared memory: the dynamic limit is the opt-in
// maximum less the kernel's static shared memory (the block reductions' few hundred bytes).
// Returns that dynamic limit. Callers keep the result in a static: once per kernel.
template <typename Kernel> size_t allow_all_shared_memory(Kernel kernel) {
  cudaFuncAttributes attributes{};
  MXTRAIN_CUDA_CHECK(cudaFuncGetAttributes(&attributes, kernel));
  const size_t dynamic = shared_memory_limit() - attributes.sharedSizeBytes;
  MXTRAIN_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(dynamic)));
  return dynamic;
}

template <int W, typename T, bool kCache>
void launch(T* data, const int32_t* ids, float* out, int64_t rows, int64_t cols, int64_t valid_vocab,
            float grad_scale, int threads, size_t shared_bytes, cudaStream_t stream) {
  if constexpr (kCache) {
    static const size_t dynamic = allow_all_shared_memory(cross_entropy_kernel<W, T, true>);
    (void)dynamic;
  }
  cross_entropy_kernel<W, T, kCache><<<static_cast<unsigned>(rows), threads, shared_bytes, stream>>>(
      data, ids, out, cols, valid_vocab, grad_scale);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

// The streamed kernel, when it applies: true if it ran.
template <typename T, int kVectors>
void launch_streamed_with(T* data, const int32_t* ids, float* out, int64_t rows, int64_t cols, int64_t valid_vocab,
                          float grad_scale, unsigned blocks, size_t shared_bytes, uint32_t row_stride,
                          cudaStream_t stream) {
  static const size_t dynamic = allow_all_shared_memory(cross_entropy_streamed_kernel<T, kVectors>);
  MXTRAIN_ASSERT(shared_bytes <= dynamic, "cross_entropy: %zu bytes of row buffers, %zu allowed", shared_bytes,
                 dynamic);
  cross_entropy_streamed_kernel<T, kVectors><<<blocks, kStreamThreads, shared_bytes, stream>>>(
      data, ids, out, rows, cols, valid_vocab, grad_scale, row_stride);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T>
bool launch_streamed(T* data, const int32_t* ids, float* out, int64_t rows, int64_t cols, int64_t valid_vocab,
                     float grad_scale, cudaStream_t stream) {
  static_assert(sizeof(T) == 2, "the streamed kernel's rows are 16-bit values");
  static const int capability = device_attribute(cudaDevAttrComputeCapabilityMajor);
  static const int processors = device_attribute(cudaDevAttrMultiProcessorCount);
  constexpr int64_t kMaxVectors = 8;
  if (capability < 9 || cols % 8 != 0 || cols > kMaxVectors * 8 * kStreamThreads || !aligned16(data)) return false;
  const size_t row_stride = (static_cast<size_t>(cols) * sizeof(T) + 127) / 128 * 128;
  const size_t shared_bytes = 2 * row_stride;
  // The kernel's static shared memory (the barriers, the warps' pairs) is under 1 KB.
  if (shared_bytes + 1024 > shared_memory_limit()) return false;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(rows, processors));
  const uint32_t stride = static_cast<uint32_t>(row_stride);
  auto run = [&](auto vectors) {
    launch_streamed_with<T, decltype(vectors)::value>(data, ids, out, rows, cols, valid_vocab, grad_scale, blocks,
                                                      shared_bytes, stride, stream);
  };
  switch ((cols / 8 + kStreamThreads - 1) / kStreamThreads) {
    case 1: run(std::integral_constant<int, 1>{}); break;
    case 2: run(std::integral_constant<int, 2>{}); break;
    case 3: run(std::integral_constant<int, 3>{}); break;
    case 4: run(std::integral_constant<int, 4>{}); break;
    case 5: run(std::integral_constant<int, 5>{}); break;
    case 6: run(std::integral_constant<int, 6>{}); break;
    case 7: run(std::integral_constant<int, 7>{}); break;
    default: run(std::integral_constant<int, 8>{}); break;
  }
  return true;
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
    // A few rows (a small test, an evaluation tail) gain nothing from streaming.
    if constexpr (sizeof(T) == 2)
      if (rows >= 256 && launch_streamed<T>(data, ids, out, rows, cols, valid_vocab, grad_scale, stream)) return;
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
