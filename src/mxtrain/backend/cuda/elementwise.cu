// Elementwise kernels: fill, dtype conversion, scale, add, GELU and SwiGLU. Each thread moves
// one 8-element vector (16-byte accesses for bf16) when every pointer is 16-byte aligned and
// the length (row length for SwiGLU) is a multiple of 8, else one element. All math is FP32 in
// registers with one rounding on store, so bf16 outputs pass through bf16 exactly once. Unary,
// binary and SwiGLU maps can record their output's amax (amax_out non-null: device_common.cuh);
// their threads past the end stay to the last line, where the warp combines its amax (launches
// that record nothing skip the amax arithmetic).
#include <cstdint>

#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kThreads = 256;

// ---- generic maps ------------------------------------------------------------------------------
template <int W, typename TOut, typename Op>
__global__ void fill_kernel(TOut* out, int64_t vectors, Op op) {
  int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (v >= vectors) return;
  float y[W];
#pragma unroll
  for (int i = 0; i < W; ++i) y[i] = op();
  store<W>(out + v * W, y);
}

template <int W, typename TIn, typename TOut, typename Op>
__global__ void unary_kernel(const TIn* a, TOut* out, int64_t vectors, Op op, unsigned* amax_out) {
  int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned amax = 0;
  if (v < vectors) {
    float x[W], y[W];
    load<W>(a + v * W, x);
#pragma unroll
    for (int i = 0; i < W; ++i) y[i] = op(x[i]);
    store<W>(out + v * W, y);
    if (amax_out != nullptr) {
#pragma unroll
      for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(y[i]));
    }
  }
  if (amax_out != nullptr) record_warp_amax<TOut>(amax, amax_out);
}

template <int W, typename TA, typename TB, typename TOut, typename Op>
__global__ void binary_kernel(const TA* a, const TB* b, TOut* out, int64_t vectors, Op op, unsigned* amax_out) {
  int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned amax = 0;
  if (v < vectors) {
    float x[W], z[W], y[W];
    load<W>(a + v * W, x);
    load<W>(b + v * W, z);
#pragma unroll
    for (int i = 0; i < W; ++i) y[i] = op(x[i], z[i]);
    store<W>(out + v * W, y);
    if (amax_out != nullptr) {
#pragma unroll
      for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(y[i]));
    }
  }
  if (amax_out != nullptr) record_warp_amax<TOut>(amax, amax_out);
}

__global__ void fill_i32_kernel(int32_t* out, int64_t n, int32_t value) {
  int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = value;
}

struct Constant {
  float value;
  __device__ float operator()() const { return value; }
};
struct Identity {
  __device__ float operator()(float x) const { return x; }
};
struct Scale {
  float factor;
  __device__ float operator()(float x) const { return x * factor; }
};
struct Plus {
  __device__ float operator()(float a, float b) const { return a + b; }
};

constexpr float kGeluScale = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluCubic = 0.044715f;

struct GeluForward {
  __device__ float operator()(float x) const {
    float u = kGeluScale * (x + kGeluCubic * x * x * x);
    return 0.5f * x * (1.0f + tanhf(u));
  }
};
struct GeluBackward {  // (dout, x) -> dx
  __device__ float operator()(float dout, float x) const {
    float u = kGeluScale * (x + kGeluCubic * x * x * x);
    float t = tanhf(u);
    float du = kGeluScale * (1.0f + 3.0f * kGeluCubic * x * x);
    return dout * (0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * du);
  }
};

// ---- launch helpers ----------------------------------------------------------------------------
bool vector_path(int64_t n, std::initializer_list<const Tensor*> tensors) {
  if (n % 8 != 0) return false;
  for (const Tensor* t : tensors)
    if (!aligned16(*t)) return false;
  return true;
}

template <typename TOut, typename Op> void launch_fill(const Tensor& out, Op op, cudaStream_t stream) {
  int64_t n = out.numel();
  if (n == 0) return;
  auto* o = static_cast<TOut*>(out.data);
  if (vector_path(n, {&out})) {
    fill_kernel<8><<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(o, n / 8, op);
  } else {
    fill_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(o, n, op);
  }
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename TIn, typename TOut, typename Op>
void launch_unary(const Tensor& a, const Tensor& out, Op op, cudaStream_t stream, const Tensor& out_amax = {}) {
  unsigned* amax = start_amax_record(out_amax, stream);
  int64_t n = out.numel();
  if (n == 0) return;
  auto* x = static_cast<const TIn*>(a.data);
  auto* o = static_cast<TOut*>(out.data);
  if (vector_path(n, {&a, &out})) {
    unary_kernel<8><<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(x, o, n / 8, op, amax);
  } else {
    unary_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, o, n, op, amax);
  }
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

template <typename T, typename Op>
void launch_binary(const Tensor& a, const Tensor& b, const Tensor& out, Op op, cudaStream_t stream,
                   const Tensor& out_amax = {}) {
  unsigned* amax = start_amax_record(out_amax, stream);
  int64_t n = out.numel();
  if (n == 0) return;
  auto* x = static_cast<const T*>(a.data);
  auto* z = static_cast<const T*>(b.data);
  auto* o = static_cast<T*>(out.data);
  if (vector_path(n, {&a, &b, &out})) {
    binary_kernel<8><<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(x, z, o, n / 8, op, amax);
  } else {
    binary_kernel<1><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(x, z, o, n, op, amax);
  }
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

void require_same_dtype(const char* op, std::initializer_list<const Tensor*> tensors) {
  DType first = (*tensors.begin())->dtype;
  for (const Tensor* t : tensors) {
    if (t->dtype != first)
      throw Error(ErrorKind::unsupported,
                  strf("cuda %s needs one dtype for all operands, got %s and %s", op,
                       std::string(dtype_name(first)).c_str(), std::string(dtype_name(t->dtype)).c_str()),
                  "convert the operands with copy() first");
  }
}

// ---- SwiGLU: gate_up [rows, 2F] interleaved (gate j in column 2j, up j in 2j + 1), out [rows, F]
// I: the index type of the row/column split (with_index_type).
//
// The element math (swiglu_value, swiglu_gradients) is device_common.cuh's, shared with the FP8
// casts that fuse these ops (quantize.cu). A thread's W outputs take the 2W consecutive inputs at
// twice their column: two loads of W, pair i at elements 2i and 2i + 1 of the two.
template <int W>
__device__ __forceinline__ float pair_element(const float (&p)[2][W], int e) {
  return p[e / W][e % W];
}

// V vectors a thread, all loaded before any is computed: with one vector (32 bytes of loads in
// flight a thread) the forward had too few bytes in flight to reach the bandwidth.
template <int W, int V, typename I, typename T>
__global__ void swiglu_forward_kernel(const T* gate_up, T* out, int64_t vectors, int64_t ffn, unsigned* amax_out) {
  const int64_t first = static_cast<int64_t>(blockIdx.x) * blockDim.x * V + threadIdx.x;
  const I per_row = static_cast<I>(ffn / W);
  float p[V][2][W];
  int64_t out_offset[V];
#pragma unroll
  for (int j = 0; j < V; ++j) {
    const int64_t v = first + static_cast<int64_t>(j) * blockDim.x;
    if (v >= vectors) break;
    const int64_t row = static_cast<I>(v) / per_row, col = static_cast<int64_t>(static_cast<I>(v) % per_row) * W;
    const T* pairs = gate_up + row * 2 * ffn + 2 * col;
    load<W>(pairs, p[j][0]);
    load<W>(pairs + W, p[j][1]);
    out_offset[j] = row * ffn + col;
  }
  unsigned amax = 0;
#pragma unroll
  for (int j = 0; j < V; ++j) {
    if (first + static_cast<int64_t>(j) * blockDim.x >= vectors) break;
    float y[W];
#pragma unroll
    for (int i = 0; i < W; ++i) y[i] = swiglu_value(pair_element<W>(p[j], 2 * i), pair_element<W>(p[j], 2 * i + 1));
    store<W>(out + out_offset[j], y);
    if (amax_out != nullptr) {
#pragma unroll
      for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(y[i]));
    }
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);
}

template <int W, typename I, typename T>
__global__ void swiglu_backward_kernel(const T* dout, const T* gate_up, T* dgate_up, int64_t vectors, int64_t ffn,
                                       unsigned* amax_out) {
  int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  unsigned amax = 0;
  if (v < vectors) {
    const I per_row = static_cast<I>(ffn / W);
    const int64_t row = static_cast<I>(v) / per_row, col = static_cast<int64_t>(static_cast<I>(v) % per_row) * W;
    const int64_t in_offset = row * 2 * ffn + 2 * col;
    float d[W], p[2][W], q[2][W];
    load<W>(dout + row * ffn + col, d);
    load<W>(gate_up + in_offset, p[0]);
    load<W>(gate_up + in_offset + W, p[1]);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      float dg, du;
      swiglu_gradients(d[i], pair_element<W>(p, 2 * i), pair_element<W>(p, 2 * i + 1), dg, du);
      q[(2 * i) / W][(2 * i) % W] = dg;
      q[(2 * i + 1) / W][(2 * i + 1) % W] = du;
      if (amax_out != nullptr) amax = max(amax, max(abs_bits(dg), abs_bits(du)));
    }
    store<W>(dgate_up + in_offset, q[0]);
    store<W>(dgate_up + in_offset + W, q[1]);
  }
  if (amax_out != nullptr) record_warp_amax<T>(amax, amax_out);
}

}  // namespace

void fill(const Tensor& out, float value, cudaStream_t stream) {
  if (out.dtype == DType::i32) {
    int64_t n = out.numel();
    if (n == 0) return;
    fill_i32_kernel<<<blocks_for(n, kThreads), kThreads, 0, stream>>>(static_cast<int32_t*>(out.data), n,
                                                                       static_cast<int32_t>(value));
    MXTRAIN_CUDA_CHECK_LAUNCH();
    return;
  }
  dispatch_float<true>(out.dtype, "fill", [&](auto tag) {
    using T = decltype(tag);
    launch_fill<T>(out, Constant{value}, stream);
  });
}

void convert(const Tensor& source, const Tensor& out, cudaStream_t stream) {
  dispatch_float<true>(source.dtype, "copy", [&](auto source_tag) {
    using S = decltype(source_tag);
    dispatch_float<true>(out.dtype, "copy", [&](auto out_tag) {
      using D = decltype(out_tag);
      launch_unary<S, D>(source, out, Identity{}, stream);
    });
  });
}

void scale(const Tensor& x, float factor, cudaStream_t stream) {
  dispatch_float<true>(x.dtype, "scale", [&](auto tag) {
    using T = decltype(tag);
    launch_unary<T, T>(x, x, Scale{factor}, stream);
  });
}

void add(const Tensor& a, const Tensor& b, const Tensor& out, cudaStream_t stream) {
  require_same_dtype("add", {&a, &b, &out});
  dispatch_float<true>(out.dtype, "add", [&](auto tag) {
    using T = decltype(tag);
    launch_binary<T>(a, b, out, Plus{}, stream);
  });
}

void gelu_forward(const Tensor& x, const Tensor& out, const Tensor& out_amax, cudaStream_t stream) {
  require_same_dtype("gelu_forward", {&x, &out});
  dispatch_float<true>(out.dtype, "gelu_forward", [&](auto tag) {
    using T = decltype(tag);
    launch_unary<T, T>(x, out, GeluForward{}, stream, out_amax);
  });
}

void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const Tensor& out_amax,
                   cudaStream_t stream) {
  require_same_dtype("gelu_backward", {&dout, &x, &dx});
  dispatch_float<true>(dx.dtype, "gelu_backward", [&](auto tag) {
    using T = decltype(tag);
    launch_binary<T>(dout, x, dx, GeluBackward{}, stream, out_amax);
  });
}

void swiglu_forward(const Tensor& gate_up, const Tensor& out, const Tensor& out_amax, cudaStream_t stream) {
  require_same_dtype("swiglu_forward", {&gate_up, &out});
  unsigned* amax = start_amax_record(out_amax, stream);
  const int64_t ffn = out.cols(), n = out.numel();
  if (n == 0) return;
  dispatch_float<true>(out.dtype, "swiglu_forward", [&](auto tag) {
    using T = decltype(tag);
    auto* in = static_cast<const T*>(gate_up.data);
    auto* o = static_cast<T*>(out.data);
    const bool vector = vector_path(ffn, {&gate_up, &out});
    with_index_type(n, [&](auto index) {
      using I = decltype(index);
      if (vector) {
        swiglu_forward_kernel<8, 2, I, T><<<blocks_for(n / 8, 2 * kThreads), kThreads, 0, stream>>>(in, o, n / 8, ffn,
                                                                                                     amax);
      } else {
        swiglu_forward_kernel<1, 1, I, T><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(in, o, n, ffn, amax);
      }
    });
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up, const Tensor& out_amax,
                     cudaStream_t stream) {
  require_same_dtype("swiglu_backward", {&dout, &gate_up, &dgate_up});
  unsigned* amax = start_amax_record(out_amax, stream);
  const int64_t ffn = dout.cols(), n = dout.numel();
  if (n == 0) return;
  dispatch_float<true>(dout.dtype, "swiglu_backward", [&](auto tag) {
    using T = decltype(tag);
    auto* d = static_cast<const T*>(dout.data);
    auto* in = static_cast<const T*>(gate_up.data);
    auto* o = static_cast<T*>(dgate_up.data);
    const bool vector = vector_path(ffn, {&dout, &gate_up, &dgate_up});
    with_index_type(n, [&](auto index) {
      using I = decltype(index);
      if (vector) {
        swiglu_backward_kernel<8, I, T><<<blocks_for(n / 8, kThreads), kThreads, 0, stream>>>(d, in, o, n / 8, ffn, amax);
      } else {
        swiglu_backward_kernel<1, I, T><<<blocks_for(n, kThreads), kThreads, 0, stream>>>(d, in, o, n, ffn, amax);
      }
    });
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

}  // namespace mxtrain::cuda_kernels
