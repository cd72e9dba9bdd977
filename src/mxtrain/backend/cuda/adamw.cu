// AdamW over one flat group shard in one launch: the f32 master, both moments and the
// compute-dtype copy are updated in the same pass (one read of grad, m, v, master; one write
// of m, v, master, copy). The clipping factor is computed on the device from grad_norm_sq[0],
// so the step never waits on the host. Without clipping the same pass can also sum the squared
// gradients it reads (AdamWArgs::grad_norm_output): the reported norm without a pass of its
// own. Operation order follows torch.optim.AdamW's single-tensor path exactly as the CPU
// oracle does (lerp for m, mul+addcmul for v, addcdiv).
// Current scaling's weight amaxes (args.weight_amaxes) are recorded as the new weights are
// written: each warp adds the max |value| of its vectors to its segment's amax, so the next
// cast of each weight skips its own pass (a read of every quantized weight a step).
// Delayed scaling's weight casts (args.weight_casts) are written the same way: each vector of a
// cast segment leaves as its FP8 codes too (cast8, the cast kernels' conversion), one byte more a
// weight than the update moves anyway, and the next forward takes the copy instead of reading the
// weight again in a cast of its own (4 bytes a weight from an FP32 master, and a launch).
// A split master (AdamWArgs::master_low) is read as its two 16-bit halves, joined, updated as
// above and split again: 26 bytes a parameter with bf16 gradients instead of 28.
#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/fp8_codes.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"
#include "mxtrain/numerics/split_master.hpp"

#include <cmath>
#include <type_traits>

namespace mxtrain::cuda_kernels {
namespace {

constexpr int kThreads = private_buffers::kAdamwThreads;

struct NoCopy {};  // copy type when the master is itself the compute weight

// Up to kSegments weight-amax segments a launch (a layer group holds 4 quantized weights); the
// rest take an amax pass after the step.
constexpr int kSegments = 8;
struct AmaxSegments {
  int count = 0;
  int64_t begin[kSegments] = {}, end[kSegments] = {};
  unsigned* bits[kSegments] = {};
};

// Up to kSegments weight casts a launch (AdamWArgs::weight_casts; E4M3, rowwise); the rest take
// a cast pass after the step. Their amaxes ride in AmaxSegments.
struct CastSegments {
  int count = 0;
  int64_t begin[kSegments] = {}, end[kSegments] = {};
  uint8_t* out[kSegments] = {};
  const float* scale[kSegments] = {};
  float* scale_inverse[kSegments] = {};
};

// Elements [first, first + n): the segment holding all of them, -1 if none holds any, -2 if
// they are split (segments are disjoint).
template <typename Segments>
__device__ __forceinline__ int segment_of(const Segments& a, int64_t first, int64_t n) {
  for (int i = 0; i < a.count; ++i) {
    const int64_t low = max(first, a.begin[i]), high = min(first + n, a.end[i]);
    if (low < high) return low == first && high == first + n ? i : -2;
  }
  return -1;
}

// The new weights [base, base + W) as stored (`stored`) into the cast segments that hold them:
// 8-byte stores of cast8's codes where a whole aligned vector lies in one segment, else each
// element through the reference conversion (the same bits).
template <int W>
__device__ __forceinline__ void write_casts(const CastSegments& casts, int64_t base, const float (&stored)[W]) {
  const int segment = segment_of(casts, base, W);
  if (segment == -1) return;
  if constexpr (W == 8) {
    if (segment >= 0 && (base - casts.begin[segment]) % 8 == 0) {
      const float scale = casts.scale[segment][0];
      float scaled[8];
#pragma unroll
      for (int i = 0; i < 8; ++i) scaled[i] = numerics::mul_rn(stored[i], scale);
      uint32_t words[2];
      cast8<numerics::Fp8Format::e4m3>(scaled, words);
      *reinterpret_cast<uint2*>(casts.out[segment] + (base - casts.begin[segment])) = make_uint2(words[0], words[1]);
      return;
    }
  }
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const int own = segment_of(casts, base + i, 1);
    if (own >= 0)
      casts.out[own][base + i - casts.begin[own]] =
          numerics::float_to_fp8(numerics::mul_rn(stored[i], casts.scale[own][0]), numerics::Fp8Format::e4m3);
  }
}

struct AdamWScalars {
  float decay_factor, m_weight, beta2, v_weight, negative_step_size, bias_correction2_sqrt, epsilon, multiplier;
  float max_grad_norm;
  int64_t decay_count;
};

// torch's scalar lerp; the _rn intrinsics keep nvcc from contracting into FMAs, so the update
// rounds exactly as the CPU oracle's does.
__device__ __forceinline__ float torch_lerp(float start, float end, float weight) {
  return fabsf(weight) < 0.5f ? __fadd_rn(start, __fmul_rn(weight, __fsub_rn(end, start)))
                              : __fsub_rn(end, __fmul_rn(__fsub_rn(end, start), __fsub_rn(1.0f, weight)));
}

// W 16-bit words (W = 8: one 16-byte access).
template <int W> __device__ __forceinline__ void load_words(const uint16_t* p, uint16_t (&w)[W]) {
  if constexpr (W == 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(p);
    const uint16_t* e = reinterpret_cast<const uint16_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) w[i] = e[i];
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) w[i] = p[i];
  }
}
template <int W> __device__ __forceinline__ void store_words(uint16_t* p, const uint16_t (&w)[W]) {
  if constexpr (W == 8) {
    uint4 raw;
    uint16_t* e = reinterpret_cast<uint16_t*>(&raw);
#pragma unroll
    for (int i = 0; i < 8; ++i) e[i] = w[i];
    *reinterpret_cast<uint4*>(p) = raw;
  } else {
#pragma unroll
    for (int i = 0; i < W; ++i) p[i] = w[i];
  }
}

// kSplit: the master is (copy, low) joined (numerics/split_master.hpp), C is bf16 and param
// unused; the update reads and writes the two halves (4 bytes a weight each way) instead of
// reading and writing the f32 master and writing the copy (4 + 6).
template <int W, typename G, typename C, bool kSplit>
__global__ void adamw_kernel(float* param, const G* grad, float* m, float* v, C* copy, uint16_t* low,
                             const float* grad_norm_sq, const float* step_factors, int64_t vectors, AdamWScalars s,
                             AmaxSegments amaxes, CastSegments casts, float* norm_partials) {
  // The weights' values as stored: the compute copy's type, or the master's.
  using Stored = std::conditional_t<std::is_same_v<C, NoCopy>, float, C>;
  static_assert(!kSplit || std::is_same_v<C, bf16>, "a split master's high half is the bf16 copy");
  const int64_t vec = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // Past the end a thread leaves, unless its block still meets: whole warps for the amax
  // record, the whole block for the norm's block sum.
  if (amaxes.count == 0 && norm_partials == nullptr && casts.count == 0 && vec >= vectors) return;
  const bool active = vec < vectors;
  if (step_factors != nullptr) {  // this step's factors, written on the device (a replayed graph)
    s.decay_factor = step_factors[0];
    s.negative_step_size = step_factors[1];
    s.bias_correction2_sqrt = step_factors[2];
  }
  float clip = 1.0f;
  if (s.max_grad_norm > 0.0f) {
    const float coefficient = s.max_grad_norm / (sqrtf(grad_norm_sq[0]) + 1e-6f);
    clip = coefficient < 1.0f ? coefficient : 1.0f;
  }
  const int64_t base = vec * W;
  float p[W], g[W], first[W], second[W];
  float squares = 0.0f;
  uint16_t high[W], low_half[W];
  if (active) {
    if constexpr (kSplit) {
      load_words<W>(reinterpret_cast<const uint16_t*>(copy) + base, high);
      load_words<W>(low + base, low_half);
#pragma unroll
      for (int i = 0; i < W; ++i) p[i] = numerics::join_master(high[i], low_half[i]);
    } else {
      load<W>(param + base, p);
    }
    load<W>(grad + base, g);
    load<W>(m + base, first);
    load<W>(v + base, second);
#pragma unroll
    for (int i = 0; i < W; ++i) {
      const float gi = __fmul_rn(__fmul_rn(g[i], s.multiplier), clip);
      squares = __fmaf_rn(gi, gi, squares);
      float weight = p[i];
      if (base + i < s.decay_count) weight = __fmul_rn(weight, s.decay_factor);
      first[i] = torch_lerp(first[i], gi, s.m_weight);
      second[i] = __fadd_rn(__fmul_rn(second[i], s.beta2), __fmul_rn(__fmul_rn(s.v_weight, gi), gi));
      const float denominator = __fadd_rn(__fdiv_rn(sqrtf(second[i]), s.bias_correction2_sqrt), s.epsilon);
      p[i] = __fadd_rn(weight, __fdiv_rn(__fmul_rn(s.negative_step_size, first[i]), denominator));
    }
    if constexpr (kSplit) {
#pragma unroll
      for (int i = 0; i < W; ++i) {
        const numerics::SplitMaster halves = numerics::split_master(p[i]);
        high[i] = halves.high;
        low_half[i] = halves.low;
        p[i] = __uint_as_float(static_cast<uint32_t>(halves.high) << 16);  // the value stored, for the amax
      }
      store_words<W>(reinterpret_cast<uint16_t*>(copy) + base, high);
      store_words<W>(low + base, low_half);
    } else {
      store<W>(param + base, p);
    }
    store<W>(m + base, first);
    store<W>(v + base, second);
    if constexpr (!kSplit && !std::is_same_v<C, NoCopy>) store<W>(copy + base, p);
    if (casts.count > 0) {
      float stored[W];  // the values a cast of the compute copy (the master without one) reads
#pragma unroll
      for (int i = 0; i < W; ++i) stored[i] = kSplit ? p[i] : round_to<Stored>(p[i]);
      write_casts<W>(casts, base, stored);
    }
  }
  // Each copy carries its decode scale, as the cast kernels write it (the reference's 1 / scale).
  if (blockIdx.x == 0 && threadIdx.x < casts.count)
    casts.scale_inverse[threadIdx.x][0] = numerics::div_rn(1.0f, casts.scale[threadIdx.x][0]);
  if (norm_partials != nullptr) {  // one partial a block, added in block order after the kernel
    squares = block_sum(squares);
    if (threadIdx.x == 0) norm_partials[blockIdx.x] = squares;
  }
  if (amaxes.count == 0) return;
  // The vector's segment (-1: none, -2: split between two) and its max |value| bits; rounding
  // to the stored type is monotonic, so record_warp_amax rounds the max once.
  int segment = -1;
  unsigned bits = 0;
  if (active) {
    segment = segment_of(amaxes, base, W);
#pragma unroll
    for (int i = 0; i < W; ++i) bits = max(bits, abs_bits(p[i]));
  }
  const int first_lane = __shfl_sync(0xffffffffu, segment, 0);
  if (__all_sync(0xffffffffu, segment == first_lane)) {
    if (first_lane >= 0) record_warp_amax<Stored>(bits, amaxes.bits[first_lane]);
    return;
  }
  // A warp across a segment boundary (or the grid's end): each element on its own.
  if (!active) return;
#pragma unroll
  for (int i = 0; i < W; ++i) {
    const int own = segment_of(amaxes, base + i, 1);
    if (own >= 0) atomicMax(amaxes.bits[own], abs_bits(round_to<Stored>(p[i])));
  }
}

}  // namespace

void adamw(Backend& backend, const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
           const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args, cudaStream_t stream) {
  const int64_t n = grad.numel();
  const bool split = args.master_low.defined();
  const bool norm_out = args.grad_norm_output != AdamWArgs::NormOutput::none;
  if (n == 0) {
    if (norm_out && args.grad_norm_output == AdamWArgs::NormOutput::overwrite)
      MXTRAIN_CUDA_CHECK(cudaMemsetAsync(grad_norm_sq.data, 0, sizeof(float), stream));
    return;
  }
  MXTRAIN_ASSERT(args.step >= 1, "adamw: step %lld must be >= 1", static_cast<long long>(args.step));
  // Scalars formed in double and rounded to f32 as torch (and the CPU oracle) do.
  const AdamWStepFactors factors = adamw_step_factors(args);
  AdamWScalars s{};
  s.decay_factor = factors.decay_factor;
  s.m_weight = static_cast<float>(1.0 - static_cast<double>(args.beta1));
  s.beta2 = args.beta2;
  s.v_weight = static_cast<float>(1.0 - static_cast<double>(args.beta2));
  s.negative_step_size = factors.negative_step_size;
  s.bias_correction2_sqrt = factors.bias_correction2_sqrt;
  s.epsilon = args.epsilon;
  s.multiplier = args.grad_multiplier;
  s.max_grad_norm = args.max_grad_norm;
  s.decay_count = args.decay_count;
  const float* norm = args.max_grad_norm > 0 ? static_cast<const float*>(grad_norm_sq.data) : nullptr;
  const float* step_factors = args.step_factors.defined() ? static_cast<const float*>(args.step_factors.data) : nullptr;
  // The vector width, the grid and the norm's partials (one a block): private_buffers.hpp.
  const private_buffers::AdamwPlan plan = private_buffers::adamw(param, grad, m, v, compute_copy, args);
  const bool vector = plan.vector;
  // Amax records: current scaling's, then the weight casts' (each cast in the launch records its
  // amax here; one past the capacity gets a cast pass of its own below, which records it).
  AmaxSegments segments;
  std::vector<AmaxSegment> overflow_amaxes;
  auto add_amax = [&](int64_t begin, int64_t end, const Tensor& amax) {
    if (segments.count == kSegments) return false;
    segments.begin[segments.count] = begin;
    segments.end[segments.count] = end;
    segments.bits[segments.count] = static_cast<unsigned*>(amax.data);
    ++segments.count;
    return true;
  };
  for (const AmaxSegment& segment : args.weight_amaxes)
    if (!add_amax(segment.begin, segment.end, segment.amax)) overflow_amaxes.push_back(segment);
  CastSegments casts;
  std::vector<WeightCastSegment> overflow_casts;
  for (const WeightCastSegment& cast : args.weight_casts) {
    if (casts.count == kSegments || segments.count == kSegments) {
      overflow_casts.push_back(cast);
      continue;
    }
    add_amax(cast.begin, cast.end, cast.amax);
    casts.begin[casts.count] = cast.begin;
    casts.end[casts.count] = cast.end;
    casts.out[casts.count] = static_cast<uint8_t*>(cast.out.data.data);
    casts.scale[casts.count] = static_cast<const float*>(cast.scale.data);
    casts.scale_inverse[casts.count] = static_cast<float*>(cast.out.scale_inverse.data);
    ++casts.count;
  }
  std::vector<Buffer> scratch;  // the norm's partials
  auto launch = [&](auto grad_tag, auto copy_tag, auto split_tag) {
    using G = decltype(grad_tag);
    using C = decltype(copy_tag);
    constexpr bool kSplit = decltype(split_tag)::value;
    C* copy = static_cast<C*>(compute_copy.data);
    float* p = static_cast<float*>(param.data);
    const G* g = static_cast<const G*>(grad.data);
    float* first = static_cast<float*>(m.data);
    float* second = static_cast<float*>(v.data);
    const int64_t vectors = vector ? n / 8 : n;
    const unsigned blocks = static_cast<unsigned>(plan.blocks);
    auto kernel = vector ? adamw_kernel<8, G, C, kSplit> : adamw_kernel<1, G, C, kSplit>;
    scratch = private_buffers::allocate_private(backend, plan.buffers);
    float* partials = norm_out ? scratch.at(0).tensor().ptr<float>() : nullptr;
    kernel<<<blocks, kThreads, 0, stream>>>(p, g, first, second, copy, static_cast<uint16_t*>(args.master_low.data),
                                            norm, step_factors, vectors, s, segments, casts, partials);
    MXTRAIN_CUDA_CHECK_LAUNCH();
    if (norm_out)
      sum_partials_final(partials, blocks, grad_norm_sq.ptr<float>(),
                         args.grad_norm_output == AdamWArgs::NormOutput::add, stream);
  };
  using Plain = std::false_type;
  dispatch_float<true>(grad.dtype, "adamw", [&](auto grad_tag) {
    if (split) {
      launch(grad_tag, bf16{}, std::true_type{});
      return;
    }
    if (!compute_copy.defined()) {
      launch(grad_tag, NoCopy{}, Plain{});
      return;
    }
    switch (compute_copy.dtype) {
      case DType::bf16: launch(grad_tag, bf16{}, Plain{}); return;
      case DType::f16: launch(grad_tag, f16{}, Plain{}); return;
      case DType::f32: launch(grad_tag, float{}, Plain{}); return;
      default: unsupported_dtype("adamw (compute copy)", compute_copy.dtype);
    }
  });  // Segments past the launch's capacity: an amax or cast pass each over the new weights.
  const Tensor& written = compute_copy.defined() ? compute_copy : param;
  for (const AmaxSegment& segment : overflow_amaxes)
    amax(written.slice_flat(segment.begin, Shape{segment.end - segment.begin}), segment.amax, true, false, stream);
  for (const WeightCastSegment& cast : overflow_casts)
    quantize(written.slice_flat(cast.begin, cast.out.data.shape), cast.scale, cast.out, QuantizedTensor{}, cast.amax,
             ScaleFromAmax{}, stream);
}

}  // namespace mxtrain::cuda_kernels
