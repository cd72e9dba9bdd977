// Device helpers shared by every kernel file: float conversion of the storage types, 8-wide
// vector loads and stores (one 16-byte access for bf16/f16, two for f32), warp and block
// reductions, and the host-side dtype dispatch that instantiates a kernel per storage type.
//
// Kernels take a compile-time width W: 8 when every pointer is 16-byte aligned and the row
// length is a multiple of 8 (the fast path all model shapes take), 1 otherwise. Both widths
// compute the same values in the same order per element, so results never depend on alignment.
#pragma once
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/tensor.hpp"

namespace mxtrain::cuda_kernels {

using bf16 = __nv_bfloat16;
using f16 = __half;

// ---- scalar conversions (round to nearest even, as core/dtype.hpp) -------------------------
template <typename T> __device__ __forceinline__ float to_float(T value);
template <> __device__ __forceinline__ float to_float<float>(float value) { return value; }
template <> __device__ __forceinline__ float to_float<bf16>(bf16 value) { return __bfloat162float(value); }
template <> __device__ __forceinline__ float to_float<f16>(f16 value) { return __half2float(value); }

template <typename T> __device__ __forceinline__ T from_float(float value);
template <> __device__ __forceinline__ float from_float<float>(float value) { return value; }
template <> __device__ __forceinline__ bf16 from_float<bf16>(float value) { return __float2bfloat16_rn(value); }
template <> __device__ __forceinline__ f16 from_float<f16>(float value) { return __float2half_rn(value); }

// Value after a round trip through T: what a later reader of a T buffer sees.
template <typename T> __device__ __forceinline__ float round_to(float value) {
  return to_float<T>(from_float<T>(value));
}

// ---- W-wide loads and stores into float registers ----------------------------------------
template <int W, typename T> __device__ __forceinline__ void load(const T* p, float (&v)[W]) {
  if constexpr (W == 1) {
    v[0] = to_float<T>(*p);
  } else {
    static_assert(W == 8, "width 1 or 8");
    if constexpr (sizeof(T) == 2) {
      uint4 raw = *reinterpret_cast<const uint4*>(p);
      const T* e = reinterpret_cast<const T*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) v[i] = to_float<T>(e[i]);
    } else {
      float4 a = *reinterpret_cast<const float4*>(p);
      float4 b = *reinterpret_cast<const float4*>(p + 4);
      v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
      v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
    }
  }
}

template <int W, typename T> __device__ __forceinline__ void store(T* p, const float (&v)[W]) {
  if constexpr (W == 1) {
    *p = from_float<T>(v[0]);
  } else {
    if constexpr (sizeof(T) == 2) {
      uint4 raw;
      T* e = reinterpret_cast<T*>(&raw);
#pragma unroll
      for (int i = 0; i < 8; ++i) e[i] = from_float<T>(v[i]);
      *reinterpret_cast<uint4*>(p) = raw;
    } else {
      *reinterpret_cast<float4*>(p) = make_float4(v[0], v[1], v[2], v[3]);
      *reinterpret_cast<float4*>(p + 4) = make_float4(v[4], v[5], v[6], v[7]);
    }
  }
}

// ---- SwiGLU's element math --------------------------------------------------------------------
// The SwiGLU kernels (elementwise.cu) and the FP8 casts that fuse them as producers (quantize.cu)
// compute every value with these, rounding for rounding (explicit _rn operations: no contraction
// can differ between the two), so the fused cast's codes are those of the op and then the cast.
//
// sigmoid(g) = 1 / (1 + e^-g) with the hardware ex2 (__expf) and an approximate reciprocal
// (__fdividef): a few ulp of f32 (far below the bf16 rounding of the result; the ops' tests
// hold them to the CPU oracle's tolerance), and far fewer instructions than expf and an IEEE
// division, which left the forward partly issue-bound (3.5 TB/s on llama-1b's [16384, 5632]
// on an H200). Past g < -87 the reciprocal of the huge denominator is 0, as the sigmoid's
// value there is below f32's normal range anyway. With both changes (and two vectors a thread
// in the forward) a llama-1b step's SwiGLU kernels went 3.47 -> 3.02 ms (forward, 4.0 TB/s) and
// 5.07 -> 4.65 ms (backward, 4.3 TB/s) in CUPTI timelines of real steps.
__device__ __forceinline__ float fast_sigmoid(float g) { return __fdividef(1.0f, 1.0f + __expf(-g)); }

// silu(g) · u.
__device__ __forceinline__ float swiglu_value(float g, float u) { return __fmul_rn(__fmul_rn(g, fast_sigmoid(g)), u); }

// dgate = d · u · σ(g) · (1 + g · (1 - σ(g))), dup = d · silu(g).
__device__ __forceinline__ void swiglu_gradients(float d, float g, float u, float& dgate, float& dup) {
  const float sigmoid = fast_sigmoid(g);
  dgate = __fmul_rn(__fmul_rn(__fmul_rn(d, u), sigmoid), __fmaf_rn(g, 1.0f - sigmoid, 1.0f));
  dup = __fmul_rn(d, __fmul_rn(g, sigmoid));
}

// A norm's output element, as the norm kernels and the cast that fuses a norm compute it (explicit
// roundings, so both give the same bits): RMS v · rstd · w; LayerNorm (v - mean) · rstd · w + b
// with one fused multiply-add, what the compiler made of the expression before.
__device__ __forceinline__ float rms_norm_value(float v, float rstd, float w) { return __fmul_rn(__fmul_rn(v, rstd), w); }
__device__ __forceinline__ float layer_norm_value(float v, float mean, float rstd, float w, float b) {
  return __fmaf_rn(__fmul_rn(__fsub_rn(v, mean), rstd), w, b);
}

// RoPE's rotation of the pair (x1, x2) by the angle with cosine c and sine sk (negated for the
// inverse): explicit roundings, as the CPU oracle computes it, shared by the rope kernel and the
// cast that fuses RoPE's backward.
__device__ __forceinline__ void rope_rotate(float x1, float x2, float c, float sk, float& y1, float& y2) {
  y1 = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sk));
  y2 = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sk));
}

// ---- reductions ----------------------------------------------------------------------------
__device__ __forceinline__ float warp_sum(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value += __shfl_xor_sync(0xffffffffu, value, offset);
  return value;
}
__device__ __forceinline__ float warp_max(float value) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
  return value;
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
// The order is fixed by the launch shape, so results are reproducible run to run.
__device__ __forceinline__ float block_sum(float value) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  value = warp_sum(value);
  __syncthreads();  // partial/total may still be read by a previous call
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    float v = lane < warps ? partial[lane] : 0.0f;
    v = warp_sum(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

__device__ __forceinline__ float block_max(float value) {
  __shared__ float partial[32];
  __shared__ float total;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  value = warp_max(value);
  __syncthreads();
  if (lane == 0) partial[warp] = value;
  __syncthreads();
  if (warp == 0) {
    float v = lane < warps ? partial[lane] : -INFINITY;
    v = warp_max(v);
    if (lane == 0) total = v;
  }
  __syncthreads();
  return total;
}

// ---- amax records ----------------------------------------------------------------------------
// A kernel that writes a tensor which a per-tensor FP8 recipe casts next under current scaling
// can record the tensor's amax (max |value|, NaN if any value is NaN) on the way, sparing the
// cast a pass over it (TransformerEngine's norm and activation kernels do the same). Amaxes are
// non-negative, so the max of their FP32 bit patterns is the NaN-propagating max (any NaN pattern
// exceeds +inf's) and atomicMax on the bits combines warps in any order, deterministically.
__device__ __forceinline__ unsigned abs_bits(float value) { return __float_as_uint(value) & 0x7fffffffu; }

// Adds a warp's amax to *out (f32 bits, zeroed before the kernel: start_amax_record). `bits` is
// each lane's max of abs_bits over the f32 values it stored as T: rounding to T is monotonic, so
// the rounded max is the max of what a reader of the tensor sees. Every lane of the warp calls it.
template <typename T> __device__ __forceinline__ void record_warp_amax(unsigned bits, unsigned* out) {
  bits = abs_bits(round_to<T>(__uint_as_float(bits)));
  bits = __reduce_max_sync(0xffffffffu, bits);
  // The record only grows: a warp whose max is not above what it reads skips the atomic. (The
  // atomic from every warp, with no read, measured slower in every FP8 step: atomics on one
  // address cost more than the read; bench/results/h100_adamw_amax_tried_3645458.md.)
  if ((threadIdx.x & 31) == 0 && bits > *reinterpret_cast<volatile const unsigned*>(out)) atomicMax(out, bits);
}

// ---- host side -------------------------------------------------------------------------------
// The bits of an amax record (f32 [1]) zeroed on `stream` for a kernel to fill; null when undefined.
inline unsigned* start_amax_record(const Tensor& amax, cudaStream_t stream) {
  if (!amax.defined()) return nullptr;
  MXTRAIN_CUDA_CHECK(cudaMemsetAsync(amax.data, 0, sizeof(float), stream));
  return static_cast<unsigned*>(amax.data);
}

inline bool aligned16(const void* pointer) { return (reinterpret_cast<uintptr_t>(pointer) & 15u) == 0; }
inline bool aligned16(const Tensor& tensor) { return !tensor.defined() || aligned16(tensor.data); }

inline unsigned blocks_for(int64_t work, int64_t per_block) {
  return static_cast<unsigned>((work + per_block - 1) / per_block);
}

// Calls f(I{}) with I the index type for splitting `count` items into rows and columns inside a
// kernel: uint32_t when the count fits (a 64-bit division is a long instruction sequence, and
// the element-wise kernels move only a few dozen bytes a thread), else int64_t.
template <typename F> void with_index_type(int64_t count, F&& f) {
  if (count <= static_cast<int64_t>(UINT32_MAX)) {
    f(uint32_t{});
  } else {
    f(int64_t{});
  }
}

[[noreturn]] inline void unsupported_dtype(const char* op, DType dtype) {
  throw Error(ErrorKind::unsupported,
              strf("the cuda backend has no %s kernel for %s tensors", op, std::string(dtype_name(dtype)).c_str()),
              "use bf16 or f32 activations (--precision bf16 or fp32)");
}

// Calls f(T{}) with T the storage type of dtype: float, bf16 (and f16 when allowed).
template <bool kAllowHalf = false, typename F> void dispatch_float(DType dtype, const char* op, F&& f) {
  switch (dtype) {
    case DType::f32: f(float{}); return;
    case DType::bf16: f(bf16{}); return;
    case DType::f16:
      if constexpr (kAllowHalf) {
        f(f16{});
        return;
      }
      break;
    default: break;
  }
  unsupported_dtype(op, dtype);
}

template <typename T> T* data_or_null(const Tensor& tensor) {
  return tensor.defined() ? static_cast<T*>(tensor.data) : nullptr;
}

}  // namespace mxtrain::cuda_kernels
