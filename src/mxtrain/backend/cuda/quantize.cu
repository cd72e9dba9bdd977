// Quantization kernels of the precision recipes: amax, per-tensor FP8 cast (+ transpose), MXFP8
// and NVFP4 block quantizers, dequantization, and the FP8 scale update. Every value goes through
// the very MXTRAIN_HD functions of numerics/ that the CPU reference uses (float_to_fp8, mx_scale,
// nvfp4_block_scale, random_hadamard_transform16, philox_random_word, ...), in the same order, so
// the GPU's bits are the reference's bits; the tests check that on large random tensors.
//
// Layout: a copy is a row-major [rows, K] matrix, the rowwise copy of x [R, C] being x and the
// columnwise copy xᵀ [C, R] (the TN-GEMM operand). Amaxes are non-negative (sign cleared), so
// the max over their FP32 bit patterns is the NaN-propagating max (any NaN pattern exceeds
// +inf's) and one atomicMax on the bits combines blocks in any order, deterministically.
#include <cuda_fp8.h>

#include <type_traits>

#include "mxtrain/backend/cuda/device_common.cuh"
#include "mxtrain/backend/cuda/fp8_codes.cuh"
#include "mxtrain/backend/cuda/kernels.hpp"
#include "mxtrain/numerics/fp8.hpp"
#include "mxtrain/numerics/hadamard.hpp"
#include "mxtrain/numerics/philox.hpp"
#include "mxtrain/numerics/scale_layout.hpp"
#include "mxtrain/numerics/scale_rules.hpp"

namespace mxtrain::cuda_kernels {
namespace {

namespace nm = mxtrain::numerics;

constexpr int kThreads = 256;

// ---- amax ------------------------------------------------------------------------------------
// The max of abs_bits (NaN-propagating: device_common.cuh) over x; each warp adds its max to
// *out_bits (record_warp_amax). Four 16-byte loads in flight a thread: one at a time kept the
// pass at 2.9 TB/s on an H200.
template <int W, typename T>
__global__ void amax_kernel(const T* x, int64_t vectors, unsigned* out_bits) {
  unsigned amax = 0;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  int64_t v = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  constexpr int kLoads = 4;
  for (; v + (kLoads - 1) * stride < vectors; v += kLoads * stride) {
    float e[kLoads][W];
#pragma unroll
    for (int k = 0; k < kLoads; ++k) load<W>(x + (v + k * stride) * W, e[k]);
#pragma unroll
    for (int k = 0; k < kLoads; ++k)
#pragma unroll
      for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(e[k][i]));
  }
  for (; v < vectors; v += stride) {
    float e[W];
    load<W>(x + v * W, e);
#pragma unroll
    for (int i = 0; i < W; ++i) amax = max(amax, abs_bits(e[i]));
  }
  record_warp_amax<T>(amax, out_bits);
}

// amax of xᵀ after the RHT of each 16-element chunk of its rows (16 rows of x at one column).
template <typename T>
__global__ void amax_hadamard_transposed_kernel(const T* x, int64_t rows, int64_t cols, unsigned* out_bits) {
  unsigned amax = 0;
  const int64_t chunks = rows / 16 * cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < chunks;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t col = i % cols, first_row = i / cols * 16;
    float chunk[16], rotated[16];
#pragma unroll
    for (int j = 0; j < 16; ++j) chunk[j] = to_float<T>(x[(first_row + j) * cols + col]);
    nm::random_hadamard_transform16(chunk, rotated);
#pragma unroll
    for (int j = 0; j < 16; ++j) amax = max(amax, abs_bits(rotated[j]));
  }
  record_warp_amax<float>(amax, out_bits);
}

// ---- per-tensor FP8: cast and transpose in one pass -------------------------------------------
// A block of 256 threads owns a 128-row x 64-column tile: each thread loads 8 columns of 4
// consecutive rows, issuing its four 16-byte loads before it converts anything (so four are in
// flight, kept as raw words: at most 64 registers a thread, four blocks an SM), writes the
// rowwise codes (8-byte stores) and packs each column's 4 codes into one word of a shared tile
// (8 word stores a thread, not 32 byte stores), from which the transposed codes leave as full
// 128-byte rows (16-byte stores). The casts are the hardware's cvt.rn.satfinite (two values
// per instruction; the reference's rules: round to nearest even, finite overflow and ±inf to
// ±max), with NaN lanes patched to the reference's sign-keeping NaN code where a NaN can occur
// (a NaN or infinite input, or a scale that is not finite and positive). The software cast
// this replaced kept the kernel at 1.3 TB/s, ALU-bound.
constexpr int kCastRows = 128, kCastCols = 64, kCastThreads = 256;
constexpr int kCastVectors = kCastRows * kCastCols / 8 / kCastThreads;  // 4 per thread
static_assert(kCastVectors == 4, "a thread packs its 4 rows of a column into one 32-bit word");
constexpr int kCastPitch = kCastRows + 4;  // bytes per transposed row: 2-way bank conflicts at most

// ScaleFromAmax on the device: amax null = the scale is an input.
struct CurrentScaleArgs {
  const float* amax = nullptr;
  float* scale_out = nullptr;
  float scaled_max = 0.0f, epsilon = 0.0f;
  bool power_of_2_scales = false;
};

// A source's side output (Source::kSide): a second tensor of one part's shape, made from the same
// fetches, cast with a scale of its own to its own E4M3 columnwise copy (SwiGLU's backward also
// casts the activation for the down projection's weight gradient). Unused otherwise.
struct SideCastArgs {
  const float* scale = nullptr;
  uint8_t* columnwise = nullptr;
  float* columnwise_inverse = nullptr;
  unsigned* amax_bits = nullptr;
};

// Four rows of four bytes -> the four columns: column i holds byte i of rows 0, 1, 2, 3 (row 0
// lowest), in eight byte permutes.
__device__ __forceinline__ void transpose4x4(const uint32_t (&row)[4], uint32_t (&column)[4]) {
  const uint32_t t0 = __byte_perm(row[0], row[1], 0x5140), t1 = __byte_perm(row[0], row[1], 0x7362);
  const uint32_t t2 = __byte_perm(row[2], row[3], 0x5140), t3 = __byte_perm(row[2], row[3], 0x7362);
  column[0] = __byte_perm(t0, t2, 0x5410);
  column[1] = __byte_perm(t0, t2, 0x7632);
  column[2] = __byte_perm(t1, t3, 0x5410);
  column[3] = __byte_perm(t1, t3, 0x7632);
}

// Eight consecutive values of T, kept as the 16-byte words they load as (bf16: one, f32: two).
template <typename T>
struct alignas(16) Pack8 {
  T v[8];
};

// Elements gc..gc+7 of row `row` (null: past the last row) of a matrix with `cols` columns:
// 16-byte loads where whole (16-byte aligned rows, all 8 inside), else one at a time; elements
// past the end read as zero. kFull: the caller knows the row exists and the 8 are whole.
template <bool kFull = false, typename T>
__device__ __forceinline__ void load_pack(const T* row, int64_t gc, int64_t cols, bool vector, Pack8<T>& pack) {
  if constexpr (!kFull) {
    if (row == nullptr || !vector || gc + 8 > cols) {
#pragma unroll
      for (int i = 0; i < 8; ++i) pack.v[i] = (row != nullptr && gc + i < cols) ? row[gc + i] : from_float<T>(0.0f);
      return;
    }
  }
#pragma unroll
  for (int w = 0; w < static_cast<int>(sizeof(T)) / 2; ++w)
    reinterpret_cast<uint4*>(&pack)[w] = reinterpret_cast<const uint4*>(row + gc)[w];
}

// What the cast kernel casts. A source has a `Lane` once for a thread (its 8 columns and first
// row gr0; the same for all its rows: weights, RoPE's pairing and position) and fetches a
// `Fetched` per 8 values of a row (its kInputs packs, fetched for all of a thread's rows before
// any is used, so the loads are in flight together, plus what else the row needs; row gr0 + j;
// kFull: the row exists and its 8 values are whole and 16-byte loadable); it has kOutputs parts
// of `cols` columns each, side by side in x ([rows, kOutputs · cols]); values(in, lane, v) gives
// the 8 values of every part from one fetch (SwiGLU's backward computes both gradients of an
// element at once). The fused producers round each value to T as the op's kernel stores it.
// kMinBlocks: the launch bound's blocks an SM (registers: the packs in flight must not spill).
template <typename T, int kInputs>
struct Packs {
  Pack8<T> pack[kInputs];
};
struct NoLane {};

template <typename T>
struct CastFromX {  // x itself
  static constexpr int kInputs = 1, kOutputs = 1, kMinBlocks = sizeof(T) == 2 ? 5 : 3;  // no spills (ptxas -v)
  using Fetched = Packs<T, kInputs>;
  using Lane = NoLane;
  const T* x;
  int64_t cols;
  bool vector;
  template <bool kFull>
  __device__ __forceinline__ void fetch(int64_t gr, int, bool in_rows, int64_t gc, const Lane&, Fetched& in) const {
    load_pack<kFull>(in_rows ? x + gr * cols : nullptr, gc, cols, vector, in.pack[0]);
  }
  __device__ __forceinline__ Lane lane(int64_t, int64_t) const { return {}; }
  __device__ __forceinline__ void values(const Fetched& in, const Lane&, float (&v)[kOutputs][8]) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) v[0][i] = to_float<T>(in.pack[0].v[i]);
  }
};

// gate_up [R, 2F] is interleaved (gate j in column 2j, up j in 2j + 1): the 8 gate/up pairs of
// columns gc..gc+7 are the 16 values at 2gc, fetched as two packs; pair k is elements 2k, 2k + 1.
template <typename T>
__device__ __forceinline__ float gate_up_element(const Pack8<T>& low, const Pack8<T>& high, int e) {
  return to_float<T>(e < 8 ? low.v[e] : high.v[e - 8]);
}

template <bool kFull, typename T>
__device__ __forceinline__ void load_gate_up(const T* gate_up, int64_t gr, bool in_rows, int64_t gc, int64_t ffn,
                                             bool vector, Pack8<T>& low, Pack8<T>& high) {
  const T* row = in_rows ? gate_up + gr * 2 * ffn : nullptr;
  load_pack<kFull>(row, 2 * gc, 2 * ffn, vector, low);
  load_pack<kFull>(row, 2 * gc + 8, 2 * ffn, vector, high);
}

template <typename T>
struct CastFromSwiglu {  // x [R, F] = silu(gate) · up of gate_up [R, 2F] (interleaved)
  static constexpr int kInputs = 2, kOutputs = 1, kMinBlocks = sizeof(T) == 2 ? 4 : 2;
  using Fetched = Packs<T, kInputs>;
  using Lane = NoLane;
  const T* gate_up;
  int64_t cols;  // F
  bool vector;
  template <bool kFull>
  __device__ __forceinline__ void fetch(int64_t gr, int, bool in_rows, int64_t gc, const Lane&, Fetched& in) const {
    load_gate_up<kFull>(gate_up, gr, in_rows, gc, cols, vector, in.pack[0], in.pack[1]);
  }
  __device__ __forceinline__ Lane lane(int64_t, int64_t) const { return {}; }
  __device__ __forceinline__ void values(const Fetched& in, const Lane&, float (&v)[kOutputs][8]) const {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      v[0][k] = round_to<T>(swiglu_value(gate_up_element(in.pack[0], in.pack[1], 2 * k),
                                         gate_up_element(in.pack[0], in.pack[1], 2 * k + 1)));
  }
};

// x [R, 2F] = the interleaved [dgate, dup] pairs from dout [R, F] and gate_up [R, 2F]. Its two
// parts (kInterleaved: see cast_tile) are the first and second 8 of the 16 x columns of part
// columns gc..gc+7: pairs gc..gc+3 and gc+4..gc+7. kWithAct: the side output is the activation
// silu(gate) · up [R, F] (CastFromSwiglu's values), for the down projection's weight gradient.
template <typename T, bool kWithAct = false>
struct CastFromSwigluBackward {
  static constexpr int kInputs = 3, kOutputs = 2;
  static constexpr int kMinBlocks = sizeof(T) == 2 ? (kWithAct ? 2 : 3) : (kWithAct ? 1 : 2);  // no spills (ptxas -v)
  static constexpr bool kSide = kWithAct;
  static constexpr bool kInterleaved = true;
  using Fetched = Packs<T, kInputs>;
  using Lane = NoLane;
  const T* dout;
  const T* gate_up;
  int64_t cols;  // F
  bool vector;
  template <bool kFull>
  __device__ __forceinline__ void fetch(int64_t gr, int, bool in_rows, int64_t gc, const Lane&, Fetched& in) const {
    load_pack<kFull>(in_rows ? dout + gr * cols : nullptr, gc, cols, vector, in.pack[0]);
    load_gate_up<kFull>(gate_up, gr, in_rows, gc, cols, vector, in.pack[1], in.pack[2]);
  }
  __device__ __forceinline__ Lane lane(int64_t, int64_t) const { return {}; }
  __device__ __forceinline__ void values(const Fetched& in, const Lane&, float (&v)[kOutputs][8]) const {
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      float dgate, dup;
      swiglu_gradients(to_float<T>(in.pack[0].v[k]), gate_up_element(in.pack[1], in.pack[2], 2 * k),
                       gate_up_element(in.pack[1], in.pack[2], 2 * k + 1), dgate, dup);
      v[k / 4][2 * (k % 4)] = round_to<T>(dgate);
      v[k / 4][2 * (k % 4) + 1] = round_to<T>(dup);
    }
  }
  __device__ __forceinline__ void side_values(const Fetched& in, const Lane&, float (&v)[8]) const {
#pragma unroll
    for (int k = 0; k < 8; ++k)
      v[k] = round_to<T>(swiglu_value(gate_up_element(in.pack[1], in.pack[2], 2 * k),
                                      gate_up_element(in.pack[1], in.pack[2], 2 * k + 1)));
  }
};

// x [R, H] = norm(input) · weight (+ bias) with the statistics the norm's stats-only pass saved
// (norm_forward without an output): the input is read once here instead of the norm's output
// being written and read back. The element formula is the norm kernels' (rms_norm_value,
// layer_norm_value); Wt is the weight's storage type (T, or f32 for FP32 master weights).
template <typename T, typename Wt, bool kLayer>
struct CastFromNorm {
  static constexpr int kInputs = 1, kOutputs = 1, kMinBlocks = sizeof(T) == 2 ? 4 : 3;  // no spills (ptxas -v)
  struct Fetched {
    Pack8<T> pack[kInputs];
    float mean, rstd;
  };
  struct Lane {
    float w[8], b[8];
  };
  const T* input;
  const Wt* weight;
  const Wt* bias;  // layer: may be null (no bias)
  const float* mean;
  const float* rstd;
  int64_t cols;
  bool vector;
  template <bool kFull>
  __device__ __forceinline__ void fetch(int64_t gr, int, bool in_rows, int64_t gc, const Lane&, Fetched& in) const {
    load_pack<kFull>(in_rows ? input + gr * cols : nullptr, gc, cols, vector, in.pack[0]);
    in.rstd = in_rows ? rstd[gr] : 0.0f;
    in.mean = kLayer && in_rows ? mean[gr] : 0.0f;
  }
  __device__ __forceinline__ Lane lane(int64_t, int64_t gc) const {
    Lane c;
    Pack8<Wt> pack;
    load_pack(weight, gc, cols, vector, pack);
#pragma unroll
    for (int i = 0; i < 8; ++i) c.w[i] = to_float<Wt>(pack.v[i]);
    if (kLayer && bias != nullptr) {
      load_pack(bias, gc, cols, vector, pack);
#pragma unroll
      for (int i = 0; i < 8; ++i) c.b[i] = to_float<Wt>(pack.v[i]);
    } else {
#pragma unroll
      for (int i = 0; i < 8; ++i) c.b[i] = 0.0f;
    }
    return c;
  }
  __device__ __forceinline__ void values(const Fetched& in, const Lane& c, float (&v)[kOutputs][8]) const {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float x = to_float<T>(in.pack[0].v[i]);
      v[0][i] = round_to<T>(kLayer ? layer_norm_value(x, in.mean, in.rstd, c.w[i], c.b[i])
                                   : rms_norm_value(x, in.rstd, c.w[i]));
    }
  }
};

// Whether a source has a side output (SideCastArgs): side_values(in, lane, v) gives its 8 values.
template <typename Source, typename = void>
struct HasSide : std::false_type {};
template <typename Source>
struct HasSide<Source, std::void_t<decltype(Source::kSide)>> : std::bool_constant<Source::kSide> {};

// Whether a source's parts interleave in x (Source::kInterleaved): part p's columns gc..gc+7 (gc a
// multiple of 8) are x's columns 2gc + 8p .. 2gc + 8p + 7, so two parts fill x's 16 columns at 2gc.
template <typename Source, typename = void>
struct InterleavedParts : std::false_type {};
template <typename Source>
struct InterleavedParts<Source, std::void_t<decltype(Source::kInterleaved)>> : std::bool_constant<Source::kInterleaved> {};

// One block's tile (rows row0.., columns col0.. of every part; rows x cols is one part of x, part
// p being x's columns [p · cols, (p + 1) · cols), or interleaved: InterleavedParts). kFull: the tile lies inside x and the source
// loads whole 16-byte vectors, so no row or column needs a bounds check.
template <typename T, typename Source, nm::Fp8Format kFormat, bool kFull>
__device__ __forceinline__ void cast_tile(const Source& source, int64_t rows, int64_t cols, int64_t row0, int64_t col0,
                                          const float* scale_pointer, uint8_t* __restrict__ rowwise,
                                          uint8_t* __restrict__ columnwise, float* rowwise_inverse,
                                          float* columnwise_inverse, unsigned* amax_bits, const CurrentScaleArgs& current,
                                          bool vector_rowwise, bool vector_columnwise, const SideCastArgs& side,
                                          uint8_t (&tile)[Source::kOutputs + HasSide<Source>::value][kCastCols]
                                                         [kCastPitch]) {
  constexpr int kParts = Source::kOutputs;
  constexpr bool kSide = HasSide<Source>::value;
  constexpr bool kInterleaved = InterleavedParts<Source>::value;
  static_assert(!kInterleaved || kParts == 2, "interleaved parts come in twos");
  // x's column of part `part`'s column c, and whether it lies inside x.
  auto x_col = [&](int part, int64_t c) -> int64_t {
    if constexpr (kInterleaved) return 2 * (c & ~int64_t{7}) + 8 * part + (c & 7);
    else return part * cols + c;
  };
  auto inside = [&](int part, int64_t c) {
    if constexpr (kInterleaved) return x_col(part, c) < 2 * cols;
    else return c < cols;
  };
  // Thread t: columns c0..c0+7 of rows r0..r0+3 (a warp's loads: 4 rows of 128 bytes).
  const int r0 = 4 * (threadIdx.x / 8), c0 = (threadIdx.x % 8) * 8;
  const int64_t gr0 = row0 + r0, gc = col0 + c0;
  const typename Source::Lane lane = source.lane(gr0, gc);
  // The loads stay in their storage type until they are used (4 registers per pack for bf16).
  typename Source::Fetched in[kCastVectors];
#pragma unroll
  for (int j = 0; j < kCastVectors; ++j)
    source.template fetch<kFull>(gr0 + j, j, kFull || gr0 + j < rows, gc, lane, in[j]);
  // Current scaling: every block forms the scale from the amax itself (the same bits), and the
  // first also stores it for later casts of the same tensor.
  const float scale = current.amax != nullptr
                          ? nm::current_scale_from_amax(current.amax[0], current.scaled_max, current.epsilon,
                                                        current.power_of_2_scales)
                          : scale_pointer[0];
  // The side copy's scale, read once (the byte stores below may alias it for all nvcc knows).
  float side_scale = 0.0f;
  if constexpr (kSide) side_scale = side.scale[0];
  if (blockIdx.x == 0 && blockIdx.y == 0 && threadIdx.x == 0) {
    if (current.amax != nullptr) current.scale_out[0] = scale;
    // Each copy carries its decode scale, as the reference's 1 / scale.
    if (rowwise_inverse != nullptr) rowwise_inverse[0] = nm::div_rn(1.0f, scale);
    if (columnwise_inverse != nullptr) columnwise_inverse[0] = nm::div_rn(1.0f, scale);
    if constexpr (kSide) side.columnwise_inverse[0] = nm::div_rn(1.0f, side_scale);
  }
  // A scaled value can be NaN only from a NaN or infinite input, or a scale that is not finite and
  // positive (inf x 0, NaN scale); the scale is the same for the whole tensor.
  const bool scale_may_make_nan = !(scale > 0.0f && scale < INFINITY);
  // The max of |x| as bits: non-negative floats order like their bit patterns, NaNs above +inf.
  unsigned amax = 0;
  const int64_t x_cols = kParts * cols;
  // The codes of row r0 + j, columns c0..c0+3 and c0+4..c0+7, of each part (the side's last).
  uint32_t words[kParts + kSide][2][kCastVectors];
  unsigned side_amax = 0;
#pragma unroll
  for (int j = 0; j < kCastVectors; ++j) {
    const int64_t gr = gr0 + j;
    if constexpr (kSide) {
      float value[8], scaled[8];
      source.side_values(in[j], lane, value);
      unsigned vector_max = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        vector_max = max(vector_max, abs_bits(value[i]));
        scaled[i] = nm::mul_rn(value[i], side_scale);
      }
      if (kFull || gr < rows) side_amax = max(side_amax, vector_max);
      uint32_t w[2];
      cast8<nm::Fp8Format::e4m3>(scaled, w, !(side_scale > 0.0f && side_scale < INFINITY) || vector_max >= 0x7f800000u);
      words[kParts][0][j] = w[0];
      words[kParts][1][j] = w[1];
    }
    float value[kParts][8];
    source.values(in[j], lane, value);
#pragma unroll
    for (int part = 0; part < kParts; ++part) {
      float scaled[8];
      unsigned vector_max = 0;
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        vector_max = max(vector_max, abs_bits(value[part][i]));
        scaled[i] = nm::mul_rn(value[part][i], scale);
      }
      // Rows past the end read as zeros, which a producer may map to something else (a bias).
      if (kFull || gr < rows) amax = max(amax, vector_max);
      uint32_t w[2];
      cast8<kFormat>(scaled, w, scale_may_make_nan || vector_max >= 0x7f800000u);
      words[part][0][j] = w[0];
      words[part][1][j] = w[1];
      if (rowwise != nullptr) {
        uint8_t* out = rowwise + gr * x_cols + x_col(part, gc);
        if (vector_rowwise && (kFull || (gr < rows && gc + 8 <= cols))) {
          *reinterpret_cast<uint2*>(out) = make_uint2(w[0], w[1]);
        } else {
          for (int i = 0; i < 8; ++i)
            if (gr < rows && inside(part, gc + i)) out[i] = static_cast<uint8_t>(w[i / 4] >> (8 * (i % 4)));
        }
      }
    }
  }
  if (columnwise != nullptr || kSide) {
    // Column c0 + 4h + i of a part: rows r0..r0+3, one byte each, in one 32-bit word. Parts
    // [first, last) go out: the side's alone when there is no columnwise copy of x.
    constexpr int kLast = kParts + kSide;
    const int first = columnwise != nullptr ? 0 : kParts;
#pragma unroll
    for (int part = 0; part < kLast; ++part) {
      if (part < first) continue;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        uint32_t column[4];
        transpose4x4(words[part][h], column);
#pragma unroll
        for (int i = 0; i < 4; ++i) *reinterpret_cast<uint32_t*>(&tile[part][c0 + 4 * h + i][r0]) = column[i];
      }
    }
    __syncthreads();
    // Row c of a part's transposed tile: 128 bytes, 8 threads of 16 bytes each.
    for (int v = threadIdx.x + first * (kCastCols * kCastRows / 16); v < kLast * kCastCols * kCastRows / 16;
         v += kCastThreads) {
      const int part = v / (kCastCols * kCastRows / 16), c = v / 8 % kCastCols, r = (v % 8) * 16;
      const int64_t gcol = col0 + c, grow = row0 + r;
      if (!kFull && (part < kParts ? !inside(part, gcol) : gcol >= cols)) continue;
      uint8_t* out = part < kParts ? columnwise + x_col(part, gcol) * rows + grow : side.columnwise + gcol * rows + grow;
      if (vector_columnwise && (kFull || grow + 16 <= rows)) {
        uint4 packed;
        uint32_t* packed_words = reinterpret_cast<uint32_t*>(&packed);
#pragma unroll
        for (int w = 0; w < 4; ++w) packed_words[w] = *reinterpret_cast<const uint32_t*>(&tile[part][c][r + 4 * w]);
        *reinterpret_cast<uint4*>(out) = packed;
      } else {
        for (int i = 0; i < 16; ++i)
          if (grow + i < rows) out[i] = tile[part][c][r + i];
      }
    }
  }
  if (amax_bits != nullptr) record_warp_amax<T>(amax, amax_bits);
  if constexpr (kSide)
    if (side.amax_bits != nullptr) record_warp_amax<T>(side_amax, side.amax_bits);
}

// Each part has its own shared tile for its transposed codes. Blocks whose tile lies inside x
// (all but the last row and column of blocks, where the shape is not a multiple of the tile) take
// the branch without bounds checks.
template <typename T, typename Source, nm::Fp8Format kFormat>
__global__ void __launch_bounds__(kCastThreads, Source::kMinBlocks)
    fp8_cast_transpose_kernel(Source source, int64_t rows, int64_t cols, const float* scale_pointer,
                              uint8_t* __restrict__ rowwise, uint8_t* __restrict__ columnwise, float* rowwise_inverse,
                              float* columnwise_inverse, unsigned* amax_bits, CurrentScaleArgs current,
                              bool vector_rowwise, bool vector_columnwise, SideCastArgs side) {
  __shared__ __align__(16) uint8_t tile[Source::kOutputs + HasSide<Source>::value][kCastCols][kCastPitch];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kCastRows, col0 = static_cast<int64_t>(blockIdx.x) * kCastCols;
  if (source.vector && row0 + kCastRows <= rows && col0 + kCastCols <= cols)
    cast_tile<T, Source, kFormat, true>(source, rows, cols, row0, col0, scale_pointer, rowwise, columnwise,
                                        rowwise_inverse, columnwise_inverse, amax_bits, current, vector_rowwise,
                                        vector_columnwise, side, tile);
  else
    cast_tile<T, Source, kFormat, false>(source, rows, cols, row0, col0, scale_pointer, rowwise, columnwise,
                                         rowwise_inverse, columnwise_inverse, amax_bits, current, vector_rowwise,
                                         vector_columnwise, side, tile);
}

// ---- block quantizers: one thread per block of the copy ---------------------------------------
// Thread t quantizes block (row = t % rows, block = t / rows) of the [rows, K] copy, so 16
// consecutive threads hold the 16 rows of one 16x16 NVFP4 tile (rows % 16 == 0) and, for a
// columnwise copy, adjacent threads read adjacent columns of x (coalesced).
struct CopyGeometry {
  int64_t rows = 0, k = 0;  // of the copy
  int64_t x_cols = 0;       // row length of x
  bool transposed = false;
  bool swizzled = false;
};

template <typename T, int kBlock>
__device__ __forceinline__ void load_block(const T* x, const CopyGeometry& g, int64_t row, int64_t first_k,
                                           float (&values)[kBlock]) {
  if (!g.transposed) {
    const T* p = x + row * g.x_cols + first_k;
#pragma unroll
    for (int i = 0; i < kBlock; ++i) values[i] = to_float<T>(p[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kBlock; ++i) values[i] = to_float<T>(x[(first_k + i) * g.x_cols + row]);
  }
}

__device__ __forceinline__ int64_t scale_index(const CopyGeometry& g, int64_t row, int64_t block, int64_t blocks) {
  return g.swizzled ? nm::swizzled_scale_offset(row, block, blocks) : row * blocks + block;
}

template <typename T>
__global__ void mxfp8_quantize_kernel(const T* x, CopyGeometry g, nm::Fp8Format format, nm::E8m0Rounding rounding,
                                      uint8_t* data, uint8_t* scales) {
  const int64_t blocks = g.k / 32;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (t >= g.rows * blocks) return;
  const int64_t row = t % g.rows, block = t / g.rows;
  float values[32];
  load_block<T, 32>(x, g, row, block * 32, values);
  float amax = 0.0f;
#pragma unroll
  for (int i = 0; i < 32; ++i) amax = nm::nan_propagating_max(amax, nm::abs_value(values[i]));
  const uint8_t scale = nm::mx_scale(amax, format, rounding);
  const float multiplier = nm::mx_element_multiplier(scale);
  uint4 packed[2];
  uint8_t* bytes = reinterpret_cast<uint8_t*>(packed);
#pragma unroll
  for (int i = 0; i < 32; ++i) bytes[i] = nm::float_to_fp8(nm::mul_rn(values[i], multiplier), format);
  uint4* out = reinterpret_cast<uint4*>(data + row * g.k + block * 32);
  out[0] = packed[0];
  out[1] = packed[1];
  scales[scale_index(g, row, block, blocks)] = scale;
}

struct Nvfp4KernelOptions {
  bool tiles = false, hadamard = false, stochastic = false;
  uint64_t seed = 0, offset = 0;
};

template <typename T>
__global__ void nvfp4_quantize_kernel(const T* x, CopyGeometry g, Nvfp4KernelOptions o, const float* tensor_amax,
                                      uint8_t* data, uint8_t* scales) {
  const int64_t blocks = g.k / 16;
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  // A 16-lane tile group must stay whole for the shuffles: rows * blocks is a multiple of 16
  // whenever tiles are on (rows % 16 == 0), so lanes past the end only occur in whole groups.
  const bool active = t < g.rows * blocks;
  const int64_t row = active ? t % g.rows : 0, block = active ? t / g.rows : 0;
  float values[16];
  if (active) {
    load_block<T, 16>(x, g, row, block * 16, values);
    if (o.hadamard) {
      float rotated[16];
      nm::random_hadamard_transform16(values, rotated);
#pragma unroll
      for (int i = 0; i < 16; ++i) values[i] = rotated[i];
    }
  }
  float amax = 0.0f;
  if (active) {
#pragma unroll
    for (int i = 0; i < 16; ++i) amax = nm::nan_propagating_max(amax, nm::abs_value(values[i]));
  }
  if (o.tiles) {
    // The 16 rows of a tile are 16 consecutive lanes; the max of the bit patterns is the
    // NaN-propagating max of these non-negative amaxes.
    unsigned bits = nm::float_to_bits(amax);
#pragma unroll
    for (int offset = 1; offset < 16; offset <<= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset));
    amax = nm::bits_to_float(bits);
  }
  if (!active) return;
  const float encode = nm::nvfp4_global_encode_scale(tensor_amax[0]);
  const float decode = nm::nvfp4_global_decode_scale(tensor_amax[0]);
  const uint8_t scale = nm::nvfp4_block_scale(amax, encode);
  const float multiplier = nm::nvfp4_element_multiplier(scale, decode);
  uint2 packed;
  uint8_t* bytes = reinterpret_cast<uint8_t*>(&packed);
  const uint64_t first = static_cast<uint64_t>(row * g.k + block * 16);
#pragma unroll
  for (int i = 0; i < 16; i += 2) {
    uint8_t code[2];
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const float scaled = nm::mul_rn(values[i + j], multiplier);
      code[j] = o.stochastic ? nm::float_to_e2m1_stochastic(scaled, nm::philox_random_word(o.seed, o.offset, first + i + j))
                             : nm::float_to_e2m1(scaled);
    }
    bytes[i / 2] = static_cast<uint8_t>(code[0] | code[1] << 4);
  }
  *reinterpret_cast<uint2*>(data + (row * g.k + block * 16) / 2) = packed;
  scales[scale_index(g, row, block, blocks)] = scale;
}

// ---- dequantize --------------------------------------------------------------------------------
struct DecodeArgs {
  ScalingMode mode;
  nm::Fp8Format format;
  const uint8_t* data;
  const void* scales;  // f32 [1] (per-tensor) or block scales
  const float* tensor_amax;
  int64_t rows, k;     // of the copy
  bool swizzled;
};

__device__ __forceinline__ float decode(const DecodeArgs& d, int64_t row, int64_t col) {
  const int64_t index = row * d.k + col;
  switch (d.mode) {
    case ScalingMode::per_tensor:
      return nm::mul_rn(nm::fp8_to_float(d.data[index], d.format), static_cast<const float*>(d.scales)[0]);
    case ScalingMode::mxfp8: {
      const int64_t blocks = d.k / 32;
      const int64_t at = d.swizzled ? nm::swizzled_scale_offset(row, col / 32, blocks) : row * blocks + col / 32;
      const uint8_t scale = static_cast<const uint8_t*>(d.scales)[at];
      return nm::mul_rn(nm::fp8_to_float(d.data[index], d.format), nm::e8m0_to_float(scale));
    }
    case ScalingMode::nvfp4: {
      const int64_t blocks = d.k / 16;
      const int64_t at = d.swizzled ? nm::swizzled_scale_offset(row, col / 16, blocks) : row * blocks + col / 16;
      const uint8_t scale = static_cast<const uint8_t*>(d.scales)[at];
      const uint8_t byte = d.data[index / 2];
      const uint8_t code = (index % 2 == 0) ? (byte & 0x0fu) : (byte >> 4);
      return nm::mul_rn(nm::e2m1_to_float(code),
                        nm::nvfp4_block_decode_factor(scale, nm::nvfp4_global_decode_scale(d.tensor_amax[0])));
    }
  }
  return 0.0f;
}

// 32x32 tiles, 32x8 threads: reads the copy row by row, writes out in x's layout (transposing
// through shared memory for a columnwise copy), both coalesced.
template <typename O, bool kTransposed>
__global__ void dequantize_kernel(DecodeArgs d, O* out) {
  __shared__ float tile[32][33];
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * 32, col0 = static_cast<int64_t>(blockIdx.x) * 32;
  for (int r = threadIdx.y; r < 32; r += blockDim.y) {
    const int64_t row = row0 + r, col = col0 + threadIdx.x;
    if (row < d.rows && col < d.k) tile[r][threadIdx.x] = decode(d, row, col);
  }
  if constexpr (!kTransposed) {
    for (int r = threadIdx.y; r < 32; r += blockDim.y) {
      const int64_t row = row0 + r, col = col0 + threadIdx.x;
      if (row < d.rows && col < d.k) out[row * d.k + col] = from_float<O>(tile[r][threadIdx.x]);
    }
  } else {
    __syncthreads();
    // out [k, rows]: out row = copy column.
    for (int c = threadIdx.y; c < 32; c += blockDim.y) {
      const int64_t out_row = col0 + c, out_col = row0 + threadIdx.x;
      if (out_row < d.k && out_col < d.rows) out[out_row * d.rows + out_col] = from_float<O>(tile[threadIdx.x][c]);
    }
  }
}

// ---- FP8 scale update --------------------------------------------------------------------------
// One warp per tensor. Delayed: the lanes take 32 slots of the window at a time, from the oldest
// end, so each chunk is read (and max-reduced) before it moves one slot down; a chunk's move only
// writes slots already read. A thread per tensor scanning 1024 slots alone took 0.5 ms a step.
__global__ void fp8_scale_update_kernel(float* history, float* scale, float* scale_inverse, int64_t length,
                                        int64_t tensors, ScaleUpdateArgs args) {
  const int64_t t = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const int lane = static_cast<int>(threadIdx.x % 32);
  if (t >= tensors) return;  // whole warps: t is the same across a warp
  if (args.rule == ScaleUpdateArgs::Rule::current) {
    if (lane == 0) {
      scale[t] = nm::current_scale_from_amax(history[t], args.scaled_max, args.epsilon, args.power_of_2_scales);
      scale_inverse[t] = nm::div_rn(1.0f, scale[t]);
    }
    return;
  }
  float window = history[t];
  for (int64_t base = (length - 1) / 32 * 32; base >= 0; base -= 32) {
    const int64_t slot = base + lane;
    const float value = slot < length ? history[slot * tensors + t] : 0.0f;
    if (!args.most_recent && slot < length) window = nm::nan_propagating_max(window, value);
    __syncwarp();
    if (slot + 1 < length) history[(slot + 1) * tensors + t] = value;
    __syncwarp();
  }
  unsigned bits = nm::float_to_bits(nm::abs_value(window));
  if (nm::is_nan(window)) bits = 0xffffffffu;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) bits = max(bits, __shfl_xor_sync(0xffffffffu, bits, offset));
  if (lane == 0) {
    // The window's amaxes are non-negative: the max of their bits is their max (NaN above all).
    const float window_max = bits == 0xffffffffu ? nm::quiet_nan() : nm::bits_to_float(bits);
    scale[t] = nm::delayed_scale_from_amax(window_max, args.scaled_max, scale[t]);
    scale_inverse[t] = nm::div_rn(1.0f, scale[t]);
    history[t] = 0.0f;
  }
}

__global__ void nvfp4_gemm_scalars_kernel(const float* amax_a, const float* amax_b, float beta, float* scalars) {
  scalars[0] = nm::nvfp4_gemm_alpha(amax_a[0], amax_b[0]);
  scalars[1] = beta;
}

nm::Fp8Format fp8_format(DType element) {
  return element == DType::e5m2 ? nm::Fp8Format::e5m2 : nm::Fp8Format::e4m3;
}

unsigned grid_for(int64_t work, int64_t per_block, int64_t cap = 4096) {
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(cap, (work + per_block - 1) / per_block)));
}

CopyGeometry geometry(const Tensor& x, const QuantizedTensor& q) {
  CopyGeometry g;
  g.rows = q.rows();
  g.k = q.k();
  g.x_cols = x.cols();
  g.transposed = q.transposed;
  g.swizzled = q.spec.swizzled_scales;
  return g;
}

template <typename T>
void quantize_block_copy(const T* x, const Tensor& x_tensor, const QuantizedTensor& q, cudaStream_t stream) {
  const CopyGeometry g = geometry(x_tensor, q);
  uint8_t* data = static_cast<uint8_t*>(q.data.data);
  uint8_t* scales = static_cast<uint8_t*>(q.scale_inverse.data);
  if (q.spec.swizzled_scales) {
    // The padding of the 128x4 tiles must read as zero scales.
    MXTRAIN_CUDA_CHECK(cudaMemsetAsync(scales, 0, q.scale_inverse.bytes(), stream));
  }
  if (q.spec.mode == ScalingMode::mxfp8) {
    const int64_t threads = g.rows * (g.k / 32);
    mxfp8_quantize_kernel<T><<<blocks_for(threads, kThreads), kThreads, 0, stream>>>(
        x, g, fp8_format(q.spec.element),
        q.spec.mx_round_up ? nm::E8m0Rounding::round_up : nm::E8m0Rounding::floor, data, scales);
  } else {
    Nvfp4KernelOptions o;
    o.tiles = q.spec.nvfp4_tiles;
    o.hadamard = q.spec.hadamard;
    o.stochastic = q.spec.stochastic_rounding;
    o.seed = q.spec.seed;
    o.offset = q.spec.offset;
    const int64_t threads = g.rows * (g.k / 16);
    nvfp4_quantize_kernel<T><<<blocks_for(threads, kThreads), kThreads, 0, stream>>>(
        x, g, o, static_cast<const float*>(q.amax.data), data, scales);
  }
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

// x [R, (H + 2·KV)·d] = RoPE's backward of dqkv (the inverse rotation of the q and k heads; v
// as it is), in place of the rope kernel's pass: element i of a rotated head pairs with
// i ± d/2, so a thread fetches its 8 values and their partners' (the other half of the same
// head: in this tile for d = 64, the next one for d = 128 — cache hits either way), and takes
// the angles of its row's position from the backend's table (rope_rotate, as the rope kernel).
// half (d/2) is a multiple of 8: a thread's 8 columns lie in one half of one head.
template <typename T>
struct CastFromRopeBackward {
  static constexpr int kInputs = 2, kOutputs = 1, kMinBlocks = sizeof(T) == 2 ? 3 : 2;  // no spills (ptxas -v)
  struct Fetched {
    Pack8<T> pack[kInputs];  // own, partner
    int64_t angles;          // the row's position · half (into the tables)
  };
  struct Lane {
    int64_t partner;   // the partner's column offset from this one (0: a v head, not rotated)
    int64_t position;  // the position of the thread's first row (row gr0 % seq)
    int i;             // the pair index of the first column within its head's half
    int half;          // head_dim / 2
  };
  const T* input;
  const float* cos_table;
  const float* sin_table;
  int64_t cols, seq, position_offset;
  int head_dim, rotated_cols;  // rotated_cols = (H + KV) · d
  bool vector;
  // The divisions happen once a thread here, not once a row in fetch: a 64-bit remainder a row was
  // part of what kept this cast issue-bound (llama-1b's dqkv on an H200: 1.9 TB/s before, 2.2
  // after; bench/results/h200_ncu_fp8_casts_d71ab65.md).
  __device__ __forceinline__ Lane lane(int64_t gr0, int64_t gc) const {
    Lane c;
    c.half = head_dim / 2;
    const int within = static_cast<int>(gc % head_dim);
    c.partner = gc >= rotated_cols ? 0 : (within < c.half ? c.half : -c.half);
    c.i = within % c.half;
    c.position = gr0 % seq;
    return c;
  }
  template <bool kFull>
  __device__ __forceinline__ void fetch(int64_t gr, int j, bool in_rows, int64_t gc, const Lane& c, Fetched& in) const {
    const T* row = in_rows ? input + gr * cols : nullptr;
    load_pack<kFull>(row, gc, cols, vector, in.pack[0]);
    if (c.partner != 0) load_pack<kFull>(row, gc + c.partner, cols, vector, in.pack[1]);
    int64_t position = c.position + j;  // (gr0 + j) % seq: j < 4, so at most a few subtractions
    while (position >= seq) position -= seq;
    in.angles = (position + position_offset) * c.half + c.i;
  }
  __device__ __forceinline__ void values(const Fetched& in, const Lane& c, float (&v)[kOutputs][8]) const {
    if (c.partner == 0) {
#pragma unroll
      for (int k = 0; k < 8; ++k) v[0][k] = to_float<T>(in.pack[0].v[k]);
      return;
    }
    float cs[8], sn[8];
    load<8>(cos_table + in.angles, cs);
    load<8>(sin_table + in.angles, sn);
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const float own = to_float<T>(in.pack[0].v[k]), other = to_float<T>(in.pack[1].v[k]);
      float y1, y2;
      if (c.partner > 0) rope_rotate(own, other, cs[k], -sn[k], y1, y2);  // own is the first half
      else rope_rotate(other, own, cs[k], -sn[k], y1, y2);
      v[0][k] = round_to<T>(c.partner > 0 ? y1 : y2);
    }
  }
};

// The per-tensor FP8 cast of `source` (rows x cols a part) into the copies that are defined.
template <typename T, typename Source>
void launch_fp8_cast(const Source& source, int64_t rows, int64_t cols, const Tensor& scale,
                     const QuantizedTensor& rowwise, const QuantizedTensor& columnwise, const Tensor& amax_out,
                     const ScaleFromAmax& from, cudaStream_t stream, const SideCastArgs& side = {}) {
  MXTRAIN_ASSERT(HasSide<Source>::value == (side.columnwise != nullptr), "quantize: a side output needs its copy");
  MXTRAIN_ASSERT(!rowwise.data.defined() || !columnwise.data.defined() ||
                     rowwise.spec.element == columnwise.spec.element,
                 "quantize: the two per-tensor FP8 copies share one format");
  const QuantizedTensor& any = rowwise.data.defined() ? rowwise : columnwise;
  uint8_t* row_out = rowwise.data.defined() ? static_cast<uint8_t*>(rowwise.data.data) : nullptr;
  uint8_t* col_out = columnwise.data.defined() ? static_cast<uint8_t*>(columnwise.data.data) : nullptr;
  if (rows == 0 || cols == 0) return;
  const bool vector_rowwise = cols % 8 == 0 && (reinterpret_cast<uintptr_t>(row_out) & 7u) == 0;
  const bool vector_columnwise = rows % 16 == 0 && (reinterpret_cast<uintptr_t>(col_out) & 15u) == 0 &&
                                 (reinterpret_cast<uintptr_t>(side.columnwise) & 15u) == 0;
  dim3 grid(blocks_for(cols, kCastCols), blocks_for(rows, kCastRows));
  float* row_inverse = rowwise.data.defined() ? static_cast<float*>(rowwise.scale_inverse.data) : nullptr;
  float* col_inverse = columnwise.data.defined() ? static_cast<float*>(columnwise.scale_inverse.data) : nullptr;
  CurrentScaleArgs current;
  if (from.defined()) {
    current.amax = static_cast<const float*>(from.amax.data);
    current.scale_out = static_cast<float*>(scale.data);
    current.scaled_max = from.args.scaled_max;
    current.epsilon = from.args.epsilon;
    current.power_of_2_scales = from.args.power_of_2_scales;
  }
  auto launch = [&](auto format) {
    fp8_cast_transpose_kernel<T, Source, decltype(format)::value><<<grid, kCastThreads, 0, stream>>>(
        source, rows, cols, static_cast<const float*>(scale.data), row_out, col_out, row_inverse, col_inverse,
        amax_out.defined() ? static_cast<unsigned*>(amax_out.data) : nullptr, current, vector_rowwise,
        vector_columnwise, side);
  };
  if (fp8_format(any.spec.element) == nm::Fp8Format::e4m3)
    launch(std::integral_constant<nm::Fp8Format, nm::Fp8Format::e4m3>{});
  else
    launch(std::integral_constant<nm::Fp8Format, nm::Fp8Format::e5m2>{});
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

// The norm producer's cast: the weight is stored as T or as f32 (FP32 masters).
template <typename T>
void launch_norm_cast(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                      const QuantizedTensor& columnwise, const Tensor& amax_out, const CastProducer& p,
                      cudaStream_t stream) {
  const bool vector = x.cols() % 8 == 0 && aligned16(p.input) && aligned16(p.weight) && aligned16(p.bias);
  auto go = [&](auto weight_tag, auto layer) {
    using Wt = decltype(weight_tag);
    constexpr bool kLayer = decltype(layer)::value;
    const CastFromNorm<T, Wt, kLayer> source{static_cast<const T*>(p.input.data), static_cast<const Wt*>(p.weight.data),
                                             data_or_null<const Wt>(p.bias), data_or_null<const float>(p.mean),
                                             static_cast<const float*>(p.rstd.data), x.cols(), vector};
    launch_fp8_cast<T>(source, x.rows(), x.cols(), scale, rowwise, columnwise, amax_out, ScaleFromAmax{}, stream);
  };
  const bool layer = p.norm == NormKind::layer;
  if (p.weight.dtype == x.dtype) {
    layer ? go(T{}, std::true_type{}) : go(T{}, std::false_type{});
  } else if (p.weight.dtype == DType::f32) {
    layer ? go(float{}, std::true_type{}) : go(float{}, std::false_type{});
  } else {
    unsupported_dtype("quantize (norm_forward producer, weight)", p.weight.dtype);
  }
}

}  // namespace

void amax(const Tensor& x, const Tensor& out, bool accumulate, bool hadamard_transposed, cudaStream_t stream) {
  unsigned* bits = accumulate ? static_cast<unsigned*>(out.data) : start_amax_record(out, stream);
  const int64_t n = x.numel();
  if (n == 0) return;
  dispatch_float<true>(x.dtype, "amax", [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(x.data);
    if (hadamard_transposed) {
      const int64_t chunks = x.rows() / 16 * x.cols();
      amax_hadamard_transposed_kernel<T><<<grid_for(chunks, kThreads), kThreads, 0, stream>>>(data, x.rows(), x.cols(),
                                                                                            bits);
    } else if (n % 8 == 0 && aligned16(x)) {
      amax_kernel<8, T><<<grid_for(n / 8, kThreads * 4), kThreads, 0, stream>>>(data, n / 8, bits);
    } else {
      amax_kernel<1, T><<<grid_for(n, kThreads * 4), kThreads, 0, stream>>>(data, n, bits);
    }
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void quantize(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise, const QuantizedTensor& columnwise,
              const Tensor& amax_out, const ScaleFromAmax& from, cudaStream_t stream) {
  const QuantizedTensor& any = rowwise.data.defined() ? rowwise : columnwise;
  dispatch_float<true>(x.dtype, "quantize", [&](auto tag) {
    using T = decltype(tag);
    const T* data = static_cast<const T*>(x.data);
    if (any.spec.mode == ScalingMode::per_tensor) {
      const CastFromX<T> source{data, x.cols(), x.cols() % 8 == 0 && aligned16(x)};
      launch_fp8_cast<T>(source, x.rows(), x.cols(), scale, rowwise, columnwise, amax_out, from, stream);
      return;
    }
    if (rowwise.data.defined()) quantize_block_copy<T>(data, x, rowwise, stream);
    if (columnwise.data.defined()) quantize_block_copy<T>(data, x, columnwise, stream);
    if (amax_out.defined()) {
      amax(x, amax_out, true, false, stream);
    }
  });
}

void quantize_produced(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                       const QuantizedTensor& columnwise, const Tensor& amax_out, const CastProducer& producer,
                       const float* rope_table, int64_t rope_positions, cudaStream_t stream) {
  dispatch_float<true>(x.dtype, "quantize (fused producer)", [&](auto tag) {
    using T = decltype(tag);
    const T* gate_up = static_cast<const T*>(producer.gate_up.data);
    const int64_t ffn = producer.gate_up.cols() / 2;
    switch (producer.op) {
      case CastProducer::Op::norm_forward:
        launch_norm_cast<T>(x, scale, rowwise, columnwise, amax_out, producer, stream);
        return;
      case CastProducer::Op::rope_backward: {
        const AttentionShape& shape = producer.shape;
        const int half = static_cast<int>(shape.head_dim / 2);
        MXTRAIN_ASSERT(half % 8 == 0 && rope_table != nullptr,
                       "quantize: a fused rope_backward needs head_dim %% 16 == 0 (got %lld) and the rotation table",
                       static_cast<long long>(shape.head_dim));
        const CastFromRopeBackward<T> source{static_cast<const T*>(producer.input.data), rope_table,
                                             rope_table + rope_positions * half, x.cols(), shape.seq,
                                             shape.position_offset, static_cast<int>(shape.head_dim),
                                             static_cast<int>((shape.heads + shape.kv_heads) * shape.head_dim),
                                             x.cols() % 8 == 0 && aligned16(producer.input)};
        launch_fp8_cast<T>(source, x.rows(), x.cols(), scale, rowwise, columnwise, amax_out, ScaleFromAmax{}, stream);
        return;
      }
      case CastProducer::Op::swiglu_forward: {
        const CastFromSwiglu<T> source{gate_up, ffn, ffn % 8 == 0 && aligned16(producer.gate_up)};
        launch_fp8_cast<T>(source, x.rows(), ffn, scale, rowwise, columnwise, amax_out, ScaleFromAmax{}, stream);
        return;
      }
      case CastProducer::Op::swiglu_backward: {
        const T* dout = static_cast<const T*>(producer.dout.data);
        const bool vector = ffn % 8 == 0 && aligned16(producer.gate_up) && aligned16(producer.dout);
        if (!producer.act_columnwise.data.defined()) {
          const CastFromSwigluBackward<T> source{dout, gate_up, ffn, vector};
          launch_fp8_cast<T>(source, x.rows(), ffn, scale, rowwise, columnwise, amax_out, ScaleFromAmax{}, stream);
          return;
        }
        // The activation's copy too; its amax record starts at its slot's value (max=).
        SideCastArgs side;
        side.scale = static_cast<const float*>(producer.act_scale.data);
        side.columnwise = static_cast<uint8_t*>(producer.act_columnwise.data.data);
        side.columnwise_inverse = static_cast<float*>(producer.act_columnwise.scale_inverse.data);
        side.amax_bits = producer.act_amax.defined() ? static_cast<unsigned*>(producer.act_amax.data) : nullptr;
        const CastFromSwigluBackward<T, true> source{dout, gate_up, ffn, vector};
        launch_fp8_cast<T>(source, x.rows(), ffn, scale, rowwise, columnwise, amax_out, ScaleFromAmax{}, stream, side);
        return;
      }
      case CastProducer::Op::none:
        break;
    }
    MXTRAIN_ASSERT(false, "quantize_produced: producer op %d has no fused cast", static_cast<int>(producer.op));
  });
}

void dequantize(const QuantizedTensor& q, const Tensor& out, cudaStream_t stream) {
  DecodeArgs d;
  d.mode = q.spec.mode;
  d.format = fp8_format(q.spec.element);
  d.data = static_cast<const uint8_t*>(q.data.data);
  d.scales = q.scale_inverse.data;
  d.tensor_amax = q.amax.defined() ? static_cast<const float*>(q.amax.data) : nullptr;
  d.rows = q.rows();
  d.k = q.k();
  d.swizzled = q.spec.swizzled_scales;
  if (d.rows == 0 || d.k == 0) return;
  dim3 grid(blocks_for(d.k, 32), blocks_for(d.rows, 32));
  dim3 block(32, 8);
  dispatch_float<true>(out.dtype, "dequantize", [&](auto tag) {
    using O = decltype(tag);
    if (q.transposed) dequantize_kernel<O, true><<<grid, block, 0, stream>>>(d, static_cast<O*>(out.data));
    else dequantize_kernel<O, false><<<grid, block, 0, stream>>>(d, static_cast<O*>(out.data));
    MXTRAIN_CUDA_CHECK_LAUNCH();
  });
}

void fp8_scale_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inverse,
                      const ScaleUpdateArgs& args, cudaStream_t stream) {
  const int64_t tensors = scale.numel();
  if (tensors == 0) return;
  fp8_scale_update_kernel<<<blocks_for(tensors * 32, kThreads), kThreads, 0, stream>>>(
      static_cast<float*>(history.data), static_cast<float*>(scale.data), static_cast<float*>(scale_inverse.data),
      history.rows(), tensors, args);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

void nvfp4_gemm_scalars(const Tensor& amax_a, const Tensor& amax_b, float beta, float* scalars, cudaStream_t stream) {
  nvfp4_gemm_scalars_kernel<<<1, 1, 0, stream>>>(static_cast<const float*>(amax_a.data),
                                                 static_cast<const float*>(amax_b.data), beta, scalars);
  MXTRAIN_CUDA_CHECK_LAUNCH();
}

}  // namespace mxtrain::cuda_kernels
